// Explicit instantiation: fwd, x fln::Half, weight float, h fln::Half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_fwd<fln::Half, float, fln::Half>(const AddNormFwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
