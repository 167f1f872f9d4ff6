// Forward kernel for short rows: at most one warp's 32 lanes on a row, and
// several rows a thread.  LANES lanes (a power of two) hold a row, each NV
// 16-byte accesses of it, and a thread holds the same columns of R =
// kRowsAccesses / NV rows at once; a warp holds 32 / LANES such row slots
// side by side.  The weight and bias of a thread's columns are loaded once
// for its R rows, and the R rows' reductions run interleaved.
//
// Short rows are laid out as torch.compile's Triton kernels do: the general
// register kernel (fwd_kernel.cuh), one row of up to 64 bytes a thread,
// re-reads weight and bias for every row, which dominates its loads there.
//
// Statistics: LayerNorm takes two passes over the registers, the mean and
// then sum((x - mean)^2), which is exact without the general kernel's
// fallback test; RMSNorm one, sum(x^2).  A constant row comes out with its
// value as mean and variance 0: 4-byte rows sum x - x[0] for the mean; 16-bit
// rows sum x, exactly for a constant row of up to 2^13 elements, and divide
// by n rounded once (exact_ratio): no register held through the second pass
// (centering it on a 16-bit value next to the mean, as the longer rows do,
// spilled 12-68 bytes here).
// Every sum adds in a fixed order (a butterfly over the row's lanes), so the
// results are bitwise reproducible.
#pragma once
#include "common.cuh"
#include "../params.h"

namespace fln::cuda {

// Accesses of 16 bytes a thread holds (NV * R), and the CTA size.
constexpr int kRowsAccesses = 4;
constexpr int kRowsCtaThreads = 128;

template <typename T, typename W, int VEC, int NV, int LANES>
__global__ void __launch_bounds__(kRowsCtaThreads, sizeof(W) > sizeof(T) ? 6 : 8)
norm_fwd_rows_kernel(FwdParams p, dacc_t<T> inv_n) {
  static_assert(VEC * sizeof(T) == 16 && NV <= kRowsAccesses && LANES <= 32 && (LANES & (LANES - 1)) == 0,
                "16-byte accesses, whole rows a thread");
  constexpr int R = kRowsAccesses / NV;  // rows a thread (1 at NV = 3)
  constexpr int SLOTS = 32 / LANES;      // rows side by side in a warp
  using A = dacc_t<T>;
  const int lane = int(threadIdx.x) % 32, l = lane % LANES;
  // A grid of at most 2^31 - 1 CTAs walks the rows in strides (one trip
  // below that).  Row r of this thread: the warp's R * SLOTS rows, slots
  // adjacent, so that one access of the warp covers SLOTS neighbouring rows.
  constexpr int64_t kWarps = kRowsCtaThreads / 32;
  for (int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; warp * (SLOTS * R) < p.rows;
       warp += int64_t(gridDim.x) * kWarps) {
    const int64_t row0 = warp * (SLOTS * R) + lane / LANES;
    const int n = int(p.cols);  // < 32 * kRowsAccesses * VEC (launch_plan.h)
    // Access i of a row sits kStep * i elements past the lane's first, a
    // constant: every address below is one base pointer a row plus an
    // immediate offset.  Computed per access from the row and the column
    // (64-bit products), they were a sizeable share of a row's instructions.
    constexpr int kStep = LANES * VEC;
    const int c0 = l * VEC;
    auto valid = [&](int i) { return c0 + i * kStep < n; };
    // Rows of this thread still in the tensor, as an int (it has R at most),
    // and each row's pointers as a step from the first: no 64-bit products
    // or compares a row.
    const int64_t left = p.rows - row0;
    const int nlive = left < R * SLOTS ? int(left) : R * SLOTS;
    auto live = [&](int r) { return r * SLOTS < nlive; };
    const T* __restrict__ xrow = static_cast<const T*>(p.x) + row0 * p.x_stride + c0;
    const int64_t xstep = SLOTS * p.x_stride;

    // x in the accumulation type.  Under the 64-register bound the compiler
    // still converts 16-bit elements again in each pass rather than hold
    // them all; holding them (an opaque asm after the conversion) saved
    // instructions but gained nothing and spilled the 64-element rows.
    A x[R][NV][VEC];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        Frag<T, VEC> f;
        if (live(r) && valid(i))
          load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(f, xrow + r * xstep + i * kStep);  // fwd_kernel.cuh
        else
          f.zero();
#pragma unroll
        for (int k = 0; k < VEC; ++k) x[r][i][k] = f.get(k);
      }

    A mean[R], var[R];
    if (!p.rms) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if constexpr (sizeof(T) == 2) {
          A s = 0;
#pragma unroll
          for (int i = 0; i < NV; ++i)
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += x[r][i][k];  // padding: zeros
          mean[r] = exact_ratio(butterfly_sum<LANES>(s), A(n), inv_n);
        } else {
          // The row's first element, from its first lane.
          const A k0 = __shfl_sync(0xffffffffu, x[r][0][0], lane & ~(LANES - 1));
          A s = 0;
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            if (!valid(i)) continue;  // padding: zeros, not x - x[0]
#pragma unroll
            for (int k = 0; k < VEC; ++k) s += x[r][i][k] - k0;
          }
          mean[r] = k0 + butterfly_sum<LANES>(s) * inv_n;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      A q = 0;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (!p.rms && !valid(i)) continue;  // padding: zeros, not x - mean
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = p.rms ? x[r][i][k] : x[r][i][k] - mean[r];
          q += d * d;
        }
      }
      var[r] = q;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) var[r] = butterfly_sum<LANES>(var[r]) * inv_n;
    A scale[R];  // common.cuh's xhat_scale
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const A rstd = rsqrt_acc(var[r] + A(p.eps));
      // common.cuh's xhat_scale written out: through the call ptxas spilled
      // 8 bytes in the fp16 rows of one access a lane.
      scale[r] = !p.rms && var[r] == A(0) ? A(0) : rstd;
      if (p.rms) mean[r] = 0;
      if (l == 0 && live(r)) {
        const int64_t row = row0 + r * SLOTS;
        if (p.mean) static_cast<A*>(p.mean)[row] = mean[r];
        if (p.rstd) static_cast<A*>(p.rstd)[row] = rstd;
      }
    }

    // y = (x - mean) * rstd * w + b, as x * rstd + (-mean * rstd) (one FMA, as
    // in fwd_kernel.cuh); one loop per weight / bias combination.
    const W* __restrict__ wg = static_cast<const W*>(p.w);
    const W* __restrict__ bg = static_cast<const W*>(p.b);
    T* __restrict__ yrow = static_cast<T*>(p.y) + row0 * p.cols + c0;
    const int64_t ystep = SLOTS * p.cols;
    auto write_rows = [&](auto has_w, auto has_b) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (!valid(i)) continue;
        // Plain loads: as load_l1's (volatile asm) they spill in the fp16
        // rows of one access a lane.
        Frag<W, VEC> w, b;
        if constexpr (has_w()) w.load(wg + c0 + i * kStep);
        if constexpr (has_b()) b.load(bg + c0 + i * kStep);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (!live(r)) continue;
          const A shift = -mean[r] * scale[r];
          A y[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A xh = x[r][i][k] * scale[r] + shift;
            y[k] = affine(has_w, has_b, xh, w, b, k);
          }
          store_vec(yrow + r * ystep + i * kStep, y);
        }
      }
    };
    with_affine(wg, bg, write_rows);
  }
}

}  // namespace fln::cuda
