// Explicit instantiation: backward, input Half, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_bwd_workspace_bytes<fln::Half, float>(const BwdParams&, const DeviceInfo&);
template cudaError_t norm_bwd<fln::Half, float>(const BwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
