// The softmax op: softmax and log-softmax over the last dim, with an
// optional scale and causal mask (params.h).  Op bodies shared by the CPU and
// CUDA backends (checks, outputs, kernel parameters), meta kernels and
// autograd.  A backend supplies the kernel call.
#pragma once
#include <ATen/core/Tensor.h>

#include "../kernels/softmax/params.h"

namespace fln::glue {

struct SoftmaxBackend {
  void (*run)(const SoftmaxParams& p, at::ScalarType t, const at::Tensor& like);
};

extern const SoftmaxBackend kCpuSoftmax;
#ifdef FLN_WITH_CUDA
extern const SoftmaxBackend kCudaSoftmax;
#endif

// Over the last dim: y from x, or the input gradient from (y, grad_y).
// Outputs are contiguous, in the input's dtype.
at::Tensor softmax_fwd_impl(const SoftmaxBackend& be, const at::Tensor& input, bool log, double scale, bool causal);
at::Tensor softmax_bwd_impl(const SoftmaxBackend& be, const at::Tensor& output, const at::Tensor& grad_output,
                            bool log, double scale, bool causal);

template <const SoftmaxBackend& Be>
at::Tensor softmax_fwd(const at::Tensor& input, bool log, double scale, bool causal) {
  return softmax_fwd_impl(Be, input, log, scale, causal);
}
template <const SoftmaxBackend& Be>
at::Tensor softmax_bwd(const at::Tensor& output, const at::Tensor& grad_output, bool log, double scale, bool causal) {
  return softmax_bwd_impl(Be, output, grad_output, log, scale, causal);
}
at::Tensor softmax_fwd_meta(const at::Tensor& input, bool log, double scale, bool causal);
at::Tensor softmax_bwd_meta(const at::Tensor& output, const at::Tensor& grad_output, bool log, double scale,
                            bool causal);

// The differentiable op over any dim (Autograd) and its below-autograd form.
// A dim other than the last goes through a transpose to the last dim (one
// copy in, one out); causal needs the last dim.
at::Tensor softmax_autograd(const at::Tensor& input, int64_t dim, bool log, double scale, bool causal);
at::Tensor softmax_composite(const at::Tensor& input, int64_t dim, bool log, double scale, bool causal);

}  // namespace fln::glue
