// Split-row forward, for rows longer than a cluster of 16 CTAs holds (or
// than one CTA before sm_90).  Each row is cut into column chunks of one CTA each:
//   1. fwd_split_stats_kernel: per (row, chunk), the chunk's mean (from the
//      sum of x - x[0], exact for a constant row) and its sum of squared
//      deviations from that mean (exact two-pass over registers);
//   2. fwd_split_rowstat_kernel: per row, the chunks merged in chunk order
//      with Chan's formula (accurate when |mean| >> std), giving mean / rstd;
//   3. fwd_split_apply_kernel: y per (row, chunk).
// x is read twice (3 units of traffic instead of 2), but every SM has work at
// any row length.  Fixed orders throughout: results are reproducible.
#pragma once
#include "bwd_split_kernels.cuh"
#include "common.cuh"
#include "../params.h"

namespace fln::cuda {

template <typename T, int VEC>
__global__ void __launch_bounds__(kSplitThreads)
fwd_split_stats_kernel(FwdParams p, int64_t nchunks, acc2_t<dacc_t<T>>* part) {
  using A = dacc_t<T>;
  __shared__ ReduceSmem<A, 1> smem;
  RowReducer<A, 1> red{smem, int(blockDim.x), 1, 0};
  const int64_t n = p.cols, c0 = int64_t(blockIdx.x) * blockDim.x * VEC;
  const int64_t c = c0 + int64_t(threadIdx.x) * VEC;
  const int64_t count = (n - c0 < int64_t(blockDim.x) * VEC ? n - c0 : int64_t(blockDim.x) * VEC);
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const T* xrow = static_cast<const T*>(p.x) + row * p.x_stride;
    Frag<T, VEC> x;
    if (c < n) x.load(xrow + c);
    else x.zero();
    A mean = 0;
    if (!p.rms) {
      const A k0 = to_acc(xrow[0]);
      A s[1] = {0};
      if (c < n)
#pragma unroll
        for (int k = 0; k < VEC; ++k) s[0] += x.get(k) - k0;
      red.reduce(s);
      mean = k0 + s[0] / A(count);
    }
    A q[1] = {0};
    if (c < n)
#pragma unroll
      for (int k = 0; k < VEC; ++k) q[0] += (x.get(k) - mean) * (x.get(k) - mean);
    red.reduce(q);
    if (threadIdx.x == 0) part[row * nchunks + blockIdx.x] = {mean, q[0]};
  }
}

template <typename A>
__global__ void fwd_split_rowstat_kernel(FwdParams p, const acc2_t<A>* __restrict__ part, int64_t nchunks,
                                         int64_t chunk_cols) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  A cnt = 0, mean = 0, m2 = 0;
  for (int64_t j = 0; j < nchunks; ++j) {
    const acc2_t<A> s = part[row * nchunks + j];
    const A nb = A(p.cols - j * chunk_cols < chunk_cols ? p.cols - j * chunk_cols : chunk_cols);
    const A delta = s.x - mean, tot = cnt + nb;
    mean += delta * (nb / tot);  // the first chunk's mean exactly (nb / tot = 1)
    m2 += s.y + delta * delta * cnt * nb / tot;
    cnt = tot;
  }
  if (p.mean) static_cast<A*>(p.mean)[row] = p.rms ? A(0) : mean;
  static_cast<A*>(p.rstd)[row] = rsqrt_acc(m2 / A(p.cols) + A(p.eps));
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kSplitThreads) fwd_split_apply_kernel(FwdParams p) {
  using A = dacc_t<T>;
  const int64_t n = p.cols, c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (c >= n) return;
  A w[VEC], b[VEC];
  if (p.w) load_vec(static_cast<const W*>(p.w) + c, w);
  else
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[k] = 1;
  if (p.b) load_vec(static_cast<const W*>(p.b) + c, b);
  else
#pragma unroll
    for (int k = 0; k < VEC; ++k) b[k] = 0;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    Frag<T, VEC> x;
    x.load(static_cast<const T*>(p.x) + row * p.x_stride + c);
    const A mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[row];
    const A rstd = static_cast<const A*>(p.rstd)[row];
    A y[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = (x.get(k) - mean) * rstd * w[k] + b[k];
    store_vec(static_cast<T*>(p.y) + row * n + c, y);
  }
}

}  // namespace fln::cuda
