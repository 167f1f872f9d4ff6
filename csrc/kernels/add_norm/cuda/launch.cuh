// Launchers of the fused pre-norm kernels: plan.h's plan turned into an
// instantiation, a grid and a launch on the caller's stream.
#pragma once
#include <cuda_runtime.h>

#include "../../cuda/launch_common.cuh"
#include "add_norm_cuda.h"
#include "kernel.cuh"
#include "plan.h"

namespace fln::cuda {

namespace add_norm {

static_assert(kPlanMaxThreads <= kMaxCtaThreads && kPlanMaxCluster <= kMaxClusterCtas, "RowReducer's warp and CTA slots");

template <typename T>
using acc = dacc_t<T>;

// Calls f(std::integral_constant<int, VEC>) for the plan's access width.
template <typename T, typename F>
cudaError_t with_vec(int vec, F&& f) {
  constexpr int kWide = 16 / sizeof(T);
  if (vec == kWide) return f(std::integral_constant<int, kWide>{});
  return f(std::integral_constant<int, 1>{});
}

constexpr unsigned kMaxGridY = 65535;

// Zeroes a row group launch's exchange slots (`values` a CTA, common.cuh)
// and launches it cooperatively: it fails rather than leave a CTA waiting.
// Where the device refuses the grid (fewer SMs than it reports, under MPS
// say), the caller takes the split instead.
inline bool group_refused(cudaError_t e) {
  return e == cudaErrorCooperativeLaunchTooLarge || e == cudaErrorNotSupported;
}

template <typename P, typename... KArgs, typename... Args>
cudaError_t launch_group(void (*kernel)(KArgs...), const Plan& pl, int64_t groups, int values, Workspace ws,
                         cudaStream_t stream, const P& p, Layout lay, Args... args) {
  const size_t bytes = group_slot_bytes(groups, pl.cluster, values);
  lay.group_slots = static_cast<unsigned long long*>(ws.alloc(ws.ctx, bytes));
  if (!lay.group_slots) return cudaErrorMemoryAllocation;
  const cudaError_t e = cudaMemsetAsync(lay.group_slots, 0, bytes, stream);
  if (e != cudaSuccess) return e;
  const LaunchConfig lc(dim3(unsigned(groups * pl.cluster)), dim3(unsigned(pl.cta_threads)), 0, 1, stream, false,
                        true);
  return launch_with(lc, kernel, p, lay, args...);
}

}  // namespace add_norm

template <typename T, typename W, typename R>
cudaError_t add_norm_fwd(const AddNormFwdParams& p0, const DeviceInfo& dev, cudaStream_t stream, Workspace ws) {
  using namespace add_norm;
  using A = acc<T>;
  if (p0.rows == 0) return cudaSuccess;
  AddNormFwdParams p = p0;
  constexpr int V = 16 / sizeof(T);
  const bool vec_ok = p.cols % V == 0 && p.x_stride % V == 0 && (!p.residual || p.residual_stride % V == 0) &&
                      aligned(p.x, 16) && aligned(p.y, 16) && aligned(p.residual, sizeof(R) * V) &&
                      aligned(p.h, sizeof(R) * V) && aligned(p.w, sizeof(W) * V) && aligned(p.b, sizeof(W) * V) &&
                      aligned(p.mask, V);
  add_norm::Plan pl = add_norm::make_plan(p.cols, sizeof(T), vec_ok, false, dev.cc_major);
  return with_vec<T>(pl.vec, [&](auto vec_tag) -> cudaError_t {
    constexpr int VEC = decltype(vec_tag)::value;
    constexpr int NV = accesses_per_thread(false, VEC, sizeof(T));
    if (pl.accesses != NV) return cudaErrorInvalidConfiguration;  // plan.h and the instantiations disagree
    Layout lay{pl.threads_per_row, pl.cluster, pl.chunks};
    // Rows of one CTA, a cluster or a group take the kernel without dropout
    // code where p == 0; split rows (long, rare) keep one kernel for both.
    // Rows of exactly NV accesses a thread take kernels without bounds tests.
    const bool drop = p.dropout_p > 0.0;
    auto kernel = [&](auto mode, auto prefetch) {
      constexpr Mode MM = decltype(mode)::value;
      constexpr bool PF = decltype(prefetch)::value;
      const bool whole = int64_t(NV) * VEC * pl.threads_per_row * pl.cluster == p.cols;
      return drop ? (whole ? &add_norm_fwd_kernel<T, W, R, VEC, NV, MM, true, true, PF>
                           : &add_norm_fwd_kernel<T, W, R, VEC, NV, MM, true, false, PF>)
                  : (whole ? &add_norm_fwd_kernel<T, W, R, VEC, NV, MM, false, true, PF>
                           : &add_norm_fwd_kernel<T, W, R, VEC, NV, MM, false, false, PF>);
    };
    using kRow = std::integral_constant<Mode, Mode::kRow>;
    auto row_kernel = kernel(kRow{}, std::false_type{});
    const int64_t row_res = pl.strategy == Strategy::kRow ? resident_groups(row_kernel, dev, pl.cta_threads, 1, 0) : 0;
    if (one_cta_row(pl) && row_res < kFwdMinRowCtas * dev.sm_count) {
      pl = walking_plan(pl);
      lay = Layout{pl.threads_per_row, 1, 1};
    }
    if (pl.strategy == Strategy::kCluster) {
      auto k = kernel(std::integral_constant<Mode, Mode::kCluster>{}, std::false_type{});
      const int64_t res = resident_groups(k, dev, pl.cta_threads, pl.cluster, 0);
      if (res > 0) {  // a persistent grid: one launch of clusters for many rows
        const int64_t groups = p.rows < res ? p.rows : res;
        if (fwd_row_tickets(p.rows, groups)) {
          lay.row_ticket = static_cast<unsigned*>(ws.alloc(ws.ctx, sizeof(unsigned)));
          if (!lay.row_ticket) return cudaErrorMemoryAllocation;
          const cudaError_t e = cudaMemsetAsync(lay.row_ticket, 0, sizeof(unsigned), stream);
          if (e != cudaSuccess) return e;
        }
        return launch(k, dim3(unsigned(groups * pl.cluster)), pl.cta_threads, 0, pl.cluster, stream, p, lay,
                      static_cast<A*>(nullptr));
      }
      pl = split_plan(pl);
      lay = Layout{pl.threads_per_row, 1, pl.chunks};
    }
    if constexpr (sizeof(A) == 4) {  // the group exchange carries 32-bit values
      if (pl.strategy == Strategy::kSplit) {
        const add_norm::Plan split = pl;
        pl = group_plan(pl);  // before kernel(): a whole row counts the group's CTAs
        auto k = kernel(std::integral_constant<Mode, Mode::kGroup>{}, std::false_type{});
        const int64_t res = resident_groups(k, dev, pl.cta_threads, 1, 0, true) / pl.cluster;
        if (res > 0) {
          const cudaError_t e = launch_group(k, pl, p.rows < res ? p.rows : res, 3, ws, stream, p,
                                             Layout{pl.threads_per_row, pl.cluster, 1}, static_cast<A*>(nullptr));
          if (!group_refused(e)) return e;
        }
        pl = split;
      }
    }
    if (pl.strategy == Strategy::kSplit) {
      A* work = static_cast<A*>(ws.alloc(ws.ctx, size_t(p.rows) * pl.chunks * 3 * sizeof(A)));
      if (!work) return cudaErrorMemoryAllocation;
      if (!p.h) {  // the second pass reads h back
        p.h = ws.alloc(ws.ctx, size_t(p.rows) * p.cols * sizeof(R));
        if (!p.h) return cudaErrorMemoryAllocation;
      }
      const dim3 grid(unsigned(pl.chunks), unsigned(p.rows < kMaxGridY ? p.rows : kMaxGridY));
      cudaError_t e = launch(&add_norm_fwd_kernel<T, W, R, VEC, NV, Mode::kSplitStats, true>, grid, pl.cta_threads, 0, 1,
                             stream, p, lay, work);
      if (e != cudaSuccess) return e;
      return launch(&add_norm_fwd_kernel<T, W, R, VEC, NV, Mode::kSplitApply, true>, grid, pl.cta_threads, 0, 1, stream, p,
                    lay, work);
    }
    const int rows_per_cta = pl.cta_threads / pl.threads_per_row;
    int64_t groups = (p.rows + rows_per_cta - 1) / rows_per_cta;
    if (groups > INT32_MAX) groups = INT32_MAX;
    // Rows taken once ask L2 for later CTAs' rows where the rows resident
    // CTAs hold are too few bytes an SM (plan.h) and the prefetching kernel
    // keeps as many CTAs resident.
    const int64_t cta_row_bytes = rows_per_cta * p.cols * int64_t(sizeof(T) + (p.residual ? sizeof(R) : 0));
    const int team_access_bytes = pl.threads_per_row * VEC * int(sizeof(T));
    if (row_res > 0 &&
        fwd_prefetch((row_res + dev.sm_count - 1) / dev.sm_count, cta_row_bytes, team_access_bytes, dev)) {
      auto prefetching = kernel(kRow{}, std::true_type{});
      if (resident_groups(prefetching, dev, pl.cta_threads, 1, 0) >= row_res) {
        const int64_t ahead = row_res / kFwdPrefetchRoundParts;
        lay.prefetch_rows = (ahead > 0 ? ahead : 1) * rows_per_cta;
        return launch(prefetching, dim3(unsigned(groups)), pl.cta_threads, 0, 1, stream, p, lay,
                      static_cast<A*>(nullptr));
      }
    }
    return launch(row_kernel, dim3(unsigned(groups)), pl.cta_threads, 0, 1, stream, p, lay, static_cast<A*>(nullptr));
  });
}

template <typename T, typename W, typename R>
cudaError_t add_norm_bwd(const AddNormBwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace ws) {
  using namespace add_norm;
  using A = acc<T>;
  const bool want_w = p.dw || p.db;
  auto finalize = [&](const A* part_w, const A* part_b, int64_t nparts) -> cudaError_t {
    if (!want_w) return cudaSuccess;
    const dim3 grid(unsigned((p.cols + 31) / 32), 2);
    return launch(&add_norm_finalize_kernel<device_t<W>, A>, grid, kFinalizeWarps * 32, 0, 1, stream, part_w,
                  part_b, nparts, p.cols, static_cast<device_t<W>*>(p.dw), static_cast<device_t<W>*>(p.db));
  };
  if (p.rows == 0) return finalize(nullptr, nullptr, 0);
  constexpr int V = 16 / sizeof(T);
  const bool vec_ok = p.cols % V == 0 && p.h_stride % V == 0 && p.dy_stride % V == 0 &&
                      (!p.dh || p.dh_stride % V == 0) && aligned(p.h, sizeof(R) * V) && aligned(p.dy, 16) &&
                      aligned(p.dh, sizeof(R) * V) && aligned(p.dx, 16) && aligned(p.dresidual, sizeof(R) * V) &&
                      aligned(p.w, sizeof(W) * V);
  add_norm::Plan pl = add_norm::make_plan(p.cols, sizeof(T), vec_ok, true, dev.cc_major);
  // The two register budgets of the backward (plan.h): NV accesses a thread, or twice as many.
  auto body = [&](auto vec_tag, auto nv_tag) -> cudaError_t {
    constexpr int VEC = decltype(vec_tag)::value;
    constexpr int NV = decltype(nv_tag)::value;
    Layout lay{pl.threads_per_row, pl.cluster, pl.chunks};
    const int rows_per_cta = pl.cta_threads / pl.threads_per_row;
    const size_t smem = rows_per_cta > 1 ? size_t(pl.cta_threads) * NV * VEC * 2 * sizeof(A) : 0;
    // Rows in pairs (plan.h): the pair kernel replaces k where its registers
    // keep as many CTAs (clusters of csize) resident.  True if it did.
    auto prefer_pairs = [&](auto& k, int64_t& res, int csize) {
      if constexpr (bwd_row_pairs(sizeof(T), sizeof(R), NV * VEC, VEC)) {
        auto paired = &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kCluster, true>;
        const int64_t paired_res = resident_groups(paired, dev, pl.cta_threads, csize, smem);
        if (paired_res > 0 && paired_res >= res) {
          k = paired;
          res = paired_res;
          return true;
        }
      }
      return false;
    };
    // Rows walked one at a time take the prefetching kernel where the bytes a
    // thread has in flight while its row reduces (the next row's h and dy,
    // this row's dh) are too few an SM (plan.h) and it keeps as many CTAs
    // resident.  CTAs an SM round up: clusters of 3 or more leave SMs idle.
    const int bytes_ahead = NV * VEC * int(sizeof(R) + sizeof(T) + (p.dh ? sizeof(R) : 0));
    auto with_prefetch = [&](auto& k, int64_t& res, auto prefetching, int csize) {
      const int64_t ctas_per_sm = (res * csize + dev.sm_count - 1) / dev.sm_count;
      if (res <= 0 || !bwd_prefetch(ctas_per_sm, pl.cta_threads, bytes_ahead, dev)) return;
      const int64_t prefetching_res = resident_groups(prefetching, dev, pl.cta_threads, csize, smem);
      if (prefetching_res >= res) {
        k = prefetching;
        res = prefetching_res;
      }
    };
    auto parts = [&](int64_t groups) -> std::pair<A*, A*> {
      if (!want_w) return {nullptr, nullptr};
      A* w = static_cast<A*>(ws.alloc(ws.ctx, size_t(groups) * p.cols * sizeof(A)));
      A* b = p.db ? static_cast<A*>(ws.alloc(ws.ctx, size_t(groups) * p.cols * sizeof(A))) : nullptr;
      return {w, b};
    };
    if (pl.strategy == Strategy::kCluster) {
      auto k = &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kCluster>;
      int64_t res = resident_groups(k, dev, pl.cta_threads, pl.cluster, smem);
      if (!prefer_pairs(k, res, pl.cluster))
        with_prefetch(k, res, &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kCluster, false, true>, pl.cluster);
      if (res > 0) {
        const int64_t groups = p.rows < res ? p.rows : res;
        auto [pw, pb] = parts(groups);
        if (want_w && (!pw || (p.db && !pb))) return cudaErrorMemoryAllocation;
        const cudaError_t e = launch(k, dim3(unsigned(groups * pl.cluster)), pl.cta_threads, smem, pl.cluster,
                                     stream, p, lay, pw, pb, static_cast<A*>(nullptr));
        return e == cudaSuccess ? finalize(pw, pb, groups) : e;
      }
      pl = split_plan(pl);
      lay = Layout{pl.threads_per_row, 1, pl.chunks};
    }
    if constexpr (sizeof(A) == 4) {  // the group exchange carries 32-bit values
      if (pl.strategy == Strategy::kSplit) {
        auto k = &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kGroup>;
        const add_norm::Plan group = group_plan(pl);
        const int64_t res = resident_groups(k, dev, group.cta_threads, 1, 0, true) / group.cluster;
        if (res > 0) {
          const int64_t groups = p.rows < res ? p.rows : res;
          auto [pw, pb] = parts(groups);
          if (want_w && (!pw || (p.db && !pb))) return cudaErrorMemoryAllocation;
          const cudaError_t e = launch_group(k, group, groups, 2, ws, stream, p,
                                             Layout{group.threads_per_row, group.cluster, 1}, pw, pb,
                                             static_cast<A*>(nullptr));
          if (!group_refused(e)) return e == cudaSuccess ? finalize(pw, pb, groups) : e;
        }
      }
    }
    if (pl.strategy == Strategy::kSplit) {
      auto k = &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kSplitApply>;
      const int64_t res = resident_groups(k, dev, pl.cta_threads, 1, 0) / pl.chunks;
      int64_t groups = p.rows < res ? p.rows : res;
      if (groups < 1) groups = 1;
      if (groups > kMaxGridY) groups = kMaxGridY;
      A* work = static_cast<A*>(ws.alloc(ws.ctx, size_t(p.rows) * pl.chunks * 2 * sizeof(A)));
      auto [pw, pb] = parts(groups);
      if (!work || (want_w && (!pw || (p.db && !pb)))) return cudaErrorMemoryAllocation;
      const dim3 stats_grid(unsigned(pl.chunks), unsigned(p.rows < kMaxGridY ? p.rows : kMaxGridY));
      cudaError_t e = launch(&add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kSplitStats>, stats_grid, pl.cta_threads,
                             0, 1, stream, p, lay, static_cast<A*>(nullptr), static_cast<A*>(nullptr), work);
      if (e != cudaSuccess) return e;
      e = launch(k, dim3(unsigned(pl.chunks), unsigned(groups)), pl.cta_threads, 0, 1, stream, p, lay, pw, pb, work);
      return e == cudaSuccess ? finalize(pw, pb, groups) : e;
    }
    auto k = &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kRow>;
    int64_t res = resident_groups(k, dev, pl.cta_threads, 1, smem);
    if (!(one_cta_row(pl) && prefer_pairs(k, res, 1)))  // pairs as clusters of one CTA
      with_prefetch(k, res, &add_norm_bwd_kernel<T, W, R, VEC, NV, Mode::kRow, false, true>, 1);
    if (res == 0) return cudaErrorInvalidConfiguration;
    const int64_t needed = (p.rows + rows_per_cta - 1) / rows_per_cta;
    const int64_t groups = needed < res ? needed : res;
    auto [pw, pb] = parts(groups);
    if (want_w && (!pw || (p.db && !pb))) return cudaErrorMemoryAllocation;
    const cudaError_t e =
        launch(k, dim3(unsigned(groups)), pl.cta_threads, smem, 1, stream, p, lay, pw, pb, static_cast<A*>(nullptr));
    return e == cudaSuccess ? finalize(pw, pb, groups) : e;
  };
  return with_vec<T>(pl.vec, [&](auto vec_tag) -> cudaError_t {
    constexpr int VEC = decltype(vec_tag)::value;
    constexpr int kShort = accesses_per_thread(true, VEC, sizeof(T)), kLong = accesses_per_thread(true, VEC, sizeof(T), true);
    if (pl.accesses == kShort) return body(vec_tag, std::integral_constant<int, kShort>{});
    if (pl.accesses == kLong) return body(vec_tag, std::integral_constant<int, kLong>{});
    return cudaErrorInvalidConfiguration;  // plan.h and the instantiations disagree
  });
}

}  // namespace fln::cuda
