// Explicit instantiation: backward, input float, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_bwd_workspace_bytes<float, float>(const BwdParams&, const DeviceInfo&);
template cudaError_t norm_bwd<float, float>(const BwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
