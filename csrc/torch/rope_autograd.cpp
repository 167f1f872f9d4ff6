// Autograd of the rotary op in C++: the differentiable rope gathers cos/sin
// at position_ids (a recorded ATen op), calls rope_fwd below autograd and
// records RopeBackward.  Its backward is the same kernel rotating by -theta
// (rope_bwd); it needs only cos and sin.  Gradients of cos and sin, rarely
// wanted (Hugging Face's come from a buffer), are reductions over heads
// computed with ATen ops from the saved q and k.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <mutex>

#include "autograd_compat.h"
#include "rope_ops.h"

namespace fln::glue {

namespace {

using at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

using FwdSig = RopeOut(const Tensor&, const OptTensor&, const Tensor&, const Tensor&, int64_t, bool);
using BwdSig = RopeOut(const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, int64_t, bool);

const auto& fwd_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused_layernorm::rope_fwd", "").typed<FwdSig>();
  return op;
}
const auto& bwd_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused_layernorm::rope_bwd", "").typed<BwdSig>();
  return op;
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The partner of each rotated element with its sign: x[..., :rot] -> (-x2, x1)
// (Llama's rotate_half) or (-x1, x0) for each neighbour pair (GPT-J).
Tensor rotate_pairs(const Tensor& x, bool interleaved) {
  if (interleaved) {
    const Tensor pairs = x.unflatten(-1, {-1, 2});
    return at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  }
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

// sum over heads of g * f(x) on the rotated dims, in float32 (float64), reduced to cos's shape.
Tensor cos_sin_grad(const Tensor& g, const Tensor& x, int64_t rot, int64_t heads_axis, bool rotate, bool interleaved) {
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const Tensor xr = x.narrow(-1, 0, rot).to(acc), gr = g.narrow(-1, 0, rot).to(acc);
  return (gr * (rotate ? rotate_pairs(xr, interleaved) : xr)).sum(heads_axis, /*keepdim=*/true);
}

// Edges: q, k, cos, sin.
class RopeBackward : public torch::autograd::Node {
 public:
  enum { kCos, kSin, kQ, kK, kSaved };
  std::array<SavedVariable, kSaved> saved;
  int64_t unsqueeze_dim = 1;
  bool interleaved = false;

  std::string name() const override { return "fused_layernorm::RopeBackward"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved) s.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Tensor& gq = grads[0];
    const Tensor& gk = grads[1];
    variable_list out(4);
    if (!gq.defined() && !gk.defined()) return out;
    const Tensor cos = saved[kCos].unpack(), sin = saved[kSin].unpack();
    const OptTensor want_q = task_should_compute_output(0) ? opt(gq) : std::nullopt;
    const OptTensor want_k = task_should_compute_output(1) ? opt(gk) : std::nullopt;
    if (want_q || want_k) {
      auto [dq, dk] = bwd_op().call(want_q, want_k, cos, sin, unsqueeze_dim, interleaved);
      // An output nobody used has an undefined gradient: its input's is then undefined too (zero).
      out[0] = std::move(dq);
      out[1] = std::move(dk);
    }
    if (task_should_compute_output(2) || task_should_compute_output(3)) {
      const Tensor q = saved[kQ].unpack(), k = saved[kK].unpack();
      const int64_t heads = unsqueeze_dim < 0 ? unsqueeze_dim + 4 : unsqueeze_dim, rot = cos.size(-1);
      // cos and sin as the 4-dim shape they broadcast from.
      const Tensor c4 = (cos.dim() == 2 ? cos.unsqueeze(0) : cos).unsqueeze(heads);
      for (int which = 0; which < 2; ++which) {
        if (!task_should_compute_output(2 + which)) continue;
        Tensor sum;
        if (gq.defined()) sum = cos_sin_grad(gq, q, rot, heads, which == 1, interleaved);
        if (gk.defined()) {
          const Tensor t = cos_sin_grad(gk, k, rot, heads, which == 1, interleaved);
          sum = sum.defined() ? sum + t : t;
        }
        out[2 + which] = at::sum_to(sum, c4.sizes()).reshape(cos.sizes()).to(cos.scalar_type());
      }
    }
    return out;
  }
};

}  // namespace

RopeOut rope_autograd(const Tensor& q, const Tensor& k, const Tensor& cos_in, const Tensor& sin_in,
                      const OptTensor& position_ids, int64_t unsqueeze_dim, bool interleaved) {
  auto dual = [](const Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); };
  TORCH_CHECK(!dual(q) && !dual(k) && !dual(cos_in) && !dual(sin_in),
              "fused_layernorm: forward-mode AD (dual tensors, torch.func.jvp, jacfwd) is not implemented");
  // Above the guard: a gather from cos/sin tables is recorded by autograd as it is.
  const auto [cos, sin] = rope_gather(cos_in, sin_in, position_ids);
  const bool want_cs = cos.requires_grad() || sin.requires_grad();
  const bool record = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || want_cs);
  Tensor q_out, k_out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(q_out, k_out) = fwd_op().call(q, k, cos, sin, unsqueeze_dim, interleaved);
  }
  if (record) {
    auto node = make_node<RopeBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, cos, sin));
    node->saved[RopeBackward::kCos] = SavedVariable(cos, false);
    node->saved[RopeBackward::kSin] = SavedVariable(sin, false);
    if (want_cs) {  // only the gradients of cos and sin read q and k
      node->saved[RopeBackward::kQ] = SavedVariable(q, false);
      node->saved[RopeBackward::kK] = SavedVariable(k, false);
    }
    node->unsqueeze_dim = unsqueeze_dim;
    node->interleaved = interleaved;
    torch::autograd::set_history({q_out, k_out}, node);
  }
  return {q_out, k_out};
}

RopeOut rope_composite(const Tensor& q, const Tensor& k, const Tensor& cos_in, const Tensor& sin_in,
                       const OptTensor& position_ids, int64_t unsqueeze_dim, bool interleaved) {
  const auto [cos, sin] = rope_gather(cos_in, sin_in, position_ids);
  return fwd_op().call(q, k, cos, sin, unsqueeze_dim, interleaved);
}

}  // namespace fln::glue
