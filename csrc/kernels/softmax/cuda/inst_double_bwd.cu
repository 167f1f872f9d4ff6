// Explicit instantiation: softmax backward, double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_bwd<double>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
