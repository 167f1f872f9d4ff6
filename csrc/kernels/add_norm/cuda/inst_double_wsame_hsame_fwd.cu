// Explicit instantiation: fwd, x double, weight double, h double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<double, double, double>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
