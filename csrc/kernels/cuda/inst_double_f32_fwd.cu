// Explicit instantiation: forward, input double, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_fwd_workspace_bytes<double, float>(const FwdParams&, const DeviceInfo&);
template cudaError_t norm_fwd<double, float>(const FwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
