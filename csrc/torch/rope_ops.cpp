#include "rope_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>

#include "cpu_kernels.h"

namespace fln::glue {

namespace {

using OptTensor = std::optional<at::Tensor>;
using at::Tensor;

// Integers and shapes formatted with std::to_string, never streamed (checks.cpp says why).
std::string dims(c10::SymIntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto v = s[i].maybe_as_int();
    out += (i ? ", " : "") + (v ? std::to_string(*v) : std::string("?"));
  }
  return out + "]";
}

bool has(const OptTensor& t) { return t.has_value() && t->defined(); }

bool supported(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// The op and its argument names in error messages.
struct Names {
  const char* op;
  const char* q;
  const char* k;
};

Names names(bool backward) {
  return backward ? Names{"fused_layernorm.rope_backward", "grad_q", "grad_k"} : Names{"fused_layernorm.rope", "q", "k"};
}

// The heads axis of q and k: cos/sin are unsqueezed there, as Hugging Face does.
int64_t heads_axis(const char* op, int64_t unsqueeze_dim) {
  TORCH_CHECK_VALUE(unsqueeze_dim == 1 || unsqueeze_dim == 2 || unsqueeze_dim == -3 || unsqueeze_dim == -2, op,
                    ": unsqueeze_dim must be 1 (q and k of shape [batch, heads, seq, head_dim]) or 2 "
                    "([batch, seq, heads, head_dim]), or -3 / -2, got ", std::to_string(unsqueeze_dim));
  return unsqueeze_dim < 0 ? unsqueeze_dim + 4 : unsqueeze_dim;
}

void check_x(const char* op, const char* name, const Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() == 4, op, ": ", name,
                    " must have 4 dims, [batch, heads, seq, head_dim] (unsqueeze_dim=1) or [batch, seq, heads, "
                    "head_dim] (unsqueeze_dim=2), got shape ", dims(x.sym_sizes()));
  TORCH_CHECK_VALUE(supported(x.scalar_type()), op, ": ", name,
                    " must be float64, float32, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.sym_size(3) % 2 == 0, op, ": head_dim (the last dim of ", name, ") must be even, got ",
                    dims(x.sym_sizes().slice(3)));
}

// Checks q / k (either may be absent, not both) and cos / sin.
void check_rope(const Names& n, const OptTensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                int64_t unsqueeze_dim) {
  const int64_t ha = heads_axis(n.op, unsqueeze_dim), sa = 3 - ha;
  TORCH_CHECK_VALUE(has(q) || has(k), n.op, ": ", n.q, " and ", n.k, " are both undefined");
  if (has(q)) check_x(n.op, n.q, *q);
  if (has(k)) check_x(n.op, n.k, *k);
  const Tensor& x = has(q) ? *q : *k;
  const char* xn = has(q) ? n.q : n.k;
  if (has(q) && has(k)) {
    TORCH_CHECK_VALUE(k->scalar_type() == q->scalar_type(), n.op, ": ", n.k, " must have ", n.q, "'s dtype (",
                      q->scalar_type(), "), got ", k->scalar_type());
    TORCH_CHECK(k->device() == q->device(), n.op, ": ", n.k, " is on ", k->device(), " but ", n.q, " is on ",
                q->device(), "; they must be on the same device");
    TORCH_CHECK_VALUE(k->sym_size(0) == q->sym_size(0) && k->sym_size(sa) == q->sym_size(sa) &&
                          k->sym_size(3) == q->sym_size(3),
                      n.op, ": ", n.k, " must have ", n.q, "'s batch, seq_len and head_dim (heads may differ), got ",
                      n.q, " ", dims(q->sym_sizes()), " and ", n.k, " ", dims(k->sym_sizes()), " with unsqueeze_dim ",
                      std::to_string(unsqueeze_dim));
  }
  const c10::SymInt heads = (has(q) ? q->sym_size(ha) : c10::SymInt(0)) + (has(k) ? k->sym_size(ha) : c10::SymInt(0));
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();  // the kernels index a token's heads in 32 bits
  TORCH_CHECK_VALUE(heads <= kIntMax && x.sym_size(3) <= kIntMax, n.op,
                    ": the heads of q and k together, and head_dim, must each be below 2^31");
  TORCH_CHECK_VALUE(cos.defined() && sin.defined(), n.op, ": cos and sin must be tensors");
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"cos", &cos}, {"sin", &sin}}) {
    TORCH_CHECK(t->device() == x.device(), n.op, ": ", name, " is on ", t->device(), " but ", xn, " is on ",
                x.device(), "; they must be on the same device");
    const at::ScalarType ct = t->scalar_type(), xt = x.scalar_type();
    TORCH_CHECK_VALUE(ct == xt || (ct == at::kFloat && (xt == at::kHalf || xt == at::kBFloat16)), n.op, ": ", name,
                      " must have ", xn, "'s dtype (", xt, ")", xt == at::kHalf || xt == at::kBFloat16 ? " or float32" : "",
                      ", got ", ct);
  }
  TORCH_CHECK_VALUE(sin.scalar_type() == cos.scalar_type() && sin.sym_sizes().equals(cos.sym_sizes()), n.op,
                    ": sin must have cos's shape and dtype, got cos ", dims(cos.sym_sizes()), " ", cos.scalar_type(),
                    " and sin ", dims(sin.sym_sizes()), " ", sin.scalar_type());
  const bool shape_ok = (cos.dim() == 3 && (cos.sym_size(0) == 1 || cos.sym_size(0) == x.sym_size(0)) &&
                         (cos.sym_size(1) == 1 || cos.sym_size(1) == x.sym_size(sa))) ||
                        (cos.dim() == 2 && (cos.sym_size(0) == 1 || cos.sym_size(0) == x.sym_size(sa)));
  TORCH_CHECK_VALUE(shape_ok, n.op, ": cos and sin must have shape [batch or 1, seq_len or 1, rotary_dim] (or [seq_len, rotary_dim]; a table [max_positions, rotary_dim] needs "
                    "position_ids), got ", dims(cos.sym_sizes()), " for ", xn, " ", dims(x.sym_sizes()),
                    " with unsqueeze_dim ", std::to_string(unsqueeze_dim));
  const c10::SymInt rot = cos.sym_size(-1);
  TORCH_CHECK_VALUE(rot >= 2 && rot % 2 == 0 && rot <= x.sym_size(3), n.op,
                    ": the last dim of cos and sin (rotary_dim) must be even and from 2 to head_dim, got ", dims(cos.sym_sizes().slice(cos.dim() - 1)),
                    " for head_dim ", dims(x.sym_sizes().slice(3)));
}

// t, or a contiguous copy where its last dim is not unit-stride.
Tensor unit_last(const Tensor& t) { return t.sym_size(-1) == 1 || t.sym_stride(-1) == 1 ? t : t.contiguous(); }

// An output laid out as t where t is dense (so q's transposed layouts write as they read), else contiguous.
Tensor out_like(const Tensor& t) {
  Tensor out = at::empty_like(t);
  if (out.sym_size(-1) > 1 && out.sym_stride(-1) != 1) out = at::empty_symint(t.sym_sizes(), t.options());
  return out;
}

// A stride in elements; 0 for a dim of size 1, so that it never blocks 16-byte accesses.
int64_t stride_of(const Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

RopeStrides strides_of(const Tensor& t, int64_t heads, int64_t seq) {
  return {stride_of(t, 0), stride_of(t, seq), stride_of(t, heads)};
}

}  // namespace

RopeOut rope_impl(const RopeBackend& be, const OptTensor& q, const OptTensor& k, const Tensor& cos,
                  const Tensor& sin, int64_t unsqueeze_dim, bool interleaved, bool backward) {
  const Names n = names(backward);
  check_rope(n, q, k, cos, sin, unsqueeze_dim);
  const int64_t ha = heads_axis(n.op, unsqueeze_dim), sa = 3 - ha;
  const Tensor qi = has(q) ? unit_last(*q) : Tensor(), ki = has(k) ? unit_last(*k) : Tensor();
  const Tensor qo = qi.defined() ? out_like(qi) : Tensor(), ko = ki.defined() ? out_like(ki) : Tensor();
  // cos and sin as [batch or 1, seq or 1, rotary_dim] sharing strides, last dim unit-stride.
  Tensor c = unit_last(cos.dim() == 2 ? cos.unsqueeze(0) : cos), s = unit_last(sin.dim() == 2 ? sin.unsqueeze(0) : sin);
  if (c.strides() != s.strides()) {
    c = c.contiguous();
    s = s.contiguous();
  }
  const Tensor& x = qi.defined() ? qi : ki;
  RopeParams p;
  p.batch = x.size(0);
  p.seq = x.size(sa);
  p.head_dim = x.size(3);
  p.rotary_dim = c.size(2);
  if (qi.defined()) {
    p.heads_q = qi.size(ha);
    p.q = qi.const_data_ptr();
    p.q_in = strides_of(qi, ha, sa);
    p.q_out = qo.mutable_data_ptr();
    p.q_out_strides = strides_of(qo, ha, sa);
  }
  if (ki.defined()) {
    p.heads_k = ki.size(ha);
    p.k = ki.const_data_ptr();
    p.k_in = strides_of(ki, ha, sa);
    p.k_out = ko.mutable_data_ptr();
    p.k_out_strides = strides_of(ko, ha, sa);
  }
  p.cos = c.const_data_ptr();
  p.sin = s.const_data_ptr();
  p.cs_batch = stride_of(c, 0);
  p.cs_seq = stride_of(c, 1);
  p.interleaved = interleaved;
  p.backward = backward;
  if (p.batch * p.seq * (p.heads_q + p.heads_k) == 0) return {qo, ko};  // no element
  be.run(p, x.scalar_type(), c.scalar_type(), x);
  return {qo, ko};
}

RopeOut rope_meta(const OptTensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                  int64_t unsqueeze_dim, bool, bool backward) {
  check_rope(names(backward), q, k, cos, sin, unsqueeze_dim);
  return {has(q) ? out_like(unit_last(*q)) : Tensor(), has(k) ? out_like(unit_last(*k)) : Tensor()};
}

RopeOut rope_fwd_meta(const Tensor& q, const OptTensor& k, const Tensor& cos, const Tensor& sin,
                      int64_t unsqueeze_dim, bool interleaved) {
  return rope_meta(q, k, cos, sin, unsqueeze_dim, interleaved, false);
}

RopeOut rope_bwd_meta(const OptTensor& grad_q, const OptTensor& grad_k, const Tensor& cos, const Tensor& sin,
                      int64_t unsqueeze_dim, bool interleaved) {
  return rope_meta(grad_q, grad_k, cos, sin, unsqueeze_dim, interleaved, true);
}

std::tuple<Tensor, Tensor> rope_gather(const Tensor& cos, const Tensor& sin, const OptTensor& position_ids) {
  if (!has(position_ids) || cos.dim() != 2) return {cos, sin};
  const char* op = "fused_layernorm.rope";
  const Tensor& pos = *position_ids;
  TORCH_CHECK_VALUE(pos.scalar_type() == at::kLong || pos.scalar_type() == at::kInt, op,
                    ": position_ids must be int64 or int32, got ", pos.scalar_type());
  TORCH_CHECK_VALUE(pos.dim() == 1 || pos.dim() == 2, op,
                    ": position_ids must have shape [batch, seq_len] or [seq_len], got ", dims(pos.sym_sizes()));
  TORCH_CHECK_VALUE(sin.dim() == 2 && sin.sym_sizes().equals(cos.sym_sizes()), op,
                    ": sin must have cos's shape, got cos ", dims(cos.sym_sizes()), " and sin ", dims(sin.sym_sizes()));
  TORCH_CHECK(pos.device() == cos.device(), op, ": position_ids is on ", pos.device(), " but cos is on ",
              cos.device(), "; they must be on the same device");
  // torch's indexing checks the positions (an IndexError on the CPU, a device-side assert on CUDA, as HF's cos[position_ids]).
  return {cos.index({pos}), sin.index({pos})};
}

// ---------------------------------------------------------------------------
// CPU backend.
// ---------------------------------------------------------------------------
namespace {

// The instruction set's build of csrc/kernels/rope/cpu.h (cpu_kernels.h).
void run_cpu_rope(const RopeParams& p, at::ScalarType t, at::ScalarType c, const Tensor&) { cpu_rope(p, t, c); }

}  // namespace

const RopeBackend kCpuRope{&run_cpu_rope};

}  // namespace fln::glue
