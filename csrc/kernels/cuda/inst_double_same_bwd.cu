// Explicit instantiation: backward, input double, weight double.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_bwd_workspace_bytes<double, double>(const BwdParams&, const DeviceInfo&);
template cudaError_t norm_bwd<double, double>(const BwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
