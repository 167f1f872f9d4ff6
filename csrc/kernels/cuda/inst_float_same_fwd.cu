// Explicit instantiation: forward, input float, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_fwd_workspace_bytes<float, float>(const FwdParams&, const DeviceInfo&);
template cudaError_t norm_fwd<float, float>(const FwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
