// The op bodies, shared by the CPU and CUDA backends: checks, the 2-D row
// view of the input, output allocation and the kernel parameters.  A Backend
// supplies only the two kernel calls.
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

#include "../kernels/params.h"

namespace fln::glue {

using at::Tensor;
using OptTensor = std::optional<at::Tensor>;

struct Backend {
  // Runs the forward / backward kernels; `like` is the input (device, dtype).
  void (*fwd)(const FwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor& like);
  void (*bwd)(const BwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor& like);
};

extern const Backend kCpuBackend;
#ifdef FLN_WITH_CUDA
extern const Backend kCudaBackend;
#endif

// (y, mean, rstd); mean is undefined for RMSNorm, and both are without
// `stats` (the kernels then neither compute nor store them).
std::tuple<Tensor, Tensor, Tensor> norm_fwd(const Backend& be, const char* op, const Tensor& input,
                                            at::IntArrayRef normalized_shape, const OptTensor& weight,
                                            const OptTensor& bias, double eps, bool rms, bool stats = true);

// (dx, dweight, dbias); each undefined when not requested or not applicable.
std::tuple<Tensor, Tensor, Tensor> norm_bwd(const Backend& be, const char* op, const Tensor& grad_out,
                                            const Tensor& input, at::IntArrayRef normalized_shape,
                                            const Tensor& mean, const Tensor& rstd, const OptTensor& weight,
                                            const OptTensor& bias, std::array<bool, 3> mask, bool rms);

// Registered op signatures, one set per backend (Be is kCpuBackend / kCudaBackend).
template <const Backend& Be>
std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                                                  const OptTensor& b, double eps) {
  return norm_fwd(Be, "fused_layernorm.layer_norm", input, shape, w, b, eps, false);
}

template <const Backend& Be>
std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor& dy, const Tensor& input, at::IntArrayRef shape,
                                                  const Tensor& mean, const Tensor& rstd, const OptTensor& w,
                                                  const OptTensor& b, std::array<bool, 3> mask) {
  return norm_bwd(Be, "fused_layernorm.layer_norm_bwd", dy, input, shape, mean, rstd, w, b, mask, false);
}

double rms_eps(const Tensor& input, std::optional<double> eps);

template <const Backend& Be>
std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                                        std::optional<double> eps) {
  auto [y, mean, rstd] = norm_fwd(Be, "fused_layernorm.rms_norm", input, shape, w, std::nullopt,
                                  rms_eps(input, eps), true);
  return {y, rstd};
}

template <const Backend& Be>
std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy, const Tensor& input, at::IntArrayRef shape,
                                        const Tensor& rstd, const OptTensor& w, std::array<bool, 2> mask) {
  auto [dx, dw, db] = norm_bwd(Be, "fused_layernorm.rms_norm_bwd", dy, input, shape, Tensor(), rstd, w,
                               std::nullopt, {mask[0], mask[1], false}, true);
  return {dx, dw};
}

// The differentiable ops below autograd on a backend, where autograd records
// nothing (no_grad, inference, no input requiring grad): y alone, without
// the statistics a backward would need.
template <const Backend& Be>
Tensor layer_norm_y(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b, double eps) {
  return std::get<0>(norm_fwd(Be, "fused_layernorm.layer_norm", input, shape, w, b, eps, false, false));
}

template <const Backend& Be>
Tensor rms_norm_y(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, std::optional<double> eps) {
  return std::get<0>(
      norm_fwd(Be, "fused_layernorm.rms_norm", input, shape, w, std::nullopt, rms_eps(input, eps), true, false));
}

// Meta (fake-tensor) kernels: the same checks and output shapes, no data.
std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_meta(const Tensor& input, at::IntArrayRef shape,
                                                       const OptTensor& w, const OptTensor& b, double eps);
std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd_meta(const Tensor& dy, const Tensor& input, at::IntArrayRef shape,
                                                       const Tensor& mean, const Tensor& rstd, const OptTensor& w,
                                                       const OptTensor& b, std::array<bool, 3> mask);
std::tuple<Tensor, Tensor> rms_norm_fwd_meta(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                                             std::optional<double> eps);
std::tuple<Tensor, Tensor> rms_norm_bwd_meta(const Tensor& dy, const Tensor& input, at::IntArrayRef shape,
                                             const Tensor& rstd, const OptTensor& w, std::array<bool, 2> mask);

// The differentiable ops: autograd (a C++ backward node, or below autograd
// to layer_norm_y / rms_norm_y where nothing is recorded) and the composite
// that other backends (meta) take below autograd.
Tensor layer_norm_autograd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                           double eps);
Tensor rms_norm_autograd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, std::optional<double> eps);
Tensor layer_norm_composite(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                            double eps);
Tensor rms_norm_composite(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                          std::optional<double> eps);

// The differentiable ops called through the dispatcher from C++: Python's
// fast path (bound in registration.cpp), cheaper than a boxed torch.ops call.
Tensor layer_norm_call(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                       double eps);
Tensor rms_norm_call(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, std::optional<double> eps);

}  // namespace fln::glue
