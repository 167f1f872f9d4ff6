// Launchers: turn a Plan into a kernel instantiation, a grid and a launch on
// the caller's stream.  Included only by the inst_*.cu files.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <mutex>
#include <tuple>

#include "bwd_group_kernel.cuh"
#include "fwd_group_kernel.cuh"
#include "bwd_kernel.cuh"
#include "bwd_split_kernels.cuh"
#include "fwd_kernel.cuh"
#include "fwd_reread_kernel.cuh"
#include "fwd_rows_kernel.cuh"
#include "fwd_split_kernels.cuh"
#include "launch_common.cuh"
#include "launch_plan.h"
#include "norm_cuda.h"

namespace fln::cuda {

static_assert(kMaxCta == kMaxCtaThreads, "launch_plan.h and the kernels' launch bounds must agree");
static_assert(kRereadCta == kRereadMaxThreads, "launch_plan.h and fwd_reread_kernel.cuh must agree on CTA size");
static_assert(kRereadSmThreads == kRereadMaxThreads * kRereadMinCtas, "and on the threads an SM");
static_assert(kMaxGroup == kMaxGroupCtas, "launch_plan.h and group_xchg.cuh must agree on row groups");
static_assert(kShortRowAccesses == kRowsAccesses && kShortRowCta == kRowsCtaThreads,
              "launch_plan.h and fwd_rows_kernel.cuh must agree on short rows");
static_assert(kMaxClusterCtas >= 16, "launch_plan.h plans clusters of up to 16 CTAs (RowReducer's slots)");

template <typename DT, typename DW>
bool fwd_vec_ok(const FwdParams& p) {
  constexpr int V = 16 / sizeof(DT);
  return p.cols % V == 0 && p.x_stride % V == 0 && aligned(p.x, 16) && aligned(p.y, 16) &&
         aligned(p.w, sizeof(DW) * V) && aligned(p.b, sizeof(DW) * V);
}

template <typename DT, typename DW>
bool bwd_vec_ok(const BwdParams& p) {
  constexpr int V = 16 / sizeof(DT);
  return p.cols % V == 0 && p.x_stride % V == 0 && p.dy_stride % V == 0 && aligned(p.x, 16) &&
         aligned(p.dy, 16) && aligned(p.dx, 16) && aligned(p.w, sizeof(DW) * V);
}

// Row groups (Plan::group, group_xchg.cuh), both directions: as many
// groups as are resident at once, and not more than rows (the launch is
// cooperative, so it fails rather than leave a CTA waiting); 0 where none
// fits.  Each CTA has one exchange warp besides its compute threads.
template <typename K>
int64_t group_count(K kernel, const Plan& pl, const DeviceInfo& dev, size_t smem, int64_t rows) {
  const int64_t per = resident_groups(kernel, dev, pl.cta_threads + 32, 1, smem) / pl.csize;
  return per < rows ? per : rows;
}

// The exchange slots of `groups` groups of csize CTAs.
inline size_t group_xchg_bytes(int64_t groups, int csize) {
  return size_t(groups) * kGroupXchgBufs * csize * 2 * sizeof(unsigned long long);
}

// Zeroes the slots (where the launch exchanges sums) and launches the groups.
template <typename... KArgs, typename... Args>
cudaError_t launch_groups(void (*kernel)(KArgs...), const Plan& pl, int64_t groups, size_t smem, GroupXchg xg,
                          cudaStream_t stream, Args... args) {
  if (xg.slots) {
    const cudaError_t e = cudaMemsetAsync(xg.slots, 0, group_xchg_bytes(groups, pl.csize), stream);
    if (e != cudaSuccess) return e;
  }
  const LaunchConfig lc(dim3(unsigned(groups * pl.csize)), dim3(unsigned(pl.cta_threads + 32)), smem, 1, stream,
                        false, true);
  return launch_with(lc, kernel, args...);
}

// Instantiation chooser: the kernel holding NV accesses of VEC for the
// smallest power of two NV >= nv that the register budget allows.
template <typename DT, typename DW, int VEC, bool CACHE_WB, bool X_SMEM, bool CLUSTER, bool STAGE = false, int NV = 1>
auto pick_fwd(int nv) -> void (*)(FwdParams, RowLayout, dacc_t<DT>) {
  // Staged rows never take the 128-byte threads (test_launch_plan.cpp).
  constexpr int kMax = X_SMEM ? kXSmemMaxNv : max_accesses(false, VEC, sizeof(DT), !STAGE);
  if constexpr (NV >= kMax) {
    return &norm_fwd_kernel<DT, DW, VEC, NV, CACHE_WB, X_SMEM, CLUSTER, STAGE>;
  } else {
    return nv <= NV ? &norm_fwd_kernel<DT, DW, VEC, NV, CACHE_WB, X_SMEM, CLUSTER, STAGE>
                    : pick_fwd<DT, DW, VEC, CACHE_WB, X_SMEM, CLUSTER, STAGE, NV * 2>(nv);
  }
}

template <typename DT, typename DW, int VEC, int NV, BwdPipe PIPE, int REGS>
constexpr auto bwd_kernel_ptr() {
  if constexpr (REGS == 64) return &norm_bwd_kernel<DT, DW, VEC, NV, PIPE>;
  else return &norm_bwd_kernel_capped<DT, DW, VEC, NV, PIPE, REGS>;
}

template <typename DT, typename DW, int VEC, BwdPipe PIPE, int REGS, int NV = 1>
auto pick_bwd(int nv) -> void (*)(BwdParams, RowLayout, dacc_t<DT>*, dacc_t<DT>*) {
  if constexpr (NV >= max_accesses(true, VEC, sizeof(DT), true)) {
    return bwd_kernel_ptr<DT, DW, VEC, NV, PIPE, REGS>();
  } else {
    return nv <= NV ? bwd_kernel_ptr<DT, DW, VEC, NV, PIPE, REGS>() : pick_bwd<DT, DW, VEC, PIPE, REGS, NV * 2>(nv);
  }
}

// The register kernel a plan names.  Plans without a cluster take kernels
// compiled without the cluster exchange, which run faster, except the
// 128-byte fp32 threads, which the compiler then spilled twice as much (and
// which ran slower); the weight cache exists only in clusters.
template <typename DT, typename DW, bool CLUSTER>
auto fwd_kernel_of(const Plan& pl) {
  constexpr int V = 16 / sizeof(DT);
  if (pl.vec == 1) return pick_fwd<DT, DW, 1, false, false, CLUSTER>(pl.nv);
  if (pl.x_smem) return pick_fwd<DT, DW, V, false, true, CLUSTER>(pl.nv);
  return pick_fwd<DT, DW, V, false, false, CLUSTER>(pl.nv);
}

// The short-row kernel of a plan (Plan::short_rows): lanes a row a power of
// two up to 32, 1-4 accesses a lane.
template <typename DT, typename DW, int NV>
auto fwd_rows_kernel_lanes(int tpr) -> void (*)(FwdParams, dacc_t<DT>) {
  constexpr int V = 16 / sizeof(DT);
  switch (tpr) {
    case 1: return &norm_fwd_rows_kernel<DT, DW, V, NV, 1>;
    case 2: return &norm_fwd_rows_kernel<DT, DW, V, NV, 2>;
    case 4: return &norm_fwd_rows_kernel<DT, DW, V, NV, 4>;
    case 8: return &norm_fwd_rows_kernel<DT, DW, V, NV, 8>;
    case 16: return &norm_fwd_rows_kernel<DT, DW, V, NV, 16>;
    default: return &norm_fwd_rows_kernel<DT, DW, V, NV, 32>;
  }
}
template <typename DT, typename DW>
auto fwd_rows_kernel_for(const Plan& pl) -> void (*)(FwdParams, dacc_t<DT>) {
  static_assert(kRowsAccesses == 4, "one case an access count");
  switch (pl.nv) {
    case 1: return fwd_rows_kernel_lanes<DT, DW, 1>(pl.tpr);
    case 2: return fwd_rows_kernel_lanes<DT, DW, 2>(pl.tpr);
    case 3: return fwd_rows_kernel_lanes<DT, DW, 3>(pl.tpr);
    default: return fwd_rows_kernel_lanes<DT, DW, 4>(pl.tpr);
  }
}

// The re-read kernel of a plan (Plan::reread): the straight-line variant
// where every thread holds exactly kRereadPairAccesses of the row (RMSNorm's
// own build for RMSNorm), or kRereadQuadAccesses (LayerNorm's 16-bit rows
// with weight and bias of x's dtype: reread_quad_beats_pair); else the loop.
template <typename DT, typename DW>
auto fwd_reread_kernel_for(const Plan& pl, const FwdParams& p) -> void (*)(FwdParams, dacc_t<DT>) {
  constexpr int V = 16 / sizeof(DT);
  constexpr int NV = kRereadPairAccesses;
  if (reread_exact(pl, p.cols)) {
    if (pl.nv == NV)
      return p.rms ? &norm_fwd_reread_kernel<DT, DW, V, NV, true> : &norm_fwd_reread_kernel<DT, DW, V, NV>;
    if constexpr (sizeof(DT) == 2 && sizeof(DW) == sizeof(DT))
      if (pl.nv == kRereadQuadAccesses) return &norm_fwd_reread_kernel<DT, DW, V, kRereadQuadAccesses>;
  }
  return &norm_fwd_reread_kernel<DT, DW, V, 0>;
}

template <typename DT, typename DW>
auto fwd_kernel_for(const Plan& pl) {
  constexpr int V = 16 / sizeof(DT);
  if (pl.cache_wb)
    return pl.stage_x ? pick_fwd<DT, DW, V, true, false, true, true>(pl.nv)
                      : pick_fwd<DT, DW, V, true, false, true, false>(pl.nv);
  const bool wide = !pl.x_smem && pl.nv > max_accesses(false, pl.vec, sizeof(DT));
  return pl.csize > 1 || wide ? fwd_kernel_of<DT, DW, true>(pl) : fwd_kernel_of<DT, DW, false>(pl);
}

// The backward kernels: (pipe, register cap) pairs.  Staged pipes exist for
// 16-bit and 4-byte types (bwd_variant picks them for 16 elements a thread);
// the prefetch pipe comes in every cap of kPrefetchCaps.
struct BwdVariant {
  BwdPipe pipe = BwdPipe::kNone;
  int regs = 64;
};
constexpr int kPrefetchCaps[] = {64, 80, 96, 128};

template <typename DT, typename DW>
auto bwd_kernel_for(const Plan& pl, BwdVariant v) {
  constexpr int V = 16 / sizeof(DT);
  if (pl.vec == 1) return pick_bwd<DT, DW, 1, BwdPipe::kNone, 64>(pl.nv);
  if constexpr (sizeof(DT) == 2)
    if (v.pipe == BwdPipe::kStagedPair) return pick_bwd<DT, DW, V, BwdPipe::kStagedPair, 128>(pl.nv);
  if constexpr (sizeof(DT) <= 4) {
    if (v.pipe == BwdPipe::kStaged) return pick_bwd<DT, DW, V, BwdPipe::kStaged, 128>(pl.nv);
    if (v.pipe == BwdPipe::kStagedReread)
      return v.regs == 80 ? pick_bwd<DT, DW, V, BwdPipe::kStagedReread, 80>(pl.nv)
                          : pick_bwd<DT, DW, V, BwdPipe::kStagedReread, 96>(pl.nv);
  }
  if (v.pipe == BwdPipe::kPrefetch) switch (v.regs) {
      case 64: return pick_bwd<DT, DW, V, BwdPipe::kPrefetch, 64>(pl.nv);
      case 80: return pick_bwd<DT, DW, V, BwdPipe::kPrefetch, 80>(pl.nv);
      case 96: return pick_bwd<DT, DW, V, BwdPipe::kPrefetch, 96>(pl.nv);
      default: return pick_bwd<DT, DW, V, BwdPipe::kPrefetch, 128>(pl.nv);
    }
  return pick_bwd<DT, DW, V, BwdPipe::kNone, 64>(pl.nv);
}

// The row-group backward (Plan::group) of a dtype: 16 elements a thread,
// STAGES rows of x and dy in shared memory (32 KB each: kGroupSliceBytes), dx
// LAG rows after the sums.  (STAGES, LAG) is the fastest pair measured at
// 262144: (6, 3) for 16-bit rows, (7, 4) for fp32.
struct GroupKernelShape {
  int stages, lag;
};
using GroupKernelFn = void (*)(BwdParams, GroupLayout, float*, float*, GroupXchg);

template <typename DT, typename DW>
std::pair<GroupKernelFn, GroupKernelShape> bwd_group_kernel_for() {
  constexpr int V = 16 / sizeof(DT), NV = kGroupElems / V;
  constexpr GroupKernelShape k = sizeof(DT) == 2 ? GroupKernelShape{6, 3} : GroupKernelShape{7, 4};
  return {&norm_bwd_group_kernel<DT, DW, NV, k.stages, k.lag>, k};
}

// The row-group forward (Plan::group) of a dtype: 16 elements a thread,
// STAGES rows of x in shared memory (16 KB each), y LAG rows after the sums,
// two CTAs an SM (16-bit rows: at most 56 registers): one CTA an SM, or
// fewer stages, keeps too few bytes in flight.
using FwdGroupKernelFn = void (*)(FwdParams, GroupLayout, GroupXchg, float);

template <typename DT, typename DW>
std::pair<FwdGroupKernelFn, GroupKernelShape> fwd_group_kernel_for() {
  constexpr int V = 16 / sizeof(DT), NV = kGroupElems / V;
  constexpr GroupKernelShape k{7, 3};
  return {&norm_fwd_group_kernel<DT, DW, NV, k.stages, k.lag, sizeof(DT) == 2 ? 2 : 1>, k};
}

// How many of weight and bias the forward reads (the weight cache's arrays).
inline int fwd_w_arrays(const FwdParams& p) { return (p.w ? 1 : 0) + (p.b ? 1 : 0); }

template <typename T, typename W>
Plan fwd_plan(const FwdParams& p, const DeviceInfo& dev) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  const int w_bytes = (p.w || p.b) ? int(sizeof(DW)) : 0;
  return make_plan(p.rows, p.cols, sizeof(DT), sizeof(dacc_t<DT>), fwd_vec_ok<DT, DW>(p), false, dev, w_bytes,
                   fwd_w_arrays(p), !p.rms);
}

// Split path shape: chunks of kSplitThreads accesses; rows of the grid.
struct SplitShape {
  int vec;
  int64_t nchunks, grid_rows;
};

inline SplitShape split_shape(int64_t rows, int64_t cols, int vec) {
  SplitShape s;
  s.vec = vec;
  s.nchunks = ((cols + vec - 1) / vec + kSplitThreads - 1) / kSplitThreads;
  s.grid_rows = rows < 65535 ? rows : 65535;
  return s;
}

// Which rows take the register kernels (the rest take the split paths): the
// forward keeps clusters of up to 16 CTAs, and so does the backward of
// 16-byte accesses, whose cluster sums are pushed: both read x once where the
// split paths read it twice.  Rows of the scalar path (vec 1) keep at most 4: larger clusters
// were measured for 16-byte accesses only.
inline bool use_register_kernel(const Plan& pl, bool bwd) {
  return pl.registers && (!bwd || pl.vec > 1 || pl.csize <= 4);
}

template <typename T, typename W>
cudaError_t norm_fwd(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace ws) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  using A = dacc_t<DT>;
  if (p.rows == 0) return cudaSuccess;
  const Plan pl = fwd_plan<T, W>(p, dev);
  // The short-row and re-read kernels: plain grids of one launch unit a row
  // block (several short rows, or one re-read row), at most 2^31 - 1 CTAs
  // (the kernels stride past that).
  if (pl.short_rows || pl.reread) {
    auto kernel = pl.short_rows ? fwd_rows_kernel_for<DT, DW>(pl) : fwd_reread_kernel_for<DT, DW>(pl, p);
    const int64_t groups = pl.groups < INT32_MAX ? pl.groups : INT32_MAX;
    return launch(kernel, dim3(unsigned(groups)), dim3(pl.cta_threads), 0, 1, stream, p, A(1.0 / double(p.cols)));
  }
  if constexpr (sizeof(DT) <= 4)
    if (pl.group) {
      const auto [kernel, ks] = fwd_group_kernel_for<DT, DW>();
      const size_t smem = size_t(ks.stages) * size_t(x_smem_bytes(pl.cta_threads, pl.nv));
      const int64_t groups = group_count(kernel, pl, dev, smem, p.rows);
      if (groups > 0) {
        auto* slots = static_cast<unsigned long long*>(ws.alloc(ws.ctx, group_xchg_bytes(groups, pl.csize)));
        if (slots == nullptr) return cudaErrorMemoryAllocation;
        const GroupXchg xg{slots};
        return launch_groups(kernel, pl, groups, smem, xg, stream, p, GroupLayout{pl.cta_threads, pl.csize}, xg,
                             float(1.0 / double(p.cols)));
      }
    }
  if (!pl.group && use_register_kernel(pl, false)) {
    auto kernel = fwd_kernel_for<DT, DW>(pl);
    // Register clusters run a persistent grid (each walks many rows); plain
    // CTAs and rows in shared memory one CTA (or cluster) per row group
    // (persistent plain grids measured slower).
    const int64_t cache = wb_cache_smem(pl.cta_threads, pl.nv, pl.vec, sizeof(DW), fwd_w_arrays(p));
    const int64_t stage = pl.stage_x ? x_smem_bytes(pl.cta_threads, pl.nv) + kTicketSlotBytes : 0;
    const size_t smem = pl.x_smem     ? size_t(x_smem_bytes(pl.cta_threads, pl.nv))
                        : pl.cache_wb ? size_t(cache + stage)
                                      : 0;
    int64_t groups = pl.groups < INT32_MAX / pl.csize ? pl.groups : INT32_MAX / pl.csize;
    const bool persistent = pl.csize > 1 && !pl.x_smem;
    const int resident = persistent || smem > 0 ? resident_groups(kernel, dev, pl.cta_threads, pl.csize, smem) : 1;
    if (resident > 0) {
      RowLayout lay{pl.tpr, pl.csize};
      if (persistent && resident < groups) {
        groups = resident;
        if (use_row_tickets(pl, groups)) {
          lay.row_ticket = static_cast<unsigned*>(ws.alloc(ws.ctx, sizeof(unsigned)));
          if (lay.row_ticket == nullptr) return cudaErrorMemoryAllocation;
          const cudaError_t e = cudaMemsetAsync(lay.row_ticket, 0, sizeof(unsigned), stream);
          if (e != cudaSuccess) return e;
        }
      }
      return launch(kernel, dim3(unsigned(groups * pl.csize)), dim3(pl.cta_threads), smem, pl.csize, stream, p, lay,
                    A(1.0 / double(p.cols)));
    }
  }
  // Split path (also when a cluster plan finds no room on the device).  Its
  // kernels pass the statistics on through memory: scratch where the caller
  // asked for none.
  FwdParams q = p;
  if (q.rstd == nullptr || (!q.rms && q.mean == nullptr)) {
    auto* st = static_cast<A*>(ws.alloc(ws.ctx, 2 * size_t(p.rows) * sizeof(A)));
    if (st == nullptr) return cudaErrorMemoryAllocation;
    if (!q.rms && q.mean == nullptr) q.mean = st;
    if (q.rstd == nullptr) q.rstd = st + p.rows;
  }
  const SplitShape s = split_shape(p.rows, p.cols, pl.vec);
  constexpr int V = 16 / sizeof(DT);
  auto* part = static_cast<acc2_t<A>*>(ws.alloc(ws.ctx, size_t(p.rows) * s.nchunks * sizeof(acc2_t<A>)));
  if (part == nullptr) return cudaErrorMemoryAllocation;
  const dim3 grid(unsigned(s.nchunks), unsigned(s.grid_rows)), block(kSplitThreads);
  cudaError_t e = s.vec > 1 ? launch(&fwd_split_stats_kernel<DT, V>, grid, block, 0, 1, stream, q, s.nchunks, part)
                            : launch(&fwd_split_stats_kernel<DT, 1>, grid, block, 0, 1, stream, q, s.nchunks, part);
  if (e == cudaSuccess)
    e = launch(&fwd_split_rowstat_kernel<A>, dim3(unsigned((p.rows + 255) / 256)), dim3(256), 0, 1, stream, q,
               (const acc2_t<A>*)part, s.nchunks, int64_t(kSplitThreads) * s.vec);
  if (e == cudaSuccess)
    e = s.vec > 1 ? launch(&fwd_split_apply_kernel<DT, DW, V>, grid, block, 0, 1, stream, q)
                  : launch(&fwd_split_apply_kernel<DT, DW, 1>, grid, block, 0, 1, stream, q);
  return e;
}

// A kernel's attributes, cached per kernel and device (devices of
// different architectures run different code).  Like resident_groups, it
// asks about the current device: the caller's device guard makes that dev.
struct KernelAttrs {
  size_t local_bytes = SIZE_MAX;  // local memory (spills) per thread
  int ptx_version = 0;            // the virtual architecture its code was compiled for, e.g. 90
};

template <typename K>
KernelAttrs kernel_attrs(K kernel, const DeviceInfo& dev) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, KernelAttrs> cache;
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), dev.index);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attr{};
  KernelAttrs a;
  if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
    a.local_bytes = attr.localSizeBytes;
    a.ptx_version = attr.ptxVersion;
  }
  cudaGetLastError();
  return cache[key] = a;
}

// The prefetch pipe keeps a second row in registers; its kernel is taken at
// the tightest cap of kPrefetchCaps that spills at most kPrefetchMaxSpill
// bytes a thread: a few bytes spilled outside the row loop cost little, more
// cost much (bf16 16 elements a thread ran far slower at 80 registers, 80
// bytes spilled, than at 96, 12 bytes; fp32 16 elements spill 188 bytes at 96
// registers and run far slower than at 128).
constexpr size_t kPrefetchMaxSpill = 16;
// A one-CTA row takes the prefetch pipe where the next rows' x and dy in
// flight come to at least this many bytes per SM, or where no staged pipe
// applies; else kStaged (bf16 rows that keep 32 KB or more in flight ran
// faster prefetching, 7168 at 28 KB slower).
constexpr int64_t kPrefetchMinInflight = 32 * 1024;

// Backward launch shape: the path, its grid and its scratch.
struct BwdShape {
  Plan plan;
  bool registers;      // register kernel; else the split-row kernels
  BwdVariant variant;  // register kernel
  int64_t grid;        // register kernel: CTAs
  int64_t nparts;      // dweight/dbias partial rows
  size_t dyn_smem;     // register kernel
  int vec;             // split: elements per access
  int64_t nchunks;     // split: column chunks per row
  int64_t sum_rows;    // split: grid rows of the sums kernel
  GroupKernelFn group_kernel;  // row groups (Plan::group): the kernel, nparts groups of plan.csize CTAs
};

// The register kernel's variant and its dynamic shared memory:
// - Rows of one CTA take the prefetch pipe (measured faster at 8 and at 16
//   elements a thread), except rows of 16 elements a thread whose prefetch
//   keeps less than kPrefetchMinInflight in flight: those take kStaged, the
//   row copied kBwdStages - 1 rows ahead into shared memory (level with or
//   ahead of prefetching and of kStagedReread at 80 registers there).
// - Rows of a cluster take the prefetch pipe where it keeps as many threads
//   per SM as kNone (fp32 12288, 4 x 384 threads), else the staged pipe (16
//   elements a thread) that keeps the most threads (bf16 12288, 2 x 384
//   threads, kStagedReread at 80), even where kNone keeps more: since cluster
//   sums are pushed, bf16 16384 (2 x 512, kStaged, one CTA an SM) runs well
//   ahead of kNone; with a cluster barrier a row it had lost.
// - One-CTA rows that no staged kernel fits prefetch after all; the rest (and
//   the scalar path) take kNone.
// - Before all of these, 16-bit rows of 16 elements a thread take
//   kStagedPair, two rows a reduction, wherever it fits, except rows of one
//   CTA whose prefetch pipe keeps more threads per SM (5120, two CTAs an SM,
//   ran faster prefetching); elsewhere kStagedPair beat kStaged,
//   kStagedReread and the prefetch pipe.  A reduction, and a cluster
//   exchange, then carries 64 bytes of each thread's x rather than 32, as
//   fp32's 16 elements do; 16-bit clusters of 32 elements a thread instead
//   (kStagedReread at 128 registers, its partials spilled) ran far slower.
template <typename DT, typename DW>
BwdVariant bwd_variant(const BwdParams& p, const Plan& pl, const DeviceInfo& dev, size_t* dyn_smem) {
  using A = dacc_t<DT>;
  const size_t part = (p.dw || p.db) ? size_t(bwd_partials_smem(pl.cta_threads, pl.nv, pl.vec, sizeof(A))) : 0;
  auto per_sm = [&](BwdVariant v, size_t smem) {  // threads resident per SM
    const int g = resident_groups(bwd_kernel_for<DT, DW>(pl, v), dev, pl.cta_threads, pl.csize, smem);
    return int64_t(g) * pl.csize * pl.cta_threads / dev.sm_count;
  };
  *dyn_smem = part;
  if (pl.vec == 1) return BwdVariant{};
  BwdVariant pf{BwdPipe::kPrefetch, 128};
  for (int cap : kPrefetchCaps)
    if (kernel_attrs(bwd_kernel_for<DT, DW>(pl, BwdVariant{BwdPipe::kPrefetch, cap}), dev).local_bytes <=
        kPrefetchMaxSpill) {
      pf.regs = cap;
      break;
    }
  const int64_t pf_threads = per_sm(pf, part), plain = per_sm(BwdVariant{}, part);
  const bool stageable = sizeof(DT) <= 4 && pl.rows_per_cta == 1 && pl.nv * pl.vec == 16;
  auto staged_smem = [&](BwdPipe pipe) {  // stage buffers, which the partials reuse
    const size_t st = size_t(bwd_stage_smem(kBwdStages, bwd_rows_per_sum(pipe), pl.cta_threads, pl.nv));
    return st > part ? st : part;
  };
  if (sizeof(DT) == 2 && stageable) {
    const BwdVariant v{BwdPipe::kStagedPair, 128};
    const size_t smem = staged_smem(v.pipe);
    const int64_t t = per_sm(v, smem);
    if (t > 0 && (pl.csize > 1 || pf_threads <= t)) {
      *dyn_smem = smem;
      return v;
    }
  }
  if (pf_threads > 0 && pl.csize == 1 && (!stageable || pf_threads * pl.nv * 32 >= kPrefetchMinInflight)) return pf;
  if (pf_threads > 0 && pl.csize > 1 && pf_threads >= plain) return pf;
  const BwdVariant fallback = pf_threads > 0 && pl.csize == 1 ? pf : BwdVariant{};
  if (!stageable) return fallback;
  const size_t smem = staged_smem(BwdPipe::kStaged);  // one row an iteration, as kStagedReread
  const BwdVariant cand[] = {{BwdPipe::kStaged, 128}, {BwdPipe::kStagedReread, 96}, {BwdPipe::kStagedReread, 80}};
  int64_t best = per_sm(cand[0], smem);
  int pick = 0;
  for (int i = 1; pl.csize > 1 && i < 3; ++i) {
    const int64_t t = per_sm(cand[i], smem);
    if (t > best) best = t, pick = i;
  }
  if (best == 0) return fallback;
  *dyn_smem = smem;
  return cand[pick];
}

// What bwd_shape asks of the runtime for a register plan (the variant, its
// shared memory, the CTAs or clusters resident at once) depends on the row
// layout, not on the number of rows: it is kept per layout and device, so a
// call makes one lookup, not a dozen (small shapes are bound by host time).
struct BwdLaunch {
  BwdVariant variant;
  size_t dyn_smem = 0;
  int resident = 0;
};

template <typename DT, typename DW>
BwdLaunch bwd_launch(const BwdParams& p, const Plan& pl, const DeviceInfo& dev) {
  static std::mutex mu;
  static std::map<std::array<int, 7>, BwdLaunch> cache;
  const std::array<int, 7> key{dev.index, pl.vec, pl.nv, pl.tpr, pl.csize, pl.cta_threads, p.dw || p.db};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  BwdLaunch l;
  l.variant = bwd_variant<DT, DW>(p, pl, dev, &l.dyn_smem);
  l.resident = resident_groups(bwd_kernel_for<DT, DW>(pl, l.variant), dev, pl.cta_threads, pl.csize, l.dyn_smem);
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(key, l).first->second;
}

template <typename T, typename W>
BwdShape bwd_shape(const BwdParams& p, const DeviceInfo& dev) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  using A = dacc_t<DT>;
  BwdShape s{};
  s.plan = make_plan(p.rows, p.cols, sizeof(DT), sizeof(A), bwd_vec_ok<DT, DW>(p), true, dev);
  const Plan& pl = s.plan;
  if constexpr (sizeof(DT) <= 4)
    if (pl.group) {
      const auto [kernel, ks] = bwd_group_kernel_for<DT, DW>();
      s.dyn_smem = size_t(bwd_stage_smem(ks.stages, 1, pl.cta_threads, pl.nv));
      const int64_t groups = group_count(kernel, pl, dev, s.dyn_smem, p.rows);
      if (groups > 0) {
        s.registers = true;
        s.group_kernel = kernel;
        s.nparts = groups;
        s.grid = groups * pl.csize;
        return s;
      }
    }
  if (!pl.group && use_register_kernel(pl, true)) {
    const BwdLaunch l = bwd_launch<DT, DW>(p, pl, dev);
    s.variant = l.variant;
    s.dyn_smem = l.dyn_smem;
    if (l.resident > 0) {
      s.registers = true;
      s.nparts = pl.groups < l.resident ? pl.groups : l.resident;
      s.grid = s.nparts * pl.csize;
      return s;
    }
  }
  s.registers = false;
  const SplitShape sp = split_shape(p.rows, p.cols, pl.vec);
  s.vec = sp.vec;
  s.nchunks = sp.nchunks;
  s.sum_rows = sp.grid_rows;
  // About eight 256-thread CTAs per SM in the dx pass; each grid row is one partial row.
  const int64_t want = (int64_t(dev.sm_count) * 8 + s.nchunks - 1) / s.nchunks;
  s.nparts = want < s.sum_rows ? want : s.sum_rows;
  if (s.nparts < 1) s.nparts = 1;
  return s;
}

// Workspace layout: [dweight partials][dbias partials] then, for the split
// path with dx, [chunk sums: rows x nchunks][row sums: rows] as (A, A) pairs.
template <typename A>
struct BwdWorkspace {
  A* part_w;
  A* part_b;
  acc2_t<A>* chunk_sums;
  acc2_t<A>* row_sums;
  GroupXchg xchg;  // row groups with dx: the slots, zeroed before the launch
};

template <typename A>
size_t bwd_workspace_layout(const BwdParams& p, const BwdShape& s, void* base, BwdWorkspace<A>* ws) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* ptr = base ? static_cast<char*>(base) + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return ptr;
  };
  const size_t part_bytes = size_t(s.nparts) * size_t(p.cols) * sizeof(A);
  BwdWorkspace<A> w{};
  if (p.dw) w.part_w = static_cast<A*>(take(part_bytes));
  if (p.db) w.part_b = static_cast<A*>(take(part_bytes));
  if (!s.registers && p.dx) {
    w.chunk_sums = static_cast<acc2_t<A>*>(take(size_t(p.rows) * s.nchunks * sizeof(acc2_t<A>)));
    w.row_sums = static_cast<acc2_t<A>*>(take(size_t(p.rows) * sizeof(acc2_t<A>)));
  }
  if (s.group_kernel && p.dx) {
    w.xchg.slots = static_cast<unsigned long long*>(take(group_xchg_bytes(s.nparts, s.plan.csize)));
  }
  if (ws) *ws = w;
  return off;
}

template <typename T, typename W>
cudaError_t norm_bwd(const BwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace scratch) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  using A = dacc_t<DT>;
  // One launch adds up (or, with no rows, zeroes) both weight gradients.  On
  // sm_90+ it is a programmatic dependent of the kernel that wrote the
  // partials: its CTAs are launched while that kernel drains, not after.
  // Only if its code was compiled for sm_90+ (not JIT-compiled from older
  // PTX), which is what makes it wait for that kernel.
  auto finalize = [&](const A* part_w, const A* part_b, int64_t nparts) {
    if (!p.dw && !p.db) return cudaSuccess;
    constexpr int FV = 16 / sizeof(A);
    const int vec = p.cols % FV == 0 ? FV : 1;
    auto* kernel = vec > 1 ? &finalize_kernel<DW, A, FV> : &finalize_kernel<DW, A, 1>;
    const bool dependent = nparts > 0 && dev.cc_major >= 9 && kernel_attrs(kernel, dev).ptx_version >= 90;
    const LaunchConfig lc(dim3(unsigned((p.cols + 32 * vec - 1) / (32 * vec)), 2), dim3(kFinWarps * 32), 0, 1,
                          stream, dependent);
    return launch_with(lc, kernel, part_w, part_b, nparts, p.cols, static_cast<DW*>(p.dw), static_cast<DW*>(p.db));
  };
  if (p.rows == 0) return finalize(nullptr, nullptr, 0);
  const BwdShape s = bwd_shape<T, W>(p, dev);
  const size_t bytes = bwd_workspace_layout<A>(p, s, nullptr, nullptr);
  void* base = bytes ? scratch.alloc(scratch.ctx, bytes) : nullptr;
  if (bytes && base == nullptr) return cudaErrorMemoryAllocation;
  BwdWorkspace<A> ws;
  bwd_workspace_layout<A>(p, s, base, &ws);
  cudaError_t e = cudaSuccess;
  if (s.group_kernel) {
    const Plan& pl = s.plan;
    if constexpr (std::is_same_v<A, float>)
      e = launch_groups(s.group_kernel, pl, s.nparts, s.dyn_smem, ws.xchg, stream, p,
                        GroupLayout{pl.cta_threads, pl.csize}, ws.part_w, ws.part_b, ws.xchg);
  } else if (s.registers) {
    const Plan& pl = s.plan;
    auto kernel = bwd_kernel_for<DT, DW>(pl, s.variant);
    e = launch(kernel, dim3(unsigned(s.grid)), dim3(pl.cta_threads), s.dyn_smem, pl.csize, stream, p,
               RowLayout{pl.tpr, pl.csize}, ws.part_w, ws.part_b);
  } else {
    const bool vec = s.vec > 1;
    constexpr int V = 16 / sizeof(DT);
    const dim3 block(kSplitThreads);
    if (p.dx) {
      const dim3 g1(unsigned(s.nchunks), unsigned(s.sum_rows));
      e = vec ? launch(&bwd_split_sums_kernel<DT, DW, V>, g1, block, 0, 1, stream, p, s.nchunks, ws.chunk_sums)
              : launch(&bwd_split_sums_kernel<DT, DW, 1>, g1, block, 0, 1, stream, p, s.nchunks, ws.chunk_sums);
      if (e == cudaSuccess)
        e = launch(&bwd_split_rowsum_kernel<A>, dim3(unsigned((p.rows + 255) / 256)), dim3(256), 0, 1, stream,
                   (const acc2_t<A>*)ws.chunk_sums, p.rows, s.nchunks, ws.row_sums);
    }
    const dim3 g3(unsigned(s.nchunks), unsigned(s.nparts));
    if (e == cudaSuccess)
      e = vec ? launch(&bwd_split_dx_kernel<DT, DW, V>, g3, block, 0, 1, stream, p, (const acc2_t<A>*)ws.row_sums, ws.part_w, ws.part_b)
              : launch(&bwd_split_dx_kernel<DT, DW, 1>, g3, block, 0, 1, stream, p, (const acc2_t<A>*)ws.row_sums, ws.part_w, ws.part_b);
  }
  return e == cudaSuccess ? finalize(ws.part_w, ws.part_b, s.nparts) : e;
}

}  // namespace fln::cuda
