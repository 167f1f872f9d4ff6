// Explicit instantiation: forward, input float, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<float, float>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
