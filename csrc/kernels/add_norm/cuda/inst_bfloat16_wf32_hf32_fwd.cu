// Explicit instantiation: fwd, x fln::BFloat16, weight float, h float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<fln::BFloat16, float, float>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
