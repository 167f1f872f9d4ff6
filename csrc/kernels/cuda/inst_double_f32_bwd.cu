// Explicit instantiation: backward, input double, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_bwd_workspace_bytes<double, float>(const BwdParams&, const DeviceInfo&);
template cudaError_t norm_bwd<double, float>(const BwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
