// Explicit instantiation: softmax backward, half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_bwd<fln::Half>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
