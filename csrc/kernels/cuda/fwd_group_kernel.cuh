// Forward of long rows by row groups (sm_90+, group_xchg.cuh): G CTAs own a
// row, each a slice of kGroupSliceBytes, and trade the row's two sums
// through global memory.  The grid is persistent and launched
// cooperatively.
//
// - The compute warps copy their rows' x into a ring of STAGES buffers in
//   shared memory (cp.async, each thread its own slots, AHEAD rows ahead),
//   and reduce each row per warp: the warp's sum and its sum of squares
//   about the warp's own mean (exact, two shuffle reductions over the
//   registers), handed to the exchange warp through shared memory and an
//   mbarrier.  RMSNorm: the sum of squares of x alone.
// - The exchange warp merges the warps' pairs into the CTA's (Chan's parallel
//   variance: M2 = sum over parts of M2_k + c_k (mean_k - mean)^2, with the
//   parts' element counts c_k known from the layout), publishes them in its
//   slot, collects the group's G pairs of an earlier row and merges them the
//   same way into the row's mean and rstd, which it hands back through an
//   mbarrier (and stores, in the group's first CTA, where the caller wants
//   the statistics).
// - The compute warps write y of a row LAG rows after they summed it, so the
//   exchange overlaps the next rows' copies and sums.
// No shifted sums and no second pass: each part's variance is about its own
// mean.  Every sum has a fixed order, so y is bitwise reproducible.
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
  __shared__ GroupHandoff<NB> ho;  // totals: mean, rstd
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
  // Adds part k, (sum s_k, squares m_k about its mean, c_k elements), to M2
  // about `mean`: m_k + c_k (s_k / c_k - mean)^2.
  auto merged = [](A s, A m, A c, A mean) {
    const A d = c > 0 ? s / c - mean : A(0);
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
      const A s = wl < nwarps ? ws[wl][0] : A(0), m = wl < nwarps ? ws[wl][1] : A(0);
      const A s_cta = butterfly_sum<16>(s);
      const A m_cta = butterfly_sum<16>(merged(s, m, c_warp, c_cta > 0 ? s_cta / c_cta : A(0)));
      if (lane == 0) group_publish(slots, G, rank, j, s_cta, m_cta);
    };
    auto collect = [&](int64_t j) {
      float2 got[kSlotsPerLane];
      group_poll(slots, G, j, lane, got);
      A s = 0;
#pragma unroll
      for (int h = 0; h < kSlotsPerLane; ++h) s += got[h].x;  // zeros past G
      const A mean = p.rms ? A(0) : butterfly_sum<32>(s) * inv_n;
      A m = 0;
#pragma unroll
      for (int h = 0; h < kSlotsPerLane; ++h) m += merged(got[h].x, got[h].y, c_slot[h], mean);
      const A rstd = rsqrt_acc(butterfly_sum<32>(m) * inv_n + A(p.eps));
      if (lane == 0) {
        ho.put_totals(j, mean, rstd);
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
      A sum = 0;
      if (!p.rms) {
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
          for (int k = 0; k < VEC; ++k) sum += x[i].get(k);  // padding: zeros
        sum = butterfly_sum<32>(sum);
      }
      const A mean_w = c_warp > 0 ? sum / c_warp : A(0);
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
      if (lane == 0) ho.put_sums(j, warp, sum, m2);
    }
    if (j >= LAG) {
      const int64_t jj = j - LAG, row = row_of(jj);
      const int s = int(jj % STAGES);
      const A* tot = ho.wait_totals(jj);
      const A rstd = tot[1], shift = -tot[0] * rstd;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) >= n) continue;
        const Frag<T, VEC> x = load_shared16<T, VEC>(slot(s, i));
        A y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = (x.get(k) * rstd + shift) * w[i * VEC + k] + bias[i * VEC + k];
        store_vec(static_cast<T*>(p.y) + row * n + col(i), y);
      }
    }
  }
  cp_async_wait<0>();
}

}  // namespace fln::cuda
