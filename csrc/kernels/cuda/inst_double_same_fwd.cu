// Explicit instantiation: forward, input double, weight double.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_fwd_workspace_bytes<double, double>(const FwdParams&, const DeviceInfo&);
template cudaError_t norm_fwd<double, double>(const FwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
