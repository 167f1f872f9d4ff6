// Forward of long rows by row groups (sm_90+, group_xchg.cuh): G CTAs own a
// row, each a slice of kGroupSliceBytes, and trade each CTA's (mean, M2)
// pair through global memory.  The grid is persistent and launched
// cooperatively.
//
// - The compute warps copy their rows' x into a ring of STAGES buffers in
//   shared memory (cp.async, each thread its own slots, AHEAD rows ahead),
//   and reduce each row per warp: the warp's mean (its first element plus
//   the mean of x less it) and its sum of squares about that mean (exact,
//   two shuffle reductions over the registers), handed to the exchange warp
//   through shared memory and an mbarrier.  RMSNorm: the sum of squares of x
//   alone.
// - The exchange warp merges the warps' pairs into the CTA's (Chan's parallel
//   variance: mean = mean_0 + sum over parts of c_k (mean_k - mean_0) / c,
//   M2 = sum of M2_k + c_k (mean_k - mean)^2, with the parts' element counts
//   c_k known from the layout), publishes them in its
//   slot, collects the group's G pairs of an earlier row and merges them the
//   same way into the row's mean and rstd, which it hands back through an
//   mbarrier (and stores, in the group's first CTA, where the caller wants
//   the statistics).
// - The compute warps write y of a row LAG rows after they summed it, so the
//   exchange overlaps the next rows' copies and sums.
// No second pass: each part's variance is about its own mean.  A constant
// row gets its value as every mean and zero variance (then xhat = 0,
// fwd_kernel.cuh).  Every sum has a fixed order, so y is bitwise reproducible.
#pragma once
#include "group_xchg.cuh"
#include "../params.h"

namespace fln::cuda {

template <typename T, typename W, int NV, int STAGES, int LAG, int MINB = 1>
__global__ void __launch_bounds__(kMaxCtaThreads + 32, MINB)
norm_fwd_group_kernel(FwdParams p, GroupLayout lay, GroupXchg xg, float inv_n) {
  static_assert(sizeof(T) <= 4, "fp32 accumulators");
  using A = float;
  constexpr int VEC = 16 / sizeof(T);
  constexpr int AHEAD = STAGES - 1 - LAG;
  constexpr int NB = LAG + 1;  // shared exchange buffers: a row's are reused NB rows later
  static_assert(LAG >= 1 && AHEAD >= 1, "a row in flight and a row between sums and y");
  constexpr int kSlotsPerLane = kMaxGroupCtas / 32;
  __shared__ GroupHandoff<NB> ho;  // totals: mean, xhat_scale (common.cuh)
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const uint32_t stage_base = smem_addr(dyn_smem);

  const int tpr = lay.tpr, G = lay.size, nwarps = tpr / 32;
  const GroupPlace gp = group_place(G, p.rows);
  const int rank = gp.rank;
  const int64_t n = p.cols;
  const int64_t rows_g = gp.rows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  auto row_of = [&](int64_t j) { return gp.row(j); };
  // Columns: access i of thread t of CTA r holds elements ((i * G + r) * tpr
  // + t) * VEC onwards.  Elements of a row that `width` threads from thread
  // `first` of CTA r hold (n is a multiple of VEC).
  auto held = [&](int r, int first, int width) {
    int c = 0;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t left = n - (int64_t(i * G + r) * tpr + first) * VEC;
      c += left <= 0 ? 0 : left < int64_t(width) * VEC ? int(left) : width * VEC;
    }
    return A(c);
  };
  // Part k's (mean_k, squares m_k about it, c_k elements) share of M2 about
  // `mean`: m_k + c_k (mean_k - mean)^2.
  auto merged = [](A mean_k, A m, A c, A mean) {
    const A d = mean_k - mean;
    return m + c * d * d;
  };
  if (tid == 0) ho.init(nwarps);
  __syncthreads();  // the only CTA-wide barrier

  if (warp == nwarps) {  // the exchange warp
    unsigned long long* slots = xg.slots + gp.group * kGroupXchgBufs * G * 2;
    const int wl = lane % 16;  // the compute warp whose pair this lane reads
    const A c_warp = wl < nwarps ? held(rank, wl * 32, 32) : A(0), c_cta = held(rank, 0, tpr);
    A c_slot[kSlotsPerLane];  // the elements of the CTAs whose slots this lane collects
#pragma unroll
    for (int h = 0; h < kSlotsPerLane; ++h) c_slot[h] = lane + 32 * h < G ? held(lane + 32 * h, 0, tpr) : A(0);
    auto publish = [&](int64_t j) {
      const A(*ws)[2] = ho.wait_sums(j);
      const A mw = wl < nwarps ? ws[wl][0] : A(0), m = wl < nwarps ? ws[wl][1] : A(0);
      const A m0 = __shfl_sync(0xffffffffu, mw, 0);  // warp 0's mean
      const A d = butterfly_sum<16>(c_warp * (mw - m0));
      const A mean_cta = c_cta > 0 ? m0 + d / c_cta : A(0);
      const A m_cta = butterfly_sum<16>(merged(mw, m, c_warp, mean_cta));
      if (lane == 0) group_publish(slots, G, rank, j, mean_cta, m_cta);
    };
    auto collect = [&](int64_t j) {
      float2 got[kSlotsPerLane];
      group_poll(slots, G, j, lane, got);
      const A m0 = __shfl_sync(0xffffffffu, got[0].x, 0);  // CTA 0's mean
      A s = 0;
#pragma unroll
      for (int h = 0; h < kSlotsPerLane; ++h) s += c_slot[h] * (got[h].x - m0);  // zeros past G
      const A mean = p.rms ? A(0) : m0 + butterfly_sum<32>(s) * inv_n;
      A m = 0;
#pragma unroll
      for (int h = 0; h < kSlotsPerLane; ++h) m += merged(got[h].x, got[h].y, c_slot[h], mean);
      const A var = butterfly_sum<32>(m) * inv_n, rstd = rsqrt_acc(var + A(p.eps));
      if (lane == 0) {
        ho.put_totals(j, mean, xhat_scale(p.rms, var, rstd));
        if (rank == 0) {
          if (p.mean) static_cast<A*>(p.mean)[row_of(j)] = mean;
          if (p.rstd) static_cast<A*>(p.rstd)[row_of(j)] = rstd;
        }
      }
    };
    group_exchange_walk<LAG>(rows_g, publish, collect);
    return;
  }

  // The compute threads.
  auto col = [&](int i) { return (int64_t(i * G + rank) * tpr + tid) * VEC; };
  auto slot = [&](int s, int i) { return stage_base + uint32_t(((s * NV + i) * tpr + tid) * 16); };
  const T* __restrict__ xp = static_cast<const T*>(p.x);
  const A c_warp = held(rank, warp * 32, 32);
  // Weight and bias in fp32 registers, read once (1 and 0 where absent).
  A w[NV * VEC], bias[NV * VEC];
  group_params<W, NV, VEC, true>(p.w, col, n, w);
  group_params<W, NV, VEC, false>(p.b, col, n, bias);
  auto issue = [&](int64_t j) {  // row j's copies into stage j % STAGES; one group, empty or not
    if (j < rows_g) {
      const T* xr = xp + row_of(j) * p.x_stride;
      const int s = int(j % STAGES);
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (col(i) < n) cp_async16_to(slot(s, i), xr + col(i));
    }
    cp_async_commit();
  };
#pragma unroll
  for (int a = 0; a < AHEAD; ++a) issue(a);

  for (int64_t j = 0; j < rows_g + LAG; ++j) {
    if (j < rows_g) {
      issue(j + AHEAD);
      cp_async_wait<AHEAD>();  // row j's copies have landed
      const int s = int(j % STAGES);
      Frag<T, VEC> x[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) < n) x[i] = load_shared16<T, VEC>(slot(s, i));
        else x[i].zero();
      }
      A mean_w = 0;
      if (!p.rms) {
        // Lane 0 holds the warp's first element wherever the warp holds any.
        const A k0 = __shfl_sync(0xffffffffu, to_acc(x[0].get(0)), 0);
        A sum = 0;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (col(i) >= n) continue;  // padding: zeros, not x - k0
#pragma unroll
          for (int k = 0; k < VEC; ++k) sum += x[i].get(k) - k0;
        }
        sum = butterfly_sum<32>(sum);
        mean_w = c_warp > 0 ? k0 + sum / c_warp : A(0);
      }
      A m2 = 0;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) >= n) continue;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = x[i].get(k) - mean_w;
          m2 += d * d;
        }
      }
      m2 = butterfly_sum<32>(m2);
      if (lane == 0) ho.put_sums(j, warp, mean_w, m2);
    }
    if (j >= LAG) {
      const int64_t jj = j - LAG, row = row_of(jj);
      const int s = int(jj % STAGES);
      const A* tot = ho.wait_totals(jj);
      const A scale = tot[1], shift = -tot[0] * scale;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) >= n) continue;
        const Frag<T, VEC> x = load_shared16<T, VEC>(slot(s, i));
        A y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = (x.get(k) * scale + shift) * w[i * VEC + k] + bias[i * VEC + k];
        store_vec(static_cast<T*>(p.y) + row * n + col(i), y);
      }
    }
  }
  cp_async_wait<0>();
}

}  // namespace fln::cuda
