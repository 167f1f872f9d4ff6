// Autograd of the softmax op in C++: the differentiable softmax moves `dim`
// to the last dim, calls softmax_fwd below autograd and records
// SoftmaxBackward, which saves only y.  Its backward is softmax_bwd (one
// kernel: dx = scale * y * (dy - sum(dy * y)), or for log-softmax
// scale * (dy - exp(y) * sum(dy))).  Under create_graph the gradient is
// itself not differentiable: softmax_bwd's autograd fallback raises if it is.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <mutex>
#include <string>

#include "autograd_compat.h"
#include "softmax_ops.h"

namespace fln::glue {

namespace {

using at::Tensor;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

using FwdSig = Tensor(const Tensor&, bool, double, bool);
using BwdSig = Tensor(const Tensor&, const Tensor&, bool, double, bool);

const auto& fwd_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused_layernorm::softmax_fwd", "").typed<FwdSig>();
  return op;
}
const auto& bwd_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused_layernorm::softmax_bwd", "").typed<BwdSig>();
  return op;
}

// dim wrapped into [0, dim()) (a 0-d tensor takes 0 or -1), -1 meaning "already last".
int64_t last_dim_or(const Tensor& x, int64_t dim, bool causal) {
  const int64_t nd = x.dim() == 0 ? 1 : x.dim();
  TORCH_CHECK_INDEX(dim >= -nd && dim < nd, "fused_layernorm.softmax: dim ", std::to_string(dim),
                    " is out of range for input of ", std::to_string(x.dim()), " dims");
  const int64_t d = dim < 0 ? dim + nd : dim;
  TORCH_CHECK_VALUE(!causal || d == nd - 1, "fused_layernorm.softmax: causal needs dim=-1 (the key dim), got dim ",
                    std::to_string(dim));
  return d == nd - 1 ? -1 : d;
}

// x with dim d moved to the last dim (d < 0: as it is).
Tensor to_last(const Tensor& x, int64_t d) { return d < 0 ? x : x.transpose(d, -1); }

class SoftmaxBackward : public torch::autograd::Node {
 public:
  SavedVariable y;  // the output, in the input's dim order
  int64_t d = -1;
  bool log = false;
  bool causal = false;
  double scale = 1.0;

  std::string name() const override { return "fused_layernorm::SoftmaxBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    y.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(1);
    if (!grads[0].defined() || !task_should_compute_output(0)) return out;
    const Tensor yv = to_last(y.unpack(getptr()), d);
    out[0] = to_last(bwd_op().call(yv, to_last(grads[0], d), log, scale, causal), d);
    return out;
  }
};

}  // namespace

Tensor softmax_autograd(const Tensor& input, int64_t dim, bool log, double scale, bool causal) {
  TORCH_CHECK(!(input.defined() && input._fw_grad(/*level=*/0).defined()),
              "fused_layernorm: forward-mode AD (dual tensors, torch.func.jvp, jacfwd) is not implemented");
  const int64_t d = input.defined() ? last_dim_or(input, dim, causal) : -1;
  const bool record = at::GradMode::is_enabled() && input.requires_grad();
  Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = to_last(fwd_op().call(to_last(input, d), log, scale, causal), d);
  }
  if (record) {
    auto node = make_node<SoftmaxBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(input));
    node->d = d;
    node->log = log;
    node->scale = scale;
    node->causal = causal;
    torch::autograd::set_history(result, node);
    node->y = SavedVariable(result, /*is_output=*/true);
  }
  return result;
}

Tensor softmax_composite(const Tensor& input, int64_t dim, bool log, double scale, bool causal) {
  const int64_t d = input.defined() ? last_dim_or(input, dim, causal) : -1;
  return to_last(fwd_op().call(to_last(input, d), log, scale, causal), d);
}

}  // namespace fln::glue
