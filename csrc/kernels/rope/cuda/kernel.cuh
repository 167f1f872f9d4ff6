// The rotary kernel (params.h), forward and backward (kBwd: the transpose).
// A CTA of layout (x, y, z) threads takes z tokens at a time, grid-stride.
// For each token, thread (tx, ty) takes units tx, tx + x, ... of a head
// (plan.h: two accesses of P elements holding whole rotation pairs) and
// heads ty, ty + y, ... of q then k, kRowsInFlight at a time: all their
// loads are issued before the first store.  The unit's cos and sin are
// loaded once per token and serve every head.  While it loads a token's
// rows, a thread asks L2 for the same rows of the token lay.prefetch ahead
// (plan.h), so DRAM reads run ahead of what the registers hold.
#pragma once
#include "../../cuda/common.cuh"
#include "../params.h"
#include "plan.h"

namespace fln::cuda::rotary {

struct Layout {
  int x = 1;  // threads over the units of a head
  int y = 1;  // threads over the heads of a token
  int z = 1;  // tokens a CTA takes at a time
  int64_t prefetch = 0;  // tokens ahead whose rows are prefetched into L2 (0: none)
  int64_t prefetch_batches = 0, prefetch_positions = 0;  // prefetch as (batches, positions): prefetch / seq, % seq
};

// The 2P cos (or sin) values of a unit, at offsets o1 and o2 of the token's
// row, read in pieces of at most 16 bytes (float cos with 16-bit q is 32).
template <typename DC, int P>
struct Coeffs {
  static constexpr int kPiece = 16 / int(sizeof(DC)) < P ? 16 / int(sizeof(DC)) : P;
  static constexpr int kPieces = P / kPiece;
  static_assert(kPieces * kPiece == P, "a unit's half is whole pieces");
  Frag<DC, kPiece> f[2 * kPieces];
  __device__ __forceinline__ void load(const DC* row, int64_t o1, int64_t o2) {
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      load_l1<L1Policy::kEvictLast>(f[j], row + o1 + j * kPiece);
      load_l1<L1Policy::kEvictLast>(f[kPieces + j], row + o2 + j * kPiece);
    }
  }
  __device__ __forceinline__ dacc_t<DC> get(int k) const { return f[k / kPiece].get(k % kPiece); }
};

// Writes o[0, P) into f in its storage type (16-bit types packed two a word).
template <typename D, int P>
__device__ __forceinline__ void pack(Frag<D, P>& f, const dacc_t<D>* o) {
  if constexpr (sizeof(D) == 2) {
    if constexpr (P == 1) {
      f.r.v[0] = acc_to_bits(o[0], 0.f, static_cast<D*>(nullptr));
    } else {
#pragma unroll
      for (int w = 0; w < P / 2; ++w) f.r.v[w] = acc_to_bits(o[2 * w], o[2 * w + 1], static_cast<D*>(nullptr));
    }
  } else {
#pragma unroll
    for (int k = 0; k < P; ++k) f.r.v[k] = from_acc<D>(o[k]);
  }
}

// Rotates one unit, v = (a, b): element k pairs with j (half-split: k +- P,
// the accesses at i and i + rot/2; interleaved: k ^ 1, neighbours); s is -1
// for the first of a pair.  Forward v[k] c[k] + s v[j] sin[k]; backward
// v[k] c[k] - s v[j] sin[j].
template <bool kInterleaved, bool kBwd, typename D, int P, typename DC>
__device__ __forceinline__ void rotate(Frag<D, P>& a, Frag<D, P>& b, const Coeffs<DC, P>& c,
                                       const Coeffs<DC, P>& s) {
  using A = dacc_t<D>;
  A x[2 * P], o[2 * P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    x[k] = a.get(k);
    x[P + k] = b.get(k);
  }
#pragma unroll
  for (int k = 0; k < 2 * P; ++k) {
    const bool first = kInterleaved ? k % 2 == 0 : k < P;
    const int j = kInterleaved ? (k ^ 1) : first ? k + P : k - P;
    const A sn = kBwd ? A(s.get(j)) : A(s.get(k));
    const A e = (first != kBwd) ? -sn : sn;
    o[k] = x[k] * A(c.get(k)) + x[j] * e;
  }
  pack(a, o);
  pack(b, o + P);
}

// One tensor's rows at a token: its base pointers, and elements between heads.
template <typename D>
struct Rows {
  const D* in;
  D* out;
  int64_t in_head, out_head;
  __device__ __forceinline__ Rows(const void* x, const RopeStrides& si, void* y, const RopeStrides& so, int64_t b,
                                  int64_t s)
      : in(static_cast<const D*>(x) + b * si.batch + s * si.seq),
        out(static_cast<D*>(y) + b * so.batch + s * so.seq),
        in_head(si.head),
        out_head(so.head) {}
};

// T, C: host storage types of q/k and of cos/sin; P elements an access.
template <typename T, typename C, int P, bool kInterleaved, bool kBwd>
__global__ void __launch_bounds__(kCtaThreads, kMinCtas) rope_kernel(const RopeParams p, const Layout lay) {
  using D = device_t<T>;
  using DC = device_t<C>;
  const int tx = int(threadIdx.x) % lay.x, ty = int(threadIdx.x) / lay.x % lay.y;
  const int tz = int(threadIdx.x) / (lay.x * lay.y);
  // Heads, units and offsets within a head fit in 32 bits (the glue checks);
  // tokens and whole offsets take 64.
  const int hq = int(p.heads_q), rows = int(p.heads_q + p.heads_k);
  const int units = int(p.head_dim / (2 * P)), rot_units = int(p.rotary_dim / (2 * P));
  const int rot = int(p.rotary_dim), half = rot / 2;
  const int64_t tokens = p.batch * p.seq;
  for (int64_t t = int64_t(blockIdx.x) * lay.z + tz; t < tokens; t += int64_t(gridDim.x) * lay.z) {
    const int64_t bi = t / p.seq, si = t - bi * p.seq;
    const int64_t cs = bi * p.cs_batch + si * p.cs_seq;
    const DC* cos_row = static_cast<const DC*>(p.cos) + cs;
    const DC* sin_row = static_cast<const DC*>(p.sin) + cs;
    const Rows<D> q(p.q, p.q_in, p.q_out, p.q_out_strides, bi, si);
    const Rows<D> k(p.k, p.k_in, p.k_out, p.k_out_strides, bi, si);
    // The token ahead's (batch, position) from this one's, without a second division.
    int64_t ba = bi + lay.prefetch_batches, sa = si + lay.prefetch_positions;
    if (sa >= p.seq) {
      sa -= p.seq;
      ++ba;
    }
    const bool prefetch = lay.prefetch > 0 && ba < p.batch;
    const int64_t ahead_offset = prefetch ? ba * p.q_in.batch + sa * p.q_in.seq : 0;
    const D* q_ahead = static_cast<const D*>(p.q) + ahead_offset;
    const D* k_ahead = prefetch ? static_cast<const D*>(p.k) + ba * p.k_in.batch + sa * p.k_in.seq : q_ahead;
    for (int u = tx; u < units; u += lay.x) {
      const bool rotary = u < rot_units;
      const int o1 = !rotary ? rot + (u - rot_units) * 2 * P : kInterleaved ? 2 * u * P : u * P;
      const int o2 = rotary && !kInterleaved ? half + u * P : o1 + P;
      Coeffs<DC, P> c, s;
      if (rotary) {
        c.load(cos_row, o1, o2);
        s.load(sin_row, o1, o2);
      }
      for (int r0 = ty; r0 < rows; r0 += kRowsInFlight * lay.y) {
        Frag<D, P> a[kRowsInFlight], b[kRowsInFlight];
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          const int r = r0 + i * lay.y;
          if (r < rows) {
            if (prefetch) {
              const D* next = r < hq ? q_ahead + r * q.in_head : k_ahead + (r - hq) * k.in_head;
              prefetch_l2(next + o1);
              prefetch_l2(next + o2);
            }
            const D* in = r < hq ? q.in + r * q.in_head : k.in + (r - hq) * k.in_head;
            load_l1<L1Policy::kNoAllocate>(a[i], in + o1);
            load_l1<L1Policy::kNoAllocate>(b[i], in + o2);
          }
        }
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          const int r = r0 + i * lay.y;
          if (r < rows) {
            if (rotary) rotate<kInterleaved, kBwd>(a[i], b[i], c, s);
            D* out = r < hq ? q.out + r * q.out_head : k.out + (r - hq) * k.out_head;
            a[i].store(out + o1);
            b[i].store(out + o2);
          }
        }
      }
    }
  }
}

}  // namespace fln::cuda::rotary
