// Explicit instantiation: backward, input BFloat16, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<fln::BFloat16, float>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
