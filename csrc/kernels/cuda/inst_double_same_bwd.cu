// Explicit instantiation: backward, input double, weight double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<double, double>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
