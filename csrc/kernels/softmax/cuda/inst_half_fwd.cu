// Explicit instantiation: softmax forward, half.
#include "launch.cuh"

namespace fln::cuda {
template cudaError_t softmax_fwd<fln::Half>(const SoftmaxParams&, const DeviceInfo&, cudaStream_t);
}  // namespace fln::cuda
