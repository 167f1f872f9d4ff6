// Explicit instantiation: q and k fln::Half, cos and sin float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t rope<fln::Half, float>(const RopeParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
