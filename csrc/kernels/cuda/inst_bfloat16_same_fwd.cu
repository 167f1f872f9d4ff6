// Explicit instantiation: forward, input BFloat16, weight BFloat16.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_fwd_workspace_bytes<fln::BFloat16, fln::BFloat16>(const FwdParams&, const DeviceInfo&);
template cudaError_t norm_fwd<fln::BFloat16, fln::BFloat16>(const FwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
