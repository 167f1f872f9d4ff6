// Explicit instantiation: q and k float, cos and sin float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t rope<float, float>(const RopeParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
