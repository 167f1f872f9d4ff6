// Explicit instantiation: backward, input BFloat16, weight BFloat16.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<fln::BFloat16, fln::BFloat16>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
