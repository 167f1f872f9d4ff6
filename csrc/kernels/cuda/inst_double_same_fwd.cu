// Explicit instantiation: forward, input double, weight double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<double, double>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
