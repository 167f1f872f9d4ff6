// Explicit instantiation: bwd, x float, weight float, h float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_bwd<float, float, float>(const AddNormBwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
