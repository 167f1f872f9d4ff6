// Forward kernel that reads its row twice: one CTA a row walks it once for
// the statistics, then again to write y.  The first walk reads x from DRAM
// and keeps it in L1 (evict_last); the second reads it back from there
// (evict_first), so DRAM still sees x once.  Both loads carry the same
// priority in L2 (a cache hint): evict_last on the first read, evict_first on
// the second, as torch.compile's Triton kernels mark them; the hints measured
// faster, while an L2 hint on the weight and bias too ran level or behind and
// is left out.  No copy of the row is held across the reduction, so a thread
// needs few registers: kRereadMinCtas CTAs of kRereadMaxThreads an SM (32
// registers a thread, every warp slot busy), and all their rows are in flight
// at once.  This is how torch.compile's Triton kernels run RMSNorm at
// 7168-32768 and LayerNorm at 16384 (looped reductions, 23-32 registers).
//
// The rows of the CTAs on an SM must fit its L1 together with the weight
// and bias, or the second walk goes to L2: the plan gives each thread a few
// 16-byte accesses and the CTA as many threads as that takes.
//
// Statistics: sums of x and x^2 in one reduction, as the register kernels'
// shifted sums with K = 0 (fwd_kernel.cuh), and a row whose mean^2 passes
// kMaxShiftRatio * var, or whose var is not finite, takes a walk for
// sum((x - center)^2), center the mean (4-byte rows: after a walk adding the
// mean of x - mean) or common.cuh's snap_center (16-bit).  A constant row
// comes out with its value as mean and variance 0.  Every sum adds in a fixed
// order: bitwise reproducible.
#pragma once
#include "common.cuh"
#include "fwd_kernel.cuh"
#include "../params.h"

namespace fln::cuda {

constexpr int kRereadMaxThreads = 1024;
constexpr int kRereadMinCtas = 2;
// 16-byte loads a thread issues together in the first walk, and in the
// second (which also loads weight and bias; fp32 weights on 16-bit x take
// twice the registers an access).
constexpr int kRereadLoads = 4;
template <typename T, typename W>
constexpr int kRereadWriteLoads = sizeof(W) > sizeof(T) ? 1 : 2;

// Sums of K values over a CTA of whole warps (at most 32), in a fixed
// order; every thread gets the totals.  sm: two buffers of per-warp sums,
// used in turn (parity), so the next sum's writes cannot race this one's reads.
template <typename A, int K>
__device__ __forceinline__ void cta_sum(A (&v)[K], A (&sm)[2][32][2], int& parity) {
  static_assert(K <= 2, "two values a warp");
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, nw = int(blockDim.x) / 32;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = butterfly_sum<32>(v[k]);
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < K; ++k) sm[parity][warp][k] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = butterfly_sum<32>(lane < nw ? sm[parity][lane][k] : A(0));
  parity ^= 1;
}

// NV > 0, the straight-line variant: every thread holds exactly NV
// accesses of the row (cols == NV * VEC * blockDim.x: launch_plan.h's
// reread_exact), so its walks have no loop and no test an access, and each
// CTA runs one row.  NV == 0: any row, a grid-stride loop over the rows.
// RMS_ONLY (NV > 0): a build for RMSNorm alone, whose 16-bit write walk takes
// both accesses at once; LayerNorm's straight-line rows keep the build for
// either op (p.rms at run time), which ran slightly ahead of a LayerNorm-only
// build.
template <typename T, typename W, int VEC, int NV, bool RMS_ONLY = false>
__global__ void __launch_bounds__(kRereadMaxThreads, kRereadMinCtas)
norm_fwd_reread_kernel(FwdParams p, dacc_t<T> inv_n) {
  static_assert(NV > 0 || !RMS_ONLY, "the looped walk serves both ops");
  static_assert(VEC * sizeof(T) == 16, "16-byte accesses");
  using A = dacc_t<T>;
  __shared__ A sm[2][32][2];
  int parity = 0;
  const int nvec = int(p.cols / VEC);  // cols % VEC == 0 (launch_plan.h); a row has < 2^31 accesses
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  const W* __restrict__ wg = static_cast<const W*>(p.w);
  const W* __restrict__ bg = static_cast<const W*>(p.b);
  auto at = [](int c) { return int64_t(c) * VEC; };

  auto one_row = [&](int64_t row) {
    const T* __restrict__ xrow = static_cast<const T*>(p.x) + row * p.x_stride;
    // One walk over the row for its sums, kRereadLoads accesses a thread at
    // a time (NV > 0: all NV), each valid access handed to f; the lines stay
    // in L1.  LayerNorm's exact walks (below) load without allocating
    // in L1 (the lines are there already), so that their loads differ from the
    // first walk's: the compiler otherwise keeps the first walk's fragments
    // for it, and LayerNorm's straight-line rows ran slower.
    auto walk = [&](auto f, auto again) {
      if constexpr (NV > 0) {
        constexpr bool kAgain = decltype(again)::value;
        constexpr L1Policy P = kAgain ? L1Policy::kNoAllocate : L1Policy::kEvictLast;
        constexpr L2Policy Q = kAgain ? L2Policy::kNormal : L2Policy::kEvictLast;
        Frag<T, VEC> xr[NV];
#pragma unroll
        for (int u = 0; u < NV; ++u) load_l1<P, Q>(xr[u], xrow + at(tid + u * nt));
#pragma unroll
        for (int u = 0; u < NV; ++u) f(xr[u]);
      } else {
        for (int j = tid; j < nvec; j += kRereadLoads * nt) {
          Frag<T, VEC> xr[kRereadLoads];
#pragma unroll
          for (int u = 0; u < kRereadLoads; ++u) {
            if (j + u * nt >= nvec) {  // never summed; zeroed, or the compiler spills the
              xr[u].zero();            // fragments it cannot prove written (144-212 bytes)
              continue;
            }
            load_l1<L1Policy::kEvictLast, L2Policy::kEvictLast>(xr[u], xrow + at(j + u * nt));
          }
#pragma unroll
          for (int u = 0; u < kRereadLoads; ++u)
            if (j + u * nt < nvec) f(xr[u]);
        }
      }
    };
    A mean = 0, var = 0;
    if (RMS_ONLY || p.rms) {
      A q = 0;
      walk([&](const Frag<T, VEC>& x) {
        A a = 0;
#pragma unroll
        for (int k = 0; k < VEC; ++k) a += x.get(k) * x.get(k);
        q += a;
      }, std::false_type{});
      A v[1] = {q};
      cta_sum(v, sm, parity);
      var = v[0] * inv_n;
    } else {
      A s1 = 0, s2 = 0;
      walk([&](const Frag<T, VEC>& x) {
        A a = 0, b = 0;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          a += x.get(k);
          b += x.get(k) * x.get(k);
        }
        s1 += a;
        s2 += b;
      }, std::false_type{});
      A v[2] = {s1, s2};
      cta_sum(v, sm, parity);
      mean = v[0] * inv_n;
      var = v[1] * inv_n - mean * mean;
      // Identical in every thread of the CTA: the exact walks are uniform.
      if (!(mean * mean <= A(kMaxShiftRatio) * var && var < A(INFINITY))) {
        // A constant row always comes here: 4-byte rows add the mean of x -
        // mean (exact for it), 16-bit rows take the walk about snap_center
        // (common.cuh); then sum((x - center)^2).
        A center = mean;
        if constexpr (sizeof(T) == 2) {
          center = snap_center<T>(mean);
        } else {
          A s0 = 0;
          walk([&](const Frag<T, VEC>& x) {
            A a = 0;
#pragma unroll
            for (int k = 0; k < VEC; ++k) a += x.get(k) - mean;
            s0 += a;
          }, std::true_type{});
          A m[1] = {s0};
          cta_sum(m, sm, parity);
          mean += m[0] * inv_n;
          center = mean;
        }
        A s3 = 0;
        walk([&](const Frag<T, VEC>& x) {
          A a = 0;
#pragma unroll
          for (int k = 0; k < VEC; ++k) a += (x.get(k) - center) * (x.get(k) - center);
          s3 += a;
        }, std::true_type{});
        A q[1] = {s3};
        cta_sum(q, sm, parity);
        centered_stats(mean, var, center, q[0] * inv_n);
      }
    }
    const A rstd = rsqrt_acc(var + A(p.eps));
    if (tid == 0) {
      if (p.mean) static_cast<A*>(p.mean)[row] = mean;
      if (p.rstd) static_cast<A*>(p.rstd)[row] = rstd;
    }
    // y = x * scale + (-mean * scale) (common.cuh's xhat_scale), then weight
    // and bias (fwd_kernel.cuh); weight and bias of x's width stay in L1 for
    // the SM's other rows.
    const A scale = xhat_scale(p.rms, var, rstd);
    const A shift = -mean * scale;
    T* __restrict__ yrow = static_cast<T*>(p.y) + row * p.cols;
    auto write_row = [&](auto has_w, auto has_b) {
      // Access c of the row: x again (from L1), weight and bias, y.
      auto write = [&](int c) {
        Frag<T, VEC> xi;
        load_l1<L1Policy::kEvictFirst, L2Policy::kEvictFirst>(xi, xrow + at(c));
        Frag<W, VEC> w, b;
        if constexpr (has_w()) load_l1<L1Policy::kEvictLast>(w, wg + at(c));
        if constexpr (has_b()) load_l1<L1Policy::kEvictLast>(b, bg + at(c));
        A y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A xh = xi.get(k) * scale + shift;
          y[k] = affine(has_w, has_b, xh, w, b, k);
        }
        store_vec(yrow + at(c), y);
      };
      if constexpr (NV > 0) {
        // One access at a time, except RMSNorm's 16-bit rows: two at a time
        // spilled 8 bytes with weight and bias, and ran behind in fp32;
        // RMSNorm's 16-bit rows (its own build) ran faster two at a time.
        if constexpr (RMS_ONLY && sizeof(T) == 2 && !has_b()) {  // RMSNorm has no bias
#pragma unroll
          for (int j = 0; j < NV; ++j) write(tid + j * nt);
        } else {
#pragma unroll 1
          for (int j = 0; j < NV; ++j) write(tid + j * nt);
        }
      } else {
        constexpr int U = kRereadWriteLoads<T, W>;
        for (int j = tid; j < nvec; j += U * nt)
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (j + u * nt < nvec) write(j + u * nt);
      }
    };
    with_affine(wg, bg, write_row);
  };
  // The straight-line variants run one row a CTA (reread_exact: at most
  // 2^31 - 1 rows); the loop's registers made them spill.
  if constexpr (NV > 0)
    one_row(blockIdx.x);
  else
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) one_row(row);
}

}  // namespace fln::cuda
