// Autograd in C++ (works from LibTorch as well as Python): each
// differentiable op is a torch::autograd::Function that calls the registered
// forward op below autograd, saves what the backward op needs, and asks the
// backward op only for the gradients autograd needs.  Both calls go through
// the dispatcher, so torch.compile traces them as the fwd/bwd ops.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include "norm_ops.h"

namespace fln::glue {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using LnFwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&,
                                                    const OptTensor&, double);
using LnBwdSig = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef, const Tensor&,
                                                    const Tensor&, const OptTensor&, const OptTensor&,
                                                    std::array<bool, 3>);
using RmsFwdSig = std::tuple<Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&, std::optional<double>);
using RmsBwdSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef, const Tensor&,
                                             const OptTensor&, std::array<bool, 2>);

const auto& ln_fwd_op() { static auto op = find_op<LnFwdSig>("fused_layernorm::layer_norm_fwd"); return op; }
const auto& ln_bwd_op() { static auto op = find_op<LnBwdSig>("fused_layernorm::layer_norm_bwd"); return op; }
const auto& rms_fwd_op() { static auto op = find_op<RmsFwdSig>("fused_layernorm::rms_norm_fwd"); return op; }
const auto& rms_bwd_op() { static auto op = find_op<RmsBwdSig>("fused_layernorm::rms_norm_bwd"); return op; }

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                        const OptTensor& b, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = ln_fwd_op().call(input, shape, w, b, eps);
    ctx->save_for_backward({input, w.value_or(Tensor()), b.value_or(Tensor()), mean, rstd});
    ctx->saved_data["shape"] = shape.vec();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const Tensor &input = s[0], &w = s[1], &b = s[2];
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    const auto shape = ctx->saved_data["shape"].toIntVector();
    // needs_input_grad counts only the tensors that were given: input, then
    // weight and bias if present.
    size_t edge = 0;
    const bool gx = ctx->needs_input_grad(edge++);
    const bool gw = w.defined() && ctx->needs_input_grad(edge++);
    const bool gb = b.defined() && ctx->needs_input_grad(edge++);
    const std::array<bool, 3> mask{gx, gw, gb};
    auto [dx, dw, db] = ln_bwd_op().call(grads[0], input, shape, s[3], s[4], opt(w), opt(b), mask);
    return {dx, Tensor(), dw, db, Tensor()};
  }
};

class RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                        std::optional<double> eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = rms_fwd_op().call(input, shape, w, eps);
    ctx->save_for_backward({input, w.value_or(Tensor()), rstd});
    ctx->saved_data["shape"] = shape.vec();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const Tensor &input = s[0], &w = s[1];
    if (!grads[0].defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const std::array<bool, 2> mask{ctx->needs_input_grad(0), w.defined() && ctx->needs_input_grad(1)};  // as above
    auto [dx, dw] = rms_bwd_op().call(grads[0], input, shape, s[2], opt(w), mask);
    return {dx, Tensor(), dw, Tensor()};
  }
};

}  // namespace

namespace {
// Whether autograd has anything to record: otherwise the ops skip the
// Function machinery (about 1.5 us a call) and run the forward op directly.
bool records_grad(const Tensor& input, const OptTensor& w, const OptTensor& b = std::nullopt) {
  return at::GradMode::is_enabled() &&
         (input.requires_grad() || (w && w->requires_grad()) || (b && b->requires_grad()));
}
}  // namespace

Tensor layer_norm_autograd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                           double eps) {
  if (records_grad(input, w, b)) return LayerNormFunction::apply(input, shape, w, b, eps);
  at::AutoDispatchBelowADInplaceOrView guard;
  return std::get<0>(ln_fwd_op().call(input, shape, w, b, eps));
}

Tensor rms_norm_autograd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                         std::optional<double> eps) {
  if (records_grad(input, w)) return RMSNormFunction::apply(input, shape, w, eps);
  at::AutoDispatchBelowADInplaceOrView guard;
  return std::get<0>(rms_fwd_op().call(input, shape, w, eps));
}

// Entry points for Python's fast path: the differentiable ops through the
// dispatcher (every key, autograd included), without the boxed torch.ops call.
Tensor layer_norm_call(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                       double eps) {
  static const auto op = find_op<Tensor(const Tensor&, at::IntArrayRef, const OptTensor&, const OptTensor&, double)>(
      "fused_layernorm::layer_norm");
  return op.call(input, shape, w, b, eps);
}

Tensor rms_norm_call(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, std::optional<double> eps) {
  static const auto op = find_op<Tensor(const Tensor&, at::IntArrayRef, const OptTensor&, std::optional<double>)>(
      "fused_layernorm::rms_norm");
  return op.call(input, shape, w, eps);
}

Tensor layer_norm_composite(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                            double eps) {
  return std::get<0>(ln_fwd_op().call(input, shape, w, b, eps));
}

Tensor rms_norm_composite(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                          std::optional<double> eps) {
  return std::get<0>(rms_fwd_op().call(input, shape, w, eps));
}

}  // namespace fln::glue
