// Explicit instantiation: forward, input Half, weight Half.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_fwd_workspace_bytes<fln::Half, fln::Half>(const FwdParams&, const DeviceInfo&);
template cudaError_t norm_fwd<fln::Half, fln::Half>(const FwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
