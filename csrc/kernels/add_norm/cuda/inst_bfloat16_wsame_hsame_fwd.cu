// Explicit instantiation: fwd, x fln::BFloat16, weight fln::BFloat16, h fln::BFloat16.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<fln::BFloat16, fln::BFloat16, fln::BFloat16>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
