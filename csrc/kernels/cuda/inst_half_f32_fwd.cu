// Explicit instantiation: forward, input Half, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<fln::Half, float>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
