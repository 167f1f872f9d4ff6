// The dropout mask, a pure function of (seed, offset, row, column), so the
// backward regenerates exactly the forward's mask whatever the launch layout,
// on the host and the device alike.  Philox4x32-10 (Salmon et al., 2011) with
// key = seed and counter = (offset / 4, block), where block numbers groups of
// eight elements, rows padded to a multiple of eight: each draw of four 32-bit
// words serves eight neighbouring elements, 16 bits each (half the Philox
// rounds of a word an element; the keep probability is 1 - p rounded to a
// multiple of 2^-16).  The generator's offset advances by 4 a call, as torch's
// kernels advance it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLN_HD __host__ __device__ __forceinline__
#else
#define FLN_HD inline
#endif

namespace fln {

struct Philox4 {
  uint32_t v[4];
};

FLN_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t& hi) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = uint64_t(a) * b;
  hi = uint32_t(p >> 32);
  return uint32_t(p);
#endif
}

FLN_HD Philox4 philox4x32_10(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Element c of a block takes the low (c even) or high half of word c / 2 and
// is kept when that 16-bit draw is below threshold = round((1 - p) 2^16).
struct DropoutMask {
  static constexpr int kBlock = 8;  // elements a Philox draw serves
  uint64_t seed = 0, offset = 0;
  int64_t padded_cols = 0;  // cols rounded up to a multiple of kBlock
  uint32_t threshold = 0;   // keep a 16-bit draw below this, in [0, 2^16]
  double scale = 0;         // 1 / (1 - p); 0 when p == 1

  FLN_HD static DropoutMask make(uint64_t seed, uint64_t offset, int64_t cols, double p) {
    DropoutMask m;
    m.seed = seed;
    m.offset = offset;
    m.padded_cols = (cols + kBlock - 1) / kBlock * kBlock;
    const double keep = p >= 1.0 ? 0.0 : 1.0 - double(p);
    m.threshold = uint32_t(keep * 65536.0 + 0.5);
    m.scale = p >= 1.0 ? 0.0 : 1.0 / keep;
    return m;
  }
  // The draws of the block holding (row, col).
  FLN_HD Philox4 draws(int64_t row, int64_t col) const {
    const uint64_t block = uint64_t(row * padded_cols + col) / kBlock;
    return philox4x32_10(offset >> 2, block, seed);
  }
  // Element col's keep flag from its block's draws.
  FLN_HD bool keep(const Philox4& d, int64_t col) const {
    const int e = int(uint64_t(col) % kBlock);
    return ((d.v[e >> 1] >> (16 * (e & 1))) & 0xFFFFu) < threshold;
  }
  FLN_HD bool keep(int64_t row, int64_t col) const { return keep(draws(row, col), col); }
};

}  // namespace fln
