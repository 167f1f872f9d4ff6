// Framework-free entry points of the CUDA kernels: raw pointers in
// FwdParams / BwdParams, a stream, a cudaError_t back.  T is the input dtype
// (double, float, fln::Half, fln::BFloat16); W the weight dtype (T or float).
// Explicitly instantiated in the inst_*.cu files.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "../params.h"
#include "launch_plan.h"

namespace fln::cuda {

// Scratch memory for the launchers: alloc(ctx, bytes) returns device memory
// that stays valid for the work enqueued on the stream (a stream-ordered
// caching allocator, say), or nullptr on failure.
struct Workspace {
  void* (*alloc)(void* ctx, size_t bytes);
  void* ctx;
};

template <typename T, typename W>
cudaError_t norm_fwd(const FwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace ws);

template <typename T, typename W>
cudaError_t norm_bwd(const BwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace ws);

}  // namespace fln::cuda
