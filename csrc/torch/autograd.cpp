// Autograd in C++ (works from LibTorch as well as Python): each
// differentiable op calls the registered forward op below autograd and, when
// a gradient is needed, records a backward node that saves what the backward
// op needs and asks it only for the gradients autograd needs.  Both calls go
// through the dispatcher, so torch.compile traces them as the fwd/bwd ops.
// A backward that autograd itself records (create_graph=True) computes the
// gradients with differentiable ATen ops instead, so double backward works.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <array>
#include <mutex>

#include "autograd_compat.h"
#include "norm_ops.h"

namespace fln::glue {

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
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

using LnSig = Tensor(const Tensor&, at::IntArrayRef, const OptTensor&, const OptTensor&, double);
using RmsSig = Tensor(const Tensor&, at::IntArrayRef, const OptTensor&, std::optional<double>);
const auto& ln_op() { static auto op = find_op<LnSig>("fused_layernorm::layer_norm"); return op; }
const auto& rms_op() { static auto op = find_op<RmsSig>("fused_layernorm::rms_norm"); return op; }

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// Calls the bwd op (`call`, on tensors already unpacked) below the Autograd
// key where the op's autograd kernel, torch's not-implemented fallback (a
// boxed call), would only redispatch: no forward-mode tangent on the
// incoming gradient.  With one (forward-over-reverse) through it, so that the
// fallback raises instead of silently dropping the tangent.  (A backward
// under create_graph takes differentiable_bwd instead.)
// The saved tensors must be unpacked before, outside the guard: unpacking
// runs saved-tensor hooks, and non-reentrant checkpointing recomputes the
// forward in one, which must record as it did the first time.
template <typename F>
auto call_bwd_op(const Tensor& grad, F&& call) {
  if (grad._fw_grad(/*level=*/0).defined()) return call();
  at::AutoDispatchBelowADInplaceOrView guard;
  return call();
}

// The backward as differentiable ATen ops, for a backward that autograd
// records (create_graph=True: double backward, gradgradcheck, hessians):
// with xhat = (x - mean) * rstd and g = dy * w,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (RMSNorm: no mean(g)),
//   dw = sum_rows dy * xhat,  db = sum_rows dy.
// mean and rstd are recomputed from x here, not taken from the forward, so
// that their own dependence on x is differentiated too.  Math in the
// statistics dtype (fp32, fp64 for double), results in the input's and the
// weight's dtypes, as the kernels return them.
std::tuple<Tensor, Tensor, Tensor> differentiable_bwd(const Tensor& dy, const Tensor& x, at::IntArrayRef shape,
                                                      const Tensor& w, const Tensor& b, double eps,
                                                      std::array<bool, 3> mask, bool rms) {
  int64_t cols = 1;
  for (int64_t v : shape) cols *= v;
  Tensor dx, dw, db;
  if (cols == 0) {  // empty rows: every gradient is empty
    if (mask[0]) dx = at::zeros_like(x, at::MemoryFormat::Contiguous);
    if (mask[1] && w.defined()) dw = at::zeros_like(w);
    if (mask[2] && b.defined()) db = at::zeros_like(b);
    return {dx, dw, db};
  }
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const Tensor x2 = x.reshape({-1, cols}).to(acc), dy2 = dy.reshape({-1, cols}).to(acc);
  const Tensor xc = rms ? x2 : x2 - x2.mean(-1, /*keepdim=*/true);
  const Tensor rstd = (xc * xc).mean(-1, /*keepdim=*/true).add(eps).rsqrt();
  const Tensor xhat = xc * rstd;
  if (mask[0]) {
    const Tensor g = w.defined() ? dy2 * w.reshape({cols}).to(acc) : dy2;
    Tensor inner = g - xhat * (g * xhat).mean(-1, /*keepdim=*/true);
    if (!rms) inner = inner - g.mean(-1, /*keepdim=*/true);
    dx = (rstd * inner).to(x.scalar_type()).reshape(x.sizes());
  }
  if (mask[1] && w.defined()) dw = (dy2 * xhat).sum(0).to(w.scalar_type()).reshape(shape);
  if (mask[2] && b.defined()) db = dy2.sum(0).to(b.scalar_type()).reshape(shape);
  return {dx, dw, db};
}

// The backward nodes, written like torch's generated ones: a Node that holds
// SavedVariables and calls the registered backward op.  (A
// torch::autograd::Function did the same with more host work per call: a
// context, a saved-data dictionary and per-input metadata.)  Edges are
// fixed, input, weight, bias, so edge i is gradient i; an absent tensor, or
// one that needs no gradient, has an invalid edge, for which
// task_should_compute_output is false.
template <size_t kSaved>
class NormBackward : public Node {
 public:
  std::array<SavedVariable, kSaved> saved;
  std::vector<int64_t> shape;
  double eps = 0;  // as the forward used it (RMSNorm's default resolved)

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved) s.reset_data();
  }
};

class LayerNormBackward : public NormBackward<5> {
 public:
  enum { kInput, kWeight, kBias, kMean, kRstd };
  std::string name() const override { return "fused_layernorm::LayerNormBackward"; }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return variable_list(3);
    const std::array<bool, 3> mask{task_should_compute_output(0), task_should_compute_output(1),
                                   task_should_compute_output(2)};
    const Tensor x = saved[kInput].unpack(), mean = saved[kMean].unpack(), rstd = saved[kRstd].unpack();
    const Tensor w = saved[kWeight].unpack(), b = saved[kBias].unpack();
    if (at::GradMode::is_enabled()) {
      auto [dx, dw, db] = differentiable_bwd(grads[0], x, shape, w, b, eps, mask, /*rms=*/false);
      return {std::move(dx), std::move(dw), std::move(db)};
    }
    auto [dx, dw, db] = call_bwd_op(
        grads[0], [&] { return ln_bwd_op().call(grads[0], x, shape, mean, rstd, opt(w), opt(b), mask); });
    return {std::move(dx), std::move(dw), std::move(db)};
  }
};

class RMSNormBackward : public NormBackward<3> {
 public:
  enum { kInput, kWeight, kRstd };
  std::string name() const override { return "fused_layernorm::RMSNormBackward"; }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return variable_list(2);
    const std::array<bool, 2> mask{task_should_compute_output(0), task_should_compute_output(1)};
    const Tensor x = saved[kInput].unpack(), rstd = saved[kRstd].unpack(), w = saved[kWeight].unpack();
    if (at::GradMode::is_enabled()) {
      auto [dx, dw, db] = differentiable_bwd(grads[0], x, shape, w, Tensor(), eps, {mask[0], mask[1], false},
                                             /*rms=*/true);
      return {std::move(dx), std::move(dw)};
    }
    auto [dx, dw] =
        call_bwd_op(grads[0], [&] { return rms_bwd_op().call(grads[0], x, shape, rstd, opt(w), mask); });
    return {std::move(dx), std::move(dw)};
  }
};

// Saves a tensor that may be absent (an optional weight or bias).
SavedVariable save(const OptTensor& t) { return t && t->defined() ? SavedVariable(*t, false) : SavedVariable(); }

// Forward-mode AD (dual tensors, torch.func.jvp / jacfwd) has no formula
// here: an error, not a tangent silently dropped.
void check_no_forward_grad(const char* op, const Tensor& input, const OptTensor& w, const OptTensor& b) {
  auto dual = [](const OptTensor& t) { return t && t->defined() && t->_fw_grad(/*level=*/0).defined(); };
  TORCH_CHECK(!dual(input) && !dual(w) && !dual(b), op,
              ": forward-mode AD (dual tensors, torch.func.jvp, jacfwd) is not implemented");
}

// Whether autograd has anything to record: otherwise no node is made.
bool records_grad(const Tensor& input, const OptTensor& w, const OptTensor& b = std::nullopt) {
  return at::GradMode::is_enabled() &&
         (input.requires_grad() || (w && w->requires_grad()) || (b && b->requires_grad()));
}

}  // namespace

Tensor layer_norm_autograd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                           double eps) {
  check_no_forward_grad("fused_layernorm::layer_norm", input, w, b);
  if (!records_grad(input, w, b)) {  // y alone, below autograd: no statistics to keep
    at::AutoDispatchBelowADInplaceOrView guard;
    return ln_op().call(input, shape, w, b, eps);
  }
  Tensor y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, rstd) = ln_fwd_op().call(input, shape, w, b, eps);
  }
  auto node = make_node<LayerNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(input, w, b));
  node->saved[LayerNormBackward::kInput] = SavedVariable(input, false);
  node->saved[LayerNormBackward::kWeight] = save(w);
  node->saved[LayerNormBackward::kBias] = save(b);
  node->saved[LayerNormBackward::kMean] = SavedVariable(mean, false);
  node->saved[LayerNormBackward::kRstd] = SavedVariable(rstd, false);
  node->shape = shape.vec();
  node->eps = eps;
  torch::autograd::set_history(y, node);
  return y;
}

Tensor rms_norm_autograd(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                         std::optional<double> eps) {
  check_no_forward_grad("fused_layernorm::rms_norm", input, w, std::nullopt);
  if (!records_grad(input, w)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rms_op().call(input, shape, w, eps);
  }
  Tensor y, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, rstd) = rms_fwd_op().call(input, shape, w, eps);
  }
  auto node = make_node<RMSNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(input, w));
  node->saved[RMSNormBackward::kInput] = SavedVariable(input, false);
  node->saved[RMSNormBackward::kWeight] = save(w);
  node->saved[RMSNormBackward::kRstd] = SavedVariable(rstd, false);
  node->shape = shape.vec();
  node->eps = rms_eps(input, eps);
  torch::autograd::set_history(y, node);
  return y;
}

// Entry points for Python's fast path: the differentiable ops through the
// dispatcher (every key, autograd included), without the boxed torch.ops call.
Tensor layer_norm_call(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                       double eps) {
  return ln_op().call(input, shape, w, b, eps);
}

Tensor rms_norm_call(const Tensor& input, at::IntArrayRef shape, const OptTensor& w, std::optional<double> eps) {
  return rms_op().call(input, shape, w, eps);
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
