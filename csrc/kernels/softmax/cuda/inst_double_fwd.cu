// Explicit instantiation: softmax forward, double.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_fwd<double>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
