// Explicit instantiation: forward, input Half, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_fwd_workspace_bytes<fln::Half, float>(const FwdParams&, const DeviceInfo&);
template cudaError_t norm_fwd<fln::Half, float>(const FwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
