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

// Scratch bytes norm_fwd needs (0 unless the row is split across CTAs).
template <typename T, typename W>
size_t norm_fwd_workspace_bytes(const FwdParams& p, const DeviceInfo& dev);

template <typename T, typename W>
cudaError_t norm_fwd(const FwdParams& p, void* workspace, const DeviceInfo& dev, cudaStream_t stream);

// Scratch bytes norm_bwd needs for its dweight/dbias partials (0 if none).
template <typename T, typename W>
size_t norm_bwd_workspace_bytes(const BwdParams& p, const DeviceInfo& dev);

template <typename T, typename W>
cudaError_t norm_bwd(const BwdParams& p, void* workspace, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace fln::cuda
