// CUDA backend: the framework-free CUDA launchers on the current stream of
// the input's device, with the workspace from PyTorch's caching allocator
// (so the ops are safe under CUDA-graph capture) and every launch checked.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/SmallVector.h>

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

// Scratch from the caching allocator (raw blocks, no tensors): stream-
// ordered, so it may be released once the work is enqueued, and safe under
// CUDA-graph capture.
struct Scratch {
  c10::SmallVector<at::DataPtr, 2> held;
  static void* alloc(void* ctx, size_t bytes) {
    auto* s = static_cast<Scratch*>(ctx);
    s->held.push_back(c10::cuda::CUDACachingAllocator::get()->allocate(bytes));
    return s->held.back().get();
  }
};

// Runs one launcher on the input's device and current stream, and checks it.
template <typename Launch>
void run(const Tensor& like, at::ScalarType xt, at::ScalarType wt, const char* what, Launch&& launch) {
  c10::cuda::CUDAGuard guard(like.device());
  const auto dev = device_info(like);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(dev.index);
  Scratch scratch;
  const fln::cuda::Workspace ws{&Scratch::alloc, &scratch};
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    const cudaError_t e = launch(t, w, dev, stream, ws);
    TORCH_CHECK(e == cudaSuccess, "fused_layernorm: ", what, " failed: ", cudaGetErrorString(e));
  });
}

void cuda_fwd(const FwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor& like) {
  run(like, xt, wt, "forward kernel launch", [&](auto t, auto w, const auto& dev, cudaStream_t s, auto ws) {
    return fln::cuda::norm_fwd<typename decltype(t)::type, typename decltype(w)::type>(p, dev, s, ws);
  });
}

void cuda_bwd(const BwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor& like) {
  run(like, xt, wt, "backward kernel launch", [&](auto t, auto w, const auto& dev, cudaStream_t s, auto ws) {
    return fln::cuda::norm_bwd<typename decltype(t)::type, typename decltype(w)::type>(p, dev, s, ws);
  });
}

}  // namespace

const Backend kCudaBackend{&cuda_fwd, &cuda_bwd};

}  // namespace fln::glue
