// Launching the register kernels of every op: a launch configuration
// (clusters, programmatic serialization, cooperative CTAs), one launch path
// that reports the launch's error, and the occupancy query the launch rules
// size persistent grids by.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "common.cuh"
#include "device_info.h"

namespace fln::cuda {

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// A launch configuration, with the cluster attribute when csize > 1, and
// the programmatic-serialization attribute when `dependent` (the kernel may
// start before the previous kernel on the stream ends, and waits for it with
// wait_for_primary_grid(); sm_90+), and the cooperative attribute when
// `cooperative` (CTAs that wait on each other: the row groups, group_xchg.cuh).
struct LaunchConfig {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[3];
  LaunchConfig(dim3 grid, dim3 block, size_t smem, int csize, cudaStream_t stream, bool dependent = false,
               bool cooperative = false) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (csize > 1) {
      cudaLaunchAttribute& a = attr[cfg.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = unsigned(csize);
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
    }
    if (dependent) {
      cudaLaunchAttribute& a = attr[cfg.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    if (cooperative) {  // every CTA resident at once, or the launch fails
      cudaLaunchAttribute& a = attr[cfg.numAttrs++];
      a.id = cudaLaunchAttributeCooperative;
      a.val.cooperative = 1;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;  // cfg.attrs points into this object
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// One launch path for plain and cluster launches.  A kernel that needs
// dynamic shared memory or a cluster of more than 8 CTAs has been configured
// by resident_groups() first, once per device.
template <typename... KArgs, typename... Args>
cudaError_t launch_with(const LaunchConfig& lc, void (*kernel)(KArgs...), Args... args) {
  const cudaError_t e = cudaLaunchKernelEx(&lc.cfg, kernel, args...);
  const cudaError_t last = cudaGetLastError();  // also clears a failed launch's error
  return e != cudaSuccess ? e : last;
}

template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, int csize,
                   cudaStream_t stream, Args... args) {
  return launch_with(LaunchConfig(grid, block, smem, csize, stream), kernel, args...);
}

// Row groups (CTAs, or clusters) that fit on the device at once, cached per
// kernel, device and shape of launch.  0 means the launch cannot fit at all.
// On the first query it also sets the kernel attributes such a launch needs
// (they persist on the device), so launches do no attribute calls.  A query
// that fails (an error left by other work, say) is not cached: the next
// launch asks again rather than falling back for the process's life.
// `row_groups`: a kernel that trades through global memory (common.cuh's row
// groups), which fits nowhere if built from PTX older than sm_70.
template <typename K>
int resident_groups(K kernel, const DeviceInfo& dev, int cta_threads, int csize, size_t smem,
                    bool row_groups = false) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int, size_t, bool>, int> cache;
  static std::map<std::pair<const void*, int>, size_t> smem_limit;  // per kernel and device
  const void* fn = reinterpret_cast<const void*>(kernel);
  const auto key = std::make_tuple(fn, dev.index, cta_threads, csize, smem, row_groups);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int groups = 0;
  bool ok = true, answered = true;
  // The dynamic shared memory limit, raised to the largest launch of this
  // kernel so far (never lowered: launches cached earlier rely on it).  It
  // is set whenever dynamic memory is used, since dynamic plus static memory
  // may not pass 48 KB without it: a backward CTA of 384 bf16 threads has
  // exactly 48 KB of partials plus the reducer's buffer, and used to fall to
  // the split path unnoticed.
  size_t& limit = smem_limit[std::make_pair(fn, dev.index)];
  if (smem > limit) {
    ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) == cudaSuccess;
    if (ok) limit = smem;
  }
  if (ok && csize > 1) ok = built_for_clusters(fn);
  if (ok && row_groups) ok = built_for_groups(fn);
  if (ok && csize > 8)  // 16-CTA clusters are "non-portable" and must be enabled per kernel
    ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  if (ok && csize == 1) {
    int per_sm = 0;
    answered = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cta_threads, smem) == cudaSuccess;
    groups = answered ? per_sm * dev.sm_count : 0;
  } else if (ok) {
    const LaunchConfig lc(dim3(unsigned(csize)), dim3(unsigned(cta_threads)), smem, csize, nullptr);
    answered = cudaOccupancyMaxActiveClusters(&groups, kernel, &lc.cfg) == cudaSuccess;
    if (!answered) groups = 0;
  }
  cudaGetLastError();  // a failed query must not leak into the next launch check
  if (answered) cache[key] = groups;
  return groups;
}

}  // namespace fln::cuda
