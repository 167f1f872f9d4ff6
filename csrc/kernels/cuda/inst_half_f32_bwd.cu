// Explicit instantiation: backward, input Half, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<fln::Half, float>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
