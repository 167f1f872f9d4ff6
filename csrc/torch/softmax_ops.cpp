#include "softmax_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <string>

#include "cpu_kernels.h"
#include "dispatch.h"
#include "rows.h"

namespace fln::glue {

namespace {

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

bool supported(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

void check_x(const char* op, const char* name, const Tensor& x, bool causal) {
  TORCH_CHECK_VALUE(x.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(supported(x.scalar_type()), op, ": ", name,
                    " must be float64, float32, float16 or bfloat16, got ", x.scalar_type());
  if (causal) {
    TORCH_CHECK_VALUE(x.dim() >= 2, op, ": causal needs ", name,
                      " of shape [..., q_len, k_len] (at least 2 dims), got ", dims(x.sym_sizes()));
    TORCH_CHECK_VALUE(x.sym_size(-2) <= x.sym_size(-1), op, ": causal needs q_len <= k_len (the last two dims of ",
                      name, "; with q_len > k_len the first rows would keep no column), got ", dims(x.sym_sizes()));
  }
}

void check_bwd(const char* op, const Tensor& y, const Tensor& dy, bool causal) {
  check_x(op, "output", y, causal);
  TORCH_CHECK_VALUE(dy.defined(), op, ": grad_output is undefined");
  TORCH_CHECK_VALUE(dy.sym_sizes().equals(y.sym_sizes()), op, ": grad_output must have output's shape ",
                    dims(y.sym_sizes()), ", got ", dims(dy.sym_sizes()));
  TORCH_CHECK_VALUE(dy.scalar_type() == y.scalar_type(), op, ": grad_output must have output's dtype (",
                    y.scalar_type(), "), got ", dy.scalar_type());
  TORCH_CHECK(dy.device() == y.device(), op, ": grad_output is on ", dy.device(), " but output is on ", y.device(),
              "; they must be on the same device");
}

Tensor dense_like(const Tensor& t) { return at::empty_symint(t.sym_sizes(), t.options()); }

// rows x cols of the last dim (a 0-d tensor is one row of one).
SoftmaxParams geometry(const Tensor& x, bool log, double scale, bool causal) {
  SoftmaxParams p;
  p.cols = x.dim() == 0 ? 1 : x.size(-1);
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.log = log;
  p.scale = scale;
  p.causal = causal;
  p.q_len = causal ? x.size(-2) : 1;
  return p;
}

}  // namespace

Tensor softmax_fwd_impl(const SoftmaxBackend& be, const Tensor& input, bool log, double scale, bool causal) {
  const char* op = "fused_layernorm.softmax";
  check_x(op, "input", input, causal);
  Tensor y = dense_like(input);
  SoftmaxParams p = geometry(input, log, scale, causal);
  if (p.rows == 0) return y;
  const Rows in = rows_view(input, p.rows, p.cols);
  p.in = in.t.const_data_ptr();
  p.in_stride = in.stride;
  p.out = y.mutable_data_ptr();
  p.out_stride = p.cols;
  be.run(p, input.scalar_type(), input);
  return y;
}

Tensor softmax_bwd_impl(const SoftmaxBackend& be, const Tensor& output, const Tensor& grad_output, bool log,
                        double scale, bool causal) {
  const char* op = "fused_layernorm.softmax_backward";
  check_bwd(op, output, grad_output, causal);
  Tensor dx = dense_like(output);
  SoftmaxParams p = geometry(output, log, scale, causal);
  p.backward = true;
  if (p.rows == 0) return dx;
  const Rows y = rows_view(output, p.rows, p.cols), dy = rows_view(grad_output, p.rows, p.cols);
  p.in = y.t.const_data_ptr();
  p.in_stride = y.stride;
  p.grad = dy.t.const_data_ptr();
  p.grad_stride = dy.stride;
  p.out = dx.mutable_data_ptr();
  p.out_stride = p.cols;
  be.run(p, output.scalar_type(), output);
  return dx;
}

Tensor softmax_fwd_meta(const Tensor& input, bool, double, bool causal) {
  check_x("fused_layernorm.softmax", "input", input, causal);
  return dense_like(input);
}

Tensor softmax_bwd_meta(const Tensor& output, const Tensor& grad_output, bool, double, bool causal) {
  check_bwd("fused_layernorm.softmax_backward", output, grad_output, causal);
  return dense_like(output);
}

// ---------------------------------------------------------------------------
// CPU backend.
// ---------------------------------------------------------------------------
namespace {

// The instruction set's build of csrc/kernels/softmax/cpu.h (cpu_kernels.h).
void run_cpu_softmax(const SoftmaxParams& p, at::ScalarType t, const Tensor&) { cpu_softmax(p, t); }

}  // namespace

const SoftmaxBackend kCpuSoftmax{&run_cpu_softmax};

}  // namespace fln::glue
