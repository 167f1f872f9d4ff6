// Explicit instantiation: softmax backward, float.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_bwd<float>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
