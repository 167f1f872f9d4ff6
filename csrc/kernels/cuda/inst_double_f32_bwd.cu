// Explicit instantiation: backward, input double, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<double, float>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
