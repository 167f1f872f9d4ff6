// Split-row backward, for rows longer than a row group holds
// (bwd_group_kernel.cuh: 16-byte accesses of 2- and 4-byte types), a
// cluster of 16 CTAs (8-byte types) or of 4 (rows of scalar accesses), or one
// CTA before sm_90.  Each row is cut into column chunks of one CTA each:
//   1. bwd_split_sums_kernel: per (row, chunk), sum(g * xhat) and sum(g);
//   2. bwd_split_rowsum_kernel: per row, the chunk sums in chunk order;
//   3. bwd_split_dx_kernel: dx per (row, chunk), and per CTA the dweight /
//      dbias partials of its chunk over its rows (one partial row per grid row).
// x and dy are read twice (5 units of traffic instead of 3), but every SM has
// work at any row length.  Clusters beat it since their sums are pushed.
// Every sum has a fixed order: results are bitwise reproducible.
#pragma once
#include "common.cuh"
#include "../params.h"

namespace fln::cuda {

constexpr int kSplitThreads = 256;

template <typename T, typename W, int VEC>
__device__ __forceinline__ void load_weight_chunk(const BwdParams& p, int64_t c, dacc_t<T> (&w)[VEC]) {
  if (p.w != nullptr && c < p.cols) load_vec(static_cast<const W*>(p.w) + c, w);
  else
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[k] = 1;
}

// One (row, chunk) access of x and dy with the row's statistics.
template <typename T, int VEC>
struct RowChunk {
  Frag<T, VEC> x, dy;
  dacc_t<T> mean, rstd;
  __device__ __forceinline__ RowChunk(const BwdParams& p, int64_t row, int64_t c) {
    using A = dacc_t<T>;
    x.load(static_cast<const T*>(p.x) + row * p.x_stride + c);
    dy.load(static_cast<const T*>(p.dy) + row * p.dy_stride + c);
    mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[row];
    rstd = static_cast<const A*>(p.rstd)[row];
  }
};

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kSplitThreads)
bwd_split_sums_kernel(BwdParams p, int64_t nchunks, acc2_t<dacc_t<T>>* part) {
  using A = dacc_t<T>;
  __shared__ ReduceSmem<A, 2> smem;
  RowReducer<A, 2> red{smem, int(blockDim.x), 1, 0};
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  A w[VEC];
  load_weight_chunk<T, W, VEC>(p, c, w);
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    A s[2] = {0, 0};
    if (c < p.cols) {
      const RowChunk<T, VEC> r(p, row, c);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A g = r.dy.get(k) * w[k];
        s[0] += g * (r.x.get(k) - r.mean) * r.rstd;
        s[1] += g;
      }
    }
    red.reduce(s);
    if (threadIdx.x == 0) part[row * nchunks + blockIdx.x] = {s[0], s[1]};
  }
}

template <typename A>
__global__ void bwd_split_rowsum_kernel(const acc2_t<A>* __restrict__ part, int64_t rows, int64_t nchunks,
                                        acc2_t<A>* __restrict__ rowsum) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  acc2_t<A> s{0, 0};
  for (int64_t j = 0; j < nchunks; ++j) {
    s.x += part[row * nchunks + j].x;
    s.y += part[row * nchunks + j].y;
  }
  rowsum[row] = s;
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kSplitThreads)
bwd_split_dx_kernel(BwdParams p, const acc2_t<dacc_t<T>>* __restrict__ rowsum, dacc_t<T>* part_w,
                    dacc_t<T>* part_b) {
  using A = dacc_t<T>;
  const int64_t n = p.cols, c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (c >= n) return;  // no barriers below
  const A inv_n = A(1) / A(n);
  A w[VEC], acc_w[VEC], acc_b[VEC];
  load_weight_chunk<T, W, VEC>(p, c, w);
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc_w[k] = acc_b[k] = 0;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const RowChunk<T, VEC> r(p, row, c);
    const A rstd = r.rstd;
    A c_gx = 0, c_g = 0;
    if (p.dx) {
      c_gx = rowsum[row].x * inv_n;
      c_g = p.rms ? A(0) : rowsum[row].y * inv_n;
    }
    A dx[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const A xh = (r.x.get(k) - r.mean) * rstd, d = r.dy.get(k);
      acc_w[k] += d * xh;
      acc_b[k] += d;
      dx[k] = rstd * (d * w[k] - c_g - xh * c_gx);
    }
    if (p.dx) store_vec(static_cast<T*>(p.dx) + row * n + c, dx);
  }
  if (part_w) store_vec(part_w + int64_t(blockIdx.y) * n + c, acc_w);
  if (part_b) store_vec(part_b + int64_t(blockIdx.y) * n + c, acc_b);
}

}  // namespace fln::cuda
