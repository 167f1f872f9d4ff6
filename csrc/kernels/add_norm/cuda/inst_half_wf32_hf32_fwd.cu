// Explicit instantiation: fwd, x fln::Half, weight float, h float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<fln::Half, float, float>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
