// Explicit instantiation: backward, input BFloat16, weight float.
#include "launch.cuh"

namespace fln::cuda {
template size_t norm_bwd_workspace_bytes<fln::BFloat16, float>(const BwdParams&, const DeviceInfo&);
template cudaError_t norm_bwd<fln::BFloat16, float>(const BwdParams&, void*, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
