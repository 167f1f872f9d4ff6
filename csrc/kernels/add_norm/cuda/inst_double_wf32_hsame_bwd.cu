// Explicit instantiation: bwd, x double, weight float, h double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_bwd<double, float, double>(const AddNormBwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
