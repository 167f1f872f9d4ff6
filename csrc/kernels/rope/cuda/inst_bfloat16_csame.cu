// Explicit instantiation: q and k fln::BFloat16, cos and sin fln::BFloat16.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t rope<fln::BFloat16, fln::BFloat16>(const RopeParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
