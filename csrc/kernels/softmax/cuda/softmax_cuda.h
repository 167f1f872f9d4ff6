// Framework-free entry points of the softmax CUDA kernels: raw pointers in
// SoftmaxParams, a stream, a cudaError_t back.  T is the dtype (double,
// float, fln::Half, fln::BFloat16).  Instantiated in the inst_*.cu files,
// one a dtype and direction.
#pragma once
#include <cuda_runtime_api.h>

#include "../../cuda/device_info.h"
#include "../params.h"

namespace fln::cuda {

template <typename T>
cudaError_t softmax_fwd(const SoftmaxParams& p, const DeviceInfo& dev, cudaStream_t stream);

template <typename T>
cudaError_t softmax_bwd(const SoftmaxParams& p, const DeviceInfo& dev, cudaStream_t stream);

template <typename T>
cudaError_t softmax(const SoftmaxParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  return p.backward ? softmax_bwd<T>(p, dev, stream) : softmax_fwd<T>(p, dev, stream);
}

}  // namespace fln::cuda
