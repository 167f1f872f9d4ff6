// Explicit instantiation: q and k double, cos and sin double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t rope<double, double>(const RopeParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
