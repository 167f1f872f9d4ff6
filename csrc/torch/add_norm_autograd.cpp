// Autograd of the fused pre-norm op in C++: the differentiable add_norm
// calls add_norm_fwd below autograd and records AddNormBackward, which calls
// add_norm_bwd for the gradients autograd needs, the gradient flowing into
// the returned h added in the same kernel.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <mutex>

#include "add_norm_ops.h"
#include "autograd_compat.h"

namespace fln::glue {

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

using FwdSig = FwdOut(const Tensor&, const OptTensor&, at::IntArrayRef, const OptTensor&, const OptTensor&,
                      std::optional<double>, bool, double, double, std::optional<at::ScalarType>, bool, bool,
                      const OptGenerator&);
using BwdSig = BwdOut(const Tensor&, const OptTensor&, const Tensor&, at::IntArrayRef, const OptTensor&, const Tensor&,
                      const OptTensor&, const OptTensor&, bool, double, double, const OptTensor&, at::ScalarType,
                      std::array<bool, 4>);

const auto& fwd_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused_layernorm::add_norm_fwd", "").typed<FwdSig>();
  return op;
}
const auto& bwd_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused_layernorm::add_norm_bwd", "").typed<BwdSig>();
  return op;
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }
SavedVariable save(const OptTensor& t) { return t && t->defined() ? SavedVariable(*t, false) : SavedVariable(); }
bool needs_grad(const OptTensor& t) { return t && t->defined() && t->requires_grad(); }

// Edges: input, residual, weight, bias (an absent one has an invalid edge).
class AddNormBackward : public torch::autograd::Node {
 public:
  enum { kH, kWeight, kBias, kMean, kRstd, kRng, kSaved };
  std::array<SavedVariable, kSaved> saved;
  std::vector<int64_t> shape;
  bool rms = false;
  double dropout_p = 0, weight_offset = 0;
  at::ScalarType input_dtype = at::kFloat;

  std::string name() const override { return "fused_layernorm::AddNormBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved) s.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Tensor h = saved[kH].unpack(getptr());
    const Tensor dh = grads.size() > 1 ? grads[1] : Tensor();  // h is an output only when returned
    if (!grads[0].defined() && !dh.defined()) return variable_list(4);
    // zeros_like, not zeros: a tensor subclass (DTensor) gets a zero gradient of its own kind and placement.
    const Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(h, h.options().dtype(input_dtype));
    const std::array<bool, 4> mask{task_should_compute_output(0), task_should_compute_output(1),
                                   task_should_compute_output(2), task_should_compute_output(3)};
    const Tensor w = saved[kWeight].unpack(), b = saved[kBias].unpack(), mean = saved[kMean].unpack();
    const Tensor rstd = saved[kRstd].unpack(), rng = saved[kRng].unpack();
    auto [dx, dres, dw, db] = bwd_op().call(dy, opt(dh), h, shape, opt(mean), rstd, opt(w), opt(b), rms,
                                            dropout_p, weight_offset, opt(rng), input_dtype, mask);
    if (mask[1] && !dres.defined()) dres = dx;  // no dropout, h of x's dtype: the same gradient
    return {mask[0] ? dx : Tensor(), std::move(dres), std::move(dw), std::move(db)};
  }
};

}  // namespace

std::tuple<Tensor, Tensor, Tensor> add_norm_autograd(const Tensor& input, const OptTensor& residual,
                                                     at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                                                     std::optional<double> eps, bool rms, double p, double offset,
                                                     std::optional<at::ScalarType> rt, bool return_residual,
                                                     bool return_mask, const OptGenerator& gen) {
  auto dual = [](const OptTensor& t) { return t && t->defined() && t->_fw_grad(/*level=*/0).defined(); };
  TORCH_CHECK(!dual(input) && !dual(residual) && !dual(w) && !dual(b),
              "fused_layernorm: forward-mode AD (dual tensors, torch.func.jvp, jacfwd) is not implemented");
  const bool record = at::GradMode::is_enabled() &&
                      (input.requires_grad() || needs_grad(residual) || needs_grad(w) || needs_grad(b));
  const at::ScalarType h_dtype = rt ? *rt : residual && residual->defined() ? residual->scalar_type()
                                                                              : input.scalar_type();
  // The backward needs h; where h is x, x itself is saved.
  const bool h_is_x = !(residual && residual->defined()) && p == 0.0 && h_dtype == input.scalar_type();
  const bool store_h = return_residual || (record && !h_is_x);
  Tensor y, h, mean, rstd, rng, mask;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, h, mean, rstd, rng, mask) =
        fwd_op().call(input, residual, shape, w, b, eps, rms, p, offset, rt, store_h, return_mask, gen);
  }
  if (record) {
    auto node = make_node<AddNormBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(input, residual, w, b));
    node->saved[AddNormBackward::kWeight] = save(w);
    node->saved[AddNormBackward::kBias] = save(b);
    node->saved[AddNormBackward::kMean] = SavedVariable(mean, false);
    node->saved[AddNormBackward::kRstd] = SavedVariable(rstd, false);
    node->saved[AddNormBackward::kRng] = SavedVariable(rng, false);
    node->shape = shape.vec();
    node->rms = rms;
    node->dropout_p = p;
    node->weight_offset = offset;
    node->input_dtype = input.scalar_type();
    if (return_residual) torch::autograd::set_history({y, h}, node);
    else torch::autograd::set_history(y, node);
    // A returned h is this node's output: saved as one, so it holds no reference to the node.
    node->saved[AddNormBackward::kH] = SavedVariable(store_h ? h : input, store_h && return_residual);
  }
  if (!return_residual) h = at::empty({0}, input.options().dtype(h_dtype));
  return {y, h, mask};
}

std::tuple<Tensor, Tensor, Tensor> add_norm_composite(const Tensor& input, const OptTensor& residual,
                                                      at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                                                      std::optional<double> eps, bool rms, double p, double offset,
                                                      std::optional<at::ScalarType> rt, bool return_residual,
                                                      bool return_mask, const OptGenerator& gen) {
  auto [y, h, mean, rstd, rng, mask] =
      fwd_op().call(input, residual, shape, w, b, eps, rms, p, offset, rt, return_residual, return_mask, gen);
  return {y, h, mask};
}

}  // namespace fln::glue
