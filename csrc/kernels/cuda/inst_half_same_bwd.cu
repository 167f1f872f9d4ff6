// Explicit instantiation: backward, input Half, weight Half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t norm_bwd<fln::Half, fln::Half>(const BwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
