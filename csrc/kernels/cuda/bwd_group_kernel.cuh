// Backward of rows longer than a thread-block cluster holds (sm_90+): a row
// group of G CTAs (up to kMaxGroupCtas, any count, one CTA an SM or more)
// owns a row, each CTA a slice of it, and the CTAs exchange the row's sums
// through global memory instead of distributed shared memory.  x and dy are
// read once and dx written once, where the split path (bwd_split_kernels.cuh)
// reads x and dy twice.  The grid is persistent and launched cooperatively,
// so that every CTA of a group is resident while the others wait on it.
//
// Each CTA has `tpr` compute threads and one exchange warp:
// - the compute warps copy their rows' x and dy into a ring of STAGES
//   buffers in shared memory (cp.async, each thread its own slots, AHEAD rows
//   ahead), add up sum(g * xhat) and sum(g) of a row (g = dy * w) and the
//   dweight / dbias partials (fp32 registers), reduce the sums per warp and
//   hand them to the exchange warp through shared memory and an mbarrier;
// - the exchange warp adds the warps' sums, publishes the CTA's sums in its
//   slot of the group (tagged with the row), collects the G slots of an
//   earlier row once they all carry its tag, adds them in slot order and
//   hands the row's totals back through an mbarrier;
// - the compute warps write dx of a row LAG rows after they summed it, so the
//   exchange (round trips to L2, and the wait for the group's slowest CTA)
//   overlaps the next rows' sums.
// No CTA-wide barrier is in the row loop.  Every sum has a fixed order, so
// dx and the partials are bitwise reproducible; finalize_kernel (bwd_kernel.cuh)
// adds the groups' partial rows as for the other register kernels.
#pragma once
#include "group_xchg.cuh"
#include "../params.h"

namespace fln::cuda {

// LAG: rows between a row's sums and its dx.  AHEAD = STAGES - 1 - LAG rows'
// copies are in flight while a row is summed.
template <typename T, typename W, int NV, int STAGES, int LAG>
__global__ void __launch_bounds__(kMaxCtaThreads + 32, 1)
norm_bwd_group_kernel(BwdParams p, GroupLayout lay, float* part_w, float* part_b, GroupXchg xg) {
  static_assert(sizeof(T) <= 4, "fp32 accumulators");
  using A = float;
  constexpr int VEC = 16 / sizeof(T);
  constexpr int AHEAD = STAGES - 1 - LAG;
  constexpr int NB = LAG + 1;  // shared exchange buffers: a row's are reused NB rows later
  static_assert(LAG >= 1 && AHEAD >= 1, "a row in flight and a row between sums and dx");
  // 16-bit x: xhat and dx's correction one FMA an element (norm_bwd_rows' kFold).
  constexpr bool kFold = sizeof(T) == 2;
  __shared__ GroupHandoff<NB> ho;  // totals: sum(g xhat), sum(g)
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const uint32_t stage_base = smem_addr(dyn_smem);

  const int tpr = lay.tpr, G = lay.size, nwarps = tpr / 32;
  const GroupPlace gp = group_place(G, p.rows);
  const int rank = gp.rank;
  const int64_t n = p.cols;
  const int64_t rows_g = gp.rows;
  const bool want_dx = p.dx != nullptr;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) ho.init(nwarps);
  __syncthreads();  // the only CTA-wide barrier

  if (warp == nwarps) {  // the exchange warp
    if (!want_dx) return;
    unsigned long long* slots = xg.slots + gp.group * kGroupXchgBufs * G * 2;
    auto publish = [&](int64_t j) {
      const A(*ws)[2] = ho.wait_sums(j);
      const A c0 = butterfly_sum<16>(lane % 16 < nwarps ? ws[lane % 16][0] : A(0));
      const A c1 = butterfly_sum<16>(lane % 16 < nwarps ? ws[lane % 16][1] : A(0));
      if (lane == 0) group_publish(slots, G, rank, j, c0, c1);
    };
    auto collect = [&](int64_t j) {
      float2 got[kMaxGroupCtas / 32];
      group_poll(slots, G, j, lane, got);
      float2 v = make_float2(0.f, 0.f);
#pragma unroll
      for (int h = 0; h < kMaxGroupCtas / 32; ++h)  // slots lane, lane + 32, ..., in that order
        if (lane + 32 * h < G) {
          v.x += got[h].x;
          v.y += got[h].y;
        }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {  // fixed order: every lane ends with the same bits
        v.x += __shfl_xor_sync(0xffffffffu, v.x, off);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
      }
      if (lane == 0) ho.put_totals(j, v.x, v.y);
    };
    group_exchange_walk<LAG>(rows_g, publish, collect);
    return;
  }

  // The compute threads.  Columns: access i of thread t of CTA r holds
  // elements ((i * G + r) * tpr + t) * VEC onwards.
  auto col = [&](int i) { return (int64_t(i * G + rank) * tpr + tid) * VEC; };
  auto row_of = [&](int64_t j) { return gp.row(j); };
  // Stage s, access i, x (0) or dy (1): this thread's 16-byte slot.
  auto slot = [&](int s, int i, int which) {
    return stage_base + uint32_t((((s * NV + i) * 2 + which) * tpr + tid) * 16);
  };
  const T* __restrict__ xp = static_cast<const T*>(p.x);
  const T* __restrict__ dyp = static_cast<const T*>(p.dy);
  const A* __restrict__ meanp = static_cast<const A*>(p.mean);
  const A* __restrict__ rstdp = static_cast<const A*>(p.rstd);
  const A inv_n = A(1) / A(n);

  // The weights in fp32 registers, unpacked once (group_params).
  A w[NV * VEC];
  A rw[NV * VEC], rb[NV * VEC];
  group_params<W, NV, VEC, true>(p.w, col, n, w);
#pragma unroll
  for (int k = 0; k < NV * VEC; ++k) rw[k] = rb[k] = A(0);

  auto issue = [&](int64_t j) {  // row j's copies into stage j % STAGES; one group, empty or not
    if (j < rows_g) {
      const int64_t row = row_of(j);
      const int s = int(j % STAGES);
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (col(i) < n) {
          cp_async16_to(slot(s, i, 0), xp + row * p.x_stride + col(i));
          cp_async16_to(slot(s, i, 1), dyp + row * p.dy_stride + col(i));
        }
    }
    cp_async_commit();
  };
  // Row statistics, loaded with the row's copies: stat[k] is row j - LAG + k
  // during iteration j (stat[LAG] the row summed, stat[0] the row whose dx is written).
  struct Stat {
    A mean, rstd;
  };
  auto load_stat = [&](int64_t j) {
    Stat s{A(0), A(0)};
    if (j < rows_g) {
      const int64_t row = row_of(j);
      s.mean = p.rms ? A(0) : meanp[row];
      s.rstd = rstdp[row];
    }
    return s;
  };
  Stat stat[STAGES];
#pragma unroll
  for (int k = 0; k < STAGES; ++k) stat[k] = Stat{A(0), A(0)};
#pragma unroll
  for (int a = 0; a < AHEAD; ++a) {
    issue(a);
    stat[LAG + 1 + a] = load_stat(a);
  }

  for (int64_t j = 0; j < rows_g + (want_dx ? LAG : 0); ++j) {
#pragma unroll
    for (int k = 0; k + 1 < STAGES; ++k) stat[k] = stat[k + 1];
    if (j < rows_g) {
      issue(j + AHEAD);
      stat[STAGES - 1] = load_stat(j + AHEAD);
      cp_async_wait<AHEAD>();  // row j's copies have landed
      const int s = int(j % STAGES);
      const A mean = stat[LAG].mean, rstd = stat[LAG].rstd, shift = -mean * rstd;
      A s0 = 0, s1 = 0;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) >= n) continue;
        const Frag<T, VEC> x = load_shared16<T, VEC>(slot(s, i, 0)), dy = load_shared16<T, VEC>(slot(s, i, 1));
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A xh = kFold ? x.get(k) * rstd + shift : (x.get(k) - mean) * rstd;
          const A d = dy.get(k), g = d * w[i * VEC + k];
          rw[i * VEC + k] += d * xh;
          rb[i * VEC + k] += d;
          s0 += g * xh;
          s1 += g;
        }
      }
      if (want_dx) {
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, off);
          s1 += __shfl_xor_sync(0xffffffffu, s1, off);
        }
        if (lane == 0) ho.put_sums(j, warp, s0, s1);
      }
    }
    if (want_dx && j >= LAG) {
      const int64_t jj = j - LAG, row = row_of(jj);
      const int s = int(jj % STAGES);
      const A* tot = ho.wait_totals(jj);
      const A mean = stat[0].mean, r = stat[0].rstd;
      // dx = g * rstd - ((x - mean) * c1 + c0), c1 = rstd^2 mean(g xhat), c0 = rstd mean(g)
      const A c1 = tot[0] * inv_n * r * r, c0 = p.rms ? A(0) : tot[1] * inv_n * r;
      const A c0x = c0 - mean * c1;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) >= n) continue;
        const Frag<T, VEC> x = load_shared16<T, VEC>(slot(s, i, 0)), dy = load_shared16<T, VEC>(slot(s, i, 1));
        A dx[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A t0 = kFold ? x.get(k) * c1 + c0x : (x.get(k) - mean) * c1 + c0;
          dx[k] = dy.get(k) * w[i * VEC + k] * r - t0;
        }
        store_vec(static_cast<T*>(p.dx) + row * n + col(i), dx);
      }
    }
  }
  cp_async_wait<0>();
  store_partial_row<NV, VEC>(rw, rb, part_w, part_b, gp.group, n, col);
}

}  // namespace fln::cuda
