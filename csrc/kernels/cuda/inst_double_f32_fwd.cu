// Explicit instantiation: forward, input double, weight float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<double, float>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
