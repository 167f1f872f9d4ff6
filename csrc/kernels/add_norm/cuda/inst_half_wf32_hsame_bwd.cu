// Explicit instantiation: bwd, x fln::Half, weight float, h fln::Half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t add_norm_bwd<fln::Half, float, fln::Half>(const AddNormBwdParams&, const DeviceInfo&, cudaStream_t, Workspace);
}  // namespace fln::cuda
