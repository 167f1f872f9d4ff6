// The dropout mask, a pure function of (seed, offset, row, column), so the
// backward regenerates exactly the forward's mask whatever the launch layout,
// on the host and the device alike.  Philox4x32-10 (Salmon et al., 2011) with
// key = seed and counter = (offset / 4, block), where block numbers groups of
// four elements, rows padded to a multiple of four: each draw of four 32-bit
// words serves four neighbouring elements.  This is curand_init(seed,
// subsequence = block, offset)'s first draw, so the generator's offset
// advances by 4 a call, as torch's kernels advance it.
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

// Keeps an element when its 32-bit draw is below keep_threshold(p).
struct DropoutMask {
  uint64_t seed = 0, offset = 0;
  int64_t padded_cols = 0;  // cols rounded up to a multiple of 4
  uint32_t threshold = 0;   // keep below this; p == 1 keeps none
  double scale = 0;         // 1 / (1 - p); 0 when p == 1

  FLN_HD static DropoutMask make(uint64_t seed, uint64_t offset, int64_t cols, double p) {
    DropoutMask m;
    m.seed = seed;
    m.offset = offset;
    m.padded_cols = (cols + 3) / 4 * 4;
    const double keep = 1.0 - double(p);
    const double t = keep * 4294967296.0;
    m.threshold = t >= 4294967295.0 ? 4294967295u : uint32_t(t);
    m.scale = p >= 1.0 ? 0.0 : 1.0 / keep;
    return m;
  }
  // The four draws of the block holding (row, col).
  FLN_HD Philox4 draws(int64_t row, int64_t col) const {
    const uint64_t block = uint64_t(row * padded_cols + col) >> 2;
    return philox4x32_10(offset >> 2, block, seed);
  }
  FLN_HD bool keep(const Philox4& d, int64_t col) const { return d.v[col & 3] < threshold; }
  FLN_HD bool keep(int64_t row, int64_t col) const { return keep(draws(row, col), col); }
};

}  // namespace fln
