// Framework-free entry point of the rotary CUDA kernel: raw pointers in
// RopeParams, the device, a stream, a cudaError_t back.  T is q's and k's dtype (double,
// float, fln::Half, fln::BFloat16), C cos's and sin's (T or float).
// Instantiated in the inst_*.cu files.
#pragma once
#include <cuda_runtime_api.h>

#include "../../cuda/device_info.h"
#include "../params.h"

namespace fln::cuda {

template <typename T, typename C>
cudaError_t rope(const RopeParams& p, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace fln::cuda
