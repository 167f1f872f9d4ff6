// Explicit instantiation: softmax backward, bfloat16.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_bwd<fln::BFloat16>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
