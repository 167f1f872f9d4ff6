// CUDA backend: the framework-free CUDA launchers on the current stream of
// the input's device, with the workspace from PyTorch's caching allocator
// (so the ops are safe under CUDA-graph capture) and every launch checked.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/SmallVector.h>

#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <mutex>
#include <vector>

#include "../kernels/add_norm/cuda/add_norm_cuda.h"
#include "../kernels/cuda/norm_cuda.h"
#include "../kernels/rope/cuda/rope_cuda.h"
#include "../kernels/softmax/cuda/softmax_cuda.h"
#include "add_norm_ops.h"
#include "dispatch.h"
#include "norm_ops.h"
#include "rope_ops.h"
#include "softmax_ops.h"

namespace fln::glue {

namespace {

// Peak DRAM bytes a microsecond, 2 x memory clock x bus width (double data
// rate), read once per device; 0 (not cached: asked again) where the query
// fails.  Under MIG these are the whole GPU's while sm_count is the slice's.
int64_t dram_bytes_per_us(int device, int bus_bits) {
  static std::mutex mu;
  static std::vector<int64_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= int(cache.size())) cache.resize(device + 1, -1);
  if (cache[device] < 0) {
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cache[device] = int64_t(2) * khz * bus_bits / 8 / 1000;
  }
  return cache[device];
}

fln::cuda::DeviceInfo device_info(const Tensor& like) {
  const auto* props = at::cuda::getDeviceProperties(like.get_device());
  fln::cuda::DeviceInfo d;
  d.index = like.get_device();
  d.sm_count = props->multiProcessorCount;
  d.cc_major = props->major;
  d.dram_bytes_per_us = dram_bytes_per_us(d.index, props->memoryBusWidth);
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

// Runs one launcher on the input's device and current stream, and checks
// it; `dispatch` calls it with the kernels' storage types.
template <typename Dispatch, typename Launch>
void run_with(const Tensor& like, const char* what, Dispatch&& dispatch, Launch&& launch) {
  c10::cuda::CUDAGuard guard(like.device());
  const auto dev = device_info(like);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(dev.index);
  Scratch scratch;
  const fln::cuda::Workspace ws{&Scratch::alloc, &scratch};
  dispatch([&](auto... types) {
    const cudaError_t e = launch(types..., dev, stream, ws);
    TORCH_CHECK(e == cudaSuccess, "fused_layernorm: ", what, " failed: ", cudaGetErrorString(e));
  });
}

template <typename Launch>
void run(const Tensor& like, at::ScalarType xt, at::ScalarType wt, const char* what, Launch&& launch) {
  run_with(like, what, [&](auto&& f) { dispatch_norm_types(xt, wt, f); }, launch);
}

// (x, weight, h) dtypes: h has x's dtype or float32.
template <typename Launch>
void run3(const Tensor& like, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt, const char* what,
          Launch&& launch) {
  run_with(like, what, [&](auto&& f) { dispatch_add_norm_types(xt, wt, rt, f); }, launch);
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

template <typename X> using type_of = typename X::type;

void cuda_add_norm_fwd(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt,
                       const Tensor& like) {
  run3(like, xt, wt, rt, "fused forward kernel launch", [&](auto t, auto w, auto r, const auto& dev, cudaStream_t s,
                                                            auto ws) {
    using T = type_of<decltype(t)>;
    using R = type_of<decltype(r)>;
    if constexpr (std::is_same_v<T, double> && !std::is_same_v<R, double>) return cudaErrorNotSupported;
    else return fln::cuda::add_norm_fwd<T, type_of<decltype(w)>, R>(p, dev, s, ws);
  });
}

void cuda_add_norm_bwd(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt,
                       const Tensor& like) {
  run3(like, xt, wt, rt, "fused backward kernel launch", [&](auto t, auto w, auto r, const auto& dev,
                                                             cudaStream_t s, auto ws) {
    using T = type_of<decltype(t)>;
    using R = type_of<decltype(r)>;
    if constexpr (std::is_same_v<T, double> && !std::is_same_v<R, double>) return cudaErrorNotSupported;
    else return fln::cuda::add_norm_bwd<T, type_of<decltype(w)>, R>(p, dev, s, ws);
  });
}

// cos/sin: q's dtype or float32 (for 16-bit q), as a norm's weight.
void cuda_rope(const RopeParams& p, at::ScalarType t, at::ScalarType c, const Tensor& like) {
  run(like, t, c, "rotary kernel launch", [&](auto tt, auto ct, const auto& dev, cudaStream_t s, auto) {
    using T = type_of<decltype(tt)>;
    using C = type_of<decltype(ct)>;
    if constexpr (std::is_same_v<T, double> && !std::is_same_v<C, double>) return cudaErrorNotSupported;
    else return fln::cuda::rope<T, C>(p, dev, s);
  });
}

void cuda_softmax(const SoftmaxParams& p, at::ScalarType t, const Tensor& like) {
  run(like, t, t, p.backward ? "softmax backward kernel launch" : "softmax kernel launch",
      [&](auto tt, auto, const auto& dev, cudaStream_t s, auto) {
        return fln::cuda::softmax<type_of<decltype(tt)>>(p, dev, s);
      });
}

// torch's CUDA generator: a seed and offset, or (under graph capture) the
// device pointers the captured graph reads them from.  4 draws a call
// (philox.h).
DropoutRng cuda_draw(const OptGenerator& gen, const Tensor& like) {
  auto* g = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      gen, at::cuda::detail::getDefaultCUDAGenerator(like.get_device()));
  at::PhiloxCudaState st;
  {
    std::lock_guard<std::mutex> lock(g->mutex_);
    st = g->philox_cuda_state(4);
  }
  DropoutRng r;
  if (st.captured_) {
    r.seed_ptr = st.seed_.ptr;
    r.offset_ptr = st.offset_.ptr;
    r.offset_extra = st.offset_intragraph_;
  } else {
    r.seed = st.seed_.val;
    r.offset = st.offset_.val;
  }
  return r;
}

}  // namespace

const Backend kCudaBackend{&cuda_fwd, &cuda_bwd};
const AddNormBackend kCudaAddNorm{&cuda_add_norm_fwd, &cuda_add_norm_bwd, &cuda_draw};
const RopeBackend kCudaRope{&cuda_rope};
const SoftmaxBackend kCudaSoftmax{&cuda_softmax};

}  // namespace fln::glue
