// CUDA backend: the framework-free CUDA launchers on the current stream of
// the input's device, with the workspace from PyTorch's caching allocator
// (so the ops are safe under CUDA-graph capture) and every launch checked.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../kernels/cuda/norm_cuda.h"
#include "dispatch.h"
#include "norm_ops.h"

namespace fln::glue {

namespace {

fln::cuda::DeviceInfo device_info(const Tensor& like) {
  const auto* props = at::cuda::getDeviceProperties(like.get_device());
  fln::cuda::DeviceInfo d;
  d.index = like.get_device();
  d.sm_count = props->multiProcessorCount;
  d.cc_major = props->major;
  return d;
}

void check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "fused_layernorm: ", what, " failed: ", cudaGetErrorString(e));
}

void cuda_fwd(const FwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor& like) {
  c10::cuda::CUDAGuard guard(like.device());
  const auto dev = device_info(like);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(dev.index);
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    using T = typename decltype(t)::type;
    using W = typename decltype(w)::type;
    const size_t bytes = fln::cuda::norm_fwd_workspace_bytes<T, W>(p, dev);
    Tensor ws = bytes ? at::empty({int64_t(bytes)}, like.options().dtype(at::kByte)) : Tensor();
    check(fln::cuda::norm_fwd<T, W>(p, bytes ? ws.mutable_data_ptr() : nullptr, dev, stream),
          "forward kernel launch");
  });
}

void cuda_bwd(const BwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor& like) {
  c10::cuda::CUDAGuard guard(like.device());
  const auto dev = device_info(like);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(dev.index);
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    using T = typename decltype(t)::type;
    using W = typename decltype(w)::type;
    const size_t bytes = fln::cuda::norm_bwd_workspace_bytes<T, W>(p, dev);
    Tensor ws = bytes ? at::empty({int64_t(bytes)}, like.options().dtype(at::kByte)) : Tensor();
    check(fln::cuda::norm_bwd<T, W>(p, bytes ? ws.mutable_data_ptr() : nullptr, dev, stream),
          "backward kernel launch");
  });
}

}  // namespace

const Backend kCudaBackend{&cuda_fwd, &cuda_bwd};

}  // namespace fln::glue
