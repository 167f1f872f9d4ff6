// Explicit instantiation: backward, input float, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<float, float>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
