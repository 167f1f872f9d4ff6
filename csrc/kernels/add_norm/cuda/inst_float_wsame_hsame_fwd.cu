// Explicit instantiation: fwd, x float, weight float, h float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<float, float, float>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
