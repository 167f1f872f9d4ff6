// Explicit instantiation: bwd, x fln::BFloat16, weight fln::BFloat16, h float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_bwd<fln::BFloat16, fln::BFloat16, float>(const AddNormBwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
