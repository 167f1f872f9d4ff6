// Explicit instantiation: fwd, x double, weight float, h double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<double, float, double>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
