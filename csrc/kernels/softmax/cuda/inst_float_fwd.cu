// Explicit instantiation: softmax forward, float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_fwd<float>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
