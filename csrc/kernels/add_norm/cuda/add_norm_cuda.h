// Framework-free entry points of the fused pre-norm CUDA kernels: raw
// pointers in AddNormFwdParams / AddNormBwdParams, a stream, a cudaError_t
// back.  T is x's dtype, W the weight's (T or float), R h's and the
// residual's (T or float).  Instantiated in the inst_*.cu files.
#pragma once
#include <cuda_runtime_api.h>

#include "../../cuda/norm_cuda.h"
#include "../params.h"

namespace fln::cuda {

template <typename T, typename W, typename R>
cudaError_t add_norm_fwd(const AddNormFwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace ws);

template <typename T, typename W, typename R>
cudaError_t add_norm_bwd(const AddNormBwdParams& p, const DeviceInfo& dev, cudaStream_t stream, Workspace ws);

}  // namespace fln::cuda
