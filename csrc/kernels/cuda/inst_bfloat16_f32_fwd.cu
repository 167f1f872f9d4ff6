// Explicit instantiation: forward, input BFloat16, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<fln::BFloat16, float>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
