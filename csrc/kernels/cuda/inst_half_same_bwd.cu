// Explicit instantiation: backward, input Half, weight Half.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_bwd_workspace_bytes<fln::Half, fln::Half>(const BwdParams&, const DeviceInfo&);
template cudaError_t norm_bwd<fln::Half, fln::Half>(const BwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
