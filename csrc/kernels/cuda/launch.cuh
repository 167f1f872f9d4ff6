// Launchers: turn a Plan into a kernel instantiation, a grid and a launch on
// the caller's stream.  Included only by the inst_*.cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "bwd_kernel.cuh"
#include "fallback_kernels.cuh"
#include "fwd_kernel.cuh"
#include "launch_plan.h"
#include "norm_cuda.h"

namespace fln::cuda {

static_assert(kMaxCta == kMaxCtaThreads, "launch_plan.h and the kernels' launch bounds must agree");

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

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

// One launch path for plain and cluster launches.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, int csize,
                   cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  if (smem > 48 * 1024) {  // above the default dynamic shared memory limit
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  cudaLaunchAttribute attr[1];
  if (csize > 1) {
    if (csize > 8) {  // 16-CTA clusters are "non-portable" and must be enabled per kernel
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (e != cudaSuccess) return e;
    }
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(csize);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Row groups (CTAs, or clusters) that fit on the device at once, cached per
// kernel, device and shape of launch.  0 means the launch cannot fit at all.
template <typename K>
int resident_groups(K kernel, const DeviceInfo& dev, int cta_threads, int csize, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int, size_t>, int> cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), dev.index, cta_threads, csize, smem);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int groups = 0;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (csize == 1) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cta_threads, smem) != cudaSuccess) per_sm = 0;
    groups = per_sm * dev.sm_count;
  } else {
    if (csize > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(csize));
    cfg.blockDim = dim3(unsigned(cta_threads));
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(csize);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&groups, kernel, &cfg) != cudaSuccess) groups = 0;
  }
  cudaGetLastError();  // a failed query must not leak into the next launch check
  std::lock_guard<std::mutex> lock(mu);
  cache[key] = groups;
  return groups;
}

// Instantiation chooser: the kernel holding NV accesses of VEC for the
// smallest power of two NV >= nv that the register budget allows.
// The forward kernel and its dynamic shared memory for a CTA of cta_threads.
template <typename DT>
struct FwdKernel {
  void (*fn)(FwdParams, RowLayout);
  size_t smem;
};

template <typename DT, typename DW, int VEC, int NV = 1>
FwdKernel<DT> pick_fwd(int nv, int cta_threads) {
  if constexpr (NV >= max_accesses(false, VEC, sizeof(DT))) {
    return {&norm_fwd_kernel<DT, DW, VEC, NV>, fwd_smem_bytes<DT, VEC, NV>(cta_threads)};
  } else {
    if (nv <= NV) return {&norm_fwd_kernel<DT, DW, VEC, NV>, fwd_smem_bytes<DT, VEC, NV>(cta_threads)};
    return pick_fwd<DT, DW, VEC, NV * 2>(nv, cta_threads);
  }
}

template <typename DT, typename DW, int VEC, int NV = 1>
auto pick_bwd(int nv) -> void (*)(BwdParams, RowLayout, dacc_t<DT>*, dacc_t<DT>*) {
  if constexpr (NV >= max_accesses(true, VEC, sizeof(DT))) {
    return &norm_bwd_kernel<DT, DW, VEC, NV>;
  } else {
    return nv <= NV ? &norm_bwd_kernel<DT, DW, VEC, NV> : pick_bwd<DT, DW, VEC, NV * 2>(nv);
  }
}

// FLN_FWD_PREFETCH=0 turns the forward prefetch off, to measure what it buys.
inline bool fwd_prefetch_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FLN_FWD_PREFETCH");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

template <typename T, typename W>
Plan fwd_plan(const FwdParams& p, const DeviceInfo& dev) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  return make_plan(p.rows, p.cols, sizeof(DT), sizeof(dacc_t<DT>), fwd_vec_ok<DT, DW>(p), false, dev);
}

template <typename T, typename W>
cudaError_t norm_fwd(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  if (p.rows == 0) return cudaSuccess;
  Plan pl = fwd_plan<T, W>(p, dev);
  if (pl.registers) {
    const FwdKernel<DT> k = pl.vec > 1 ? pick_fwd<DT, DW, 16 / sizeof(DT)>(pl.nv, pl.cta_threads)
                                       : pick_fwd<DT, DW, 1>(pl.nv, pl.cta_threads);
    // Persistent grid: as many row groups as fit on the device at once.
    const int resident = resident_groups(k.fn, dev, pl.cta_threads, pl.csize, k.smem);
    if (resident > 0) {
      const int64_t groups = pl.groups < resident ? pl.groups : resident;
      return launch(k.fn, dim3(unsigned(groups * pl.csize)), dim3(pl.cta_threads), k.smem, pl.csize, stream, p,
                    RowLayout{pl.tpr, pl.csize, fwd_prefetch_enabled()});
    }
  }
  const int64_t grid = p.rows < int64_t(dev.sm_count) * 4 ? p.rows : int64_t(dev.sm_count) * 4;
  return launch(&norm_fwd_looped_kernel<DT, DW>, dim3(unsigned(grid)), dim3(512), 0, 1, stream, p);
}

// Backward launch shape, shared by the workspace query and the launch.
struct BwdShape {
  Plan plan;
  bool registers;
  int64_t grid;        // CTAs
  int64_t nparts;      // partial rows
  int64_t chunk_rows;  // fallback: rows per partial row
  size_t dyn_smem;
};

template <typename T, typename W>
BwdShape bwd_shape(const BwdParams& p, const DeviceInfo& dev) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  using A = dacc_t<DT>;
  BwdShape s{};
  s.plan = make_plan(p.rows, p.cols, sizeof(DT), sizeof(A), bwd_vec_ok<DT, DW>(p), true, dev);
  const Plan& pl = s.plan;
  if (pl.registers) {
    auto kernel = pl.vec > 1 ? pick_bwd<DT, DW, 16 / sizeof(DT)>(pl.nv) : pick_bwd<DT, DW, 1>(pl.nv);
    s.dyn_smem = (p.dw || p.db) ? size_t(bwd_partials_smem(pl.cta_threads, pl.nv, pl.vec, sizeof(A))) : 0;
    const int resident = resident_groups(kernel, dev, pl.cta_threads, pl.csize, s.dyn_smem);
    if (resident > 0) {
      s.registers = true;
      s.nparts = pl.groups < resident ? pl.groups : resident;
      s.grid = s.nparts * pl.csize;
      return s;
    }
  }
  s.registers = false;
  s.chunk_rows = p.rows / 256 > 32 ? (p.rows + 255) / 256 : 32;
  s.nparts = (p.rows + s.chunk_rows - 1) / s.chunk_rows;
  s.grid = p.rows < int64_t(dev.sm_count) * 4 ? p.rows : int64_t(dev.sm_count) * 4;
  return s;
}

template <typename T, typename W>
size_t norm_bwd_workspace_bytes(const BwdParams& p, const DeviceInfo& dev) {
  const int outs = (p.dw ? 1 : 0) + (p.db ? 1 : 0);
  if (outs == 0 || p.rows == 0) return 0;
  return size_t(bwd_shape<T, W>(p, dev).nparts) * size_t(p.cols) * sizeof(dacc_t<device_t<T>>) * outs;
}

template <typename T, typename W>
cudaError_t norm_bwd(const BwdParams& p, void* workspace, const DeviceInfo& dev, cudaStream_t stream) {
  using DT = device_t<T>;
  using DW = device_t<W>;
  using A = dacc_t<DT>;
  const dim3 fin_block(32, 32);
  const dim3 fin_grid(unsigned((p.cols + 31) / 32));
  if (p.rows == 0) {  // empty sums: zero weight gradients
    cudaError_t e = cudaSuccess;
    if (p.dw) e = launch(&finalize_kernel<DW, A>, fin_grid, fin_block, 0, 1, stream, (const A*)nullptr, int64_t(0), p.cols, static_cast<DW*>(p.dw));
    if (e == cudaSuccess && p.db) e = launch(&finalize_kernel<DW, A>, fin_grid, fin_block, 0, 1, stream, (const A*)nullptr, int64_t(0), p.cols, static_cast<DW*>(p.db));
    return e;
  }
  const BwdShape s = bwd_shape<T, W>(p, dev);
  A* part_w = p.dw ? static_cast<A*>(workspace) : nullptr;
  A* part_b = p.db ? static_cast<A*>(workspace) + (p.dw ? s.nparts * p.cols : 0) : nullptr;
  cudaError_t e;
  if (s.registers) {
    const Plan& pl = s.plan;
    auto kernel = pl.vec > 1 ? pick_bwd<DT, DW, 16 / sizeof(DT)>(pl.nv) : pick_bwd<DT, DW, 1>(pl.nv);
    e = launch(kernel, dim3(unsigned(s.grid)), dim3(pl.cta_threads), s.dyn_smem, pl.csize, stream, p, RowLayout{pl.tpr, pl.csize},
               part_w, part_b);
  } else {
    e = cudaSuccess;
    if (p.dx) e = launch(&norm_bwd_dx_looped_kernel<DT, DW>, dim3(unsigned(s.grid)), dim3(512), 0, 1, stream, p);
    if (e == cudaSuccess && (part_w || part_b))
      e = launch(&norm_bwd_dw_columns_kernel<DT>, dim3(unsigned((p.cols + 31) / 32), unsigned(s.nparts)), dim3(32, 32), 0, 1, stream, p, s.chunk_rows, part_w, part_b);
  }
  if (e == cudaSuccess && p.dw) e = launch(&finalize_kernel<DW, A>, fin_grid, fin_block, 0, 1, stream, (const A*)part_w, s.nparts, p.cols, static_cast<DW*>(p.dw));
  if (e == cudaSuccess && p.db) e = launch(&finalize_kernel<DW, A>, fin_grid, fin_block, 0, 1, stream, (const A*)part_b, s.nparts, p.cols, static_cast<DW*>(p.db));
  return e;
}

}  // namespace fln::cuda
