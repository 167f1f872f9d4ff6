// Explicit instantiation: forward, input Half, weight Half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_fwd<fln::Half, fln::Half>(const FwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
