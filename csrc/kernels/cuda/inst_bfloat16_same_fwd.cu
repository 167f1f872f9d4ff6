// Explicit instantiation: forward, input BFloat16, weight BFloat16.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<fln::BFloat16, fln::BFloat16>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
