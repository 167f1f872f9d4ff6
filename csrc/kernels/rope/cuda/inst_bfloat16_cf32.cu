// Explicit instantiation: q and k fln::BFloat16, cos and sin float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t rope<fln::BFloat16, float>(const RopeParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
