// Explicit instantiation: q and k fln::Half, cos and sin fln::Half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t rope<fln::Half, fln::Half>(const RopeParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
