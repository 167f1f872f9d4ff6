// Forward kernel, row held in registers.  `tpr` threads of a CTA (times
// `csize` CTAs of a cluster for the longest rows) own one row; each thread
// keeps NV accesses of VEC elements in the storage dtype, so x is read from
// global memory exactly once.  Each thread takes the mean and M2 of its own
// elements (two passes over registers); one Chan-merge reduction gives the
// row's mean and variance (one barrier or cluster sync per row, not two);
// then y is written.  Rows are visited in a grid-stride loop whose trip count
// is uniform across a CTA and its cluster, so every thread takes part in
// every barrier.
#pragma once
#include "common.cuh"
#include "../params.h"

namespace fln::cuda {

struct RowLayout {
  int tpr;    // threads of one CTA on a row (power of two)
  int csize;  // CTAs of a cluster on a row (1 without clusters)
};

template <typename T, typename W, int VEC, int NV>
__global__ void __launch_bounds__(kMaxCtaThreads, 2) norm_fwd_kernel(FwdParams p, RowLayout lay) {
  using A = dacc_t<T>;
  __shared__ ReduceSmem<A, 3> smem;
  const int tpr = lay.tpr, rpc = blockDim.x / tpr;  // rows per CTA
  const int row_in_cta = threadIdx.x / tpr;
  const int crank = cluster_rank_or_zero(lay.csize);
  const int stride = tpr * lay.csize;  // threads per row
  const int t = crank * tpr + threadIdx.x % tpr;
  const int64_t group = blockIdx.x / lay.csize, ngroups = gridDim.x / lay.csize;
  const int64_t n = p.cols;
  const T* __restrict__ xg = static_cast<const T*>(p.x);
  const W* __restrict__ wg = static_cast<const W*>(p.w);
  const W* __restrict__ bg = static_cast<const W*>(p.b);
  RowReducer<A, 3> red{smem, tpr, lay.csize, row_in_cta};

  for (int64_t base = group * rpc; base < p.rows; base += ngroups * rpc) {
    const int64_t row = base + row_in_cta;
    const bool live = row < p.rows;
    Vec<T, VEC> x[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = int64_t(i * stride + t) * VEC;
      if (live && c < n) x[i] = load_raw<T, VEC>(xg + row * p.x_stride + c);
      else x[i] = zero_vec<T, VEC>();
    }
    // This thread's (n, mean, M2), two passes over its registers.
    A cnt = 0, sum = 0;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (int64_t(i * stride + t) * VEC < n) {
        cnt += A(VEC);
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum += to_acc(x[i].v[k]);
      }
    const A local_mean = (p.rms || cnt == A(0)) ? A(0) : sum / cnt;
    A m2 = 0;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const bool in = int64_t(i * stride + t) * VEC < n;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A d = in ? to_acc(x[i].v[k]) - local_mean : A(0);
        m2 += d * d;
      }
    }
    A mean = 0, q[1] = {0};
    if (p.rms) {  // sum of squares: one plain reduction
      q[0] = m2;
      red.sum(q);
    } else {      // mean and M2: one Chan reduction
      const auto st = red.stats({cnt, local_mean, m2});
      mean = st.mean;
      q[0] = st.m2;
    }
    const A rstd = rsqrt_acc(q[0] / A(n) + A(p.eps));
    if (live && t == 0) {
      if (p.mean) static_cast<A*>(p.mean)[row] = mean;
      if (p.rstd) static_cast<A*>(p.rstd)[row] = rstd;
    }
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = int64_t(i * stride + t) * VEC;
      if (c >= n) continue;
      A w[VEC], b[VEC], y[VEC];
      if (wg) load_vec(wg + c, w);
      else
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = 1;
      if (bg) load_vec(bg + c, b);
      else
#pragma unroll
        for (int k = 0; k < VEC; ++k) b[k] = 0;
#pragma unroll
      for (int k = 0; k < VEC; ++k) y[k] = (to_acc(x[i].v[k]) - mean) * rstd * w[k] + b[k];
      store_vec(static_cast<T*>(p.y) + row * n + c, y);
    }
  }
  red.finish();
}

}  // namespace fln::cuda
