// Fallback kernels for rows too long for the register kernels on this device
// (no thread-block clusters before sm_90, or more than a cluster can hold).
// Correct for any size, but they re-read the row from global memory (the
// re-reads mostly hit L2), and the backward reads x and dy once more for the
// weight gradients: expect well under the register kernels' bandwidth.
#pragma once
#include "common.cuh"
#include "../params.h"

namespace fln::cuda {

template <typename T, typename W>
__global__ void __launch_bounds__(1024) norm_fwd_looped_kernel(FwdParams p) {
  using A = dacc_t<T>;
  __shared__ ReduceSmem<A, 1> smem;
  RowReducer<A, 1> red{smem, int(blockDim.x), 1, 0};
  const int64_t n = p.cols;
  const W* wg = static_cast<const W*>(p.w);
  const W* bg = static_cast<const W*>(p.b);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    A mean = 0;
    if (!p.rms) {
      A s[1] = {0};
      for (int64_t c = threadIdx.x; c < n; c += blockDim.x) s[0] += to_acc(x[c]);
      red.sum(s);
      mean = s[0] / A(n);
    }
    A q[1] = {0};
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const A d = to_acc(x[c]) - mean;
      q[0] += d * d;
    }
    red.sum(q);
    const A rstd = rsqrt_acc(q[0] / A(n) + A(p.eps));
    if (threadIdx.x == 0) {
      if (p.mean) static_cast<A*>(p.mean)[row] = mean;
      if (p.rstd) static_cast<A*>(p.rstd)[row] = rstd;
    }
    T* y = static_cast<T*>(p.y) + row * n;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const A w = wg ? to_acc(wg[c]) : A(1), b = bg ? to_acc(bg[c]) : A(0);
      y[c] = from_acc<T>((to_acc(x[c]) - mean) * rstd * w + b);
    }
  }
}

template <typename T, typename W>
__global__ void __launch_bounds__(1024) norm_bwd_dx_looped_kernel(BwdParams p) {
  using A = dacc_t<T>;
  __shared__ ReduceSmem<A, 2> smem;
  RowReducer<A, 2> red{smem, int(blockDim.x), 1, 0};
  const int64_t n = p.cols;
  const W* wg = static_cast<const W*>(p.w);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const A mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[row];
    const A rstd = static_cast<const A*>(p.rstd)[row];
    A s[2] = {0, 0};
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const A g = to_acc(dy[c]) * (wg ? to_acc(wg[c]) : A(1));
      s[0] += g * (to_acc(x[c]) - mean) * rstd;
      s[1] += g;
    }
    red.sum(s);
    const A c_gx = s[0] / A(n), c_g = p.rms ? A(0) : s[1] / A(n);
    T* dx = static_cast<T*>(p.dx) + row * n;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const A g = to_acc(dy[c]) * (wg ? to_acc(wg[c]) : A(1));
      dx[c] = from_acc<T>(rstd * (g - c_g - (to_acc(x[c]) - mean) * rstd * c_gx));
    }
  }
}

// Partial weight gradients by columns: CTA (32 columns x 32 row lanes) for
// column tile blockIdx.x and row chunk blockIdx.y writes partial row blockIdx.y.
template <typename T>
__global__ void __launch_bounds__(1024)
norm_bwd_dw_columns_kernel(BwdParams p, int64_t chunk_rows, dacc_t<T>* part_w, dacc_t<T>* part_b) {
  using A = dacc_t<T>;
  __shared__ A sw[32][33], sb[32][33];
  const int64_t n = p.cols, c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < p.rows ? r0 + chunk_rows : p.rows;
  A aw = 0, ab = 0;
  if (c < n)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 32) {
      const A mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[r];
      const A rstd = static_cast<const A*>(p.rstd)[r];
      const A dy = to_acc(static_cast<const T*>(p.dy)[r * p.dy_stride + c]);
      aw += dy * (to_acc(static_cast<const T*>(p.x)[r * p.x_stride + c]) - mean) * rstd;
      ab += dy;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y != 0 || c >= n) return;
  A tw = 0, tb = 0;
  for (int k = 0; k < 32; ++k) { tw += sw[k][threadIdx.x]; tb += sb[k][threadIdx.x]; }
  if (part_w) part_w[int64_t(blockIdx.y) * n + c] = tw;
  if (part_b) part_b[int64_t(blockIdx.y) * n + c] = tb;
}

}  // namespace fln::cuda
