#include "add_norm_ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <mutex>

#include "checks.h"
#include "cpu_kernels.h"
#include "rows.h"

namespace fln::glue {

namespace {

const char* op_name(bool rms) { return rms ? "fused_layernorm.rms_norm" : "fused_layernorm.layer_norm"; }

int64_t product(at::IntArrayRef s) {
  int64_t p = 1;
  for (int64_t v : s) p *= v;
  return p;
}

bool has(const OptTensor& t) { return t.has_value() && t->defined(); }

// Checks the forward's arguments; returns h's dtype.
at::ScalarType check_fwd(const char* op, const Tensor& input, const OptTensor& residual, at::IntArrayRef shape,
                         const OptTensor& w, const OptTensor& b, bool rms, double p,
                         std::optional<at::ScalarType> residual_dtype) {
  check_norm_args(op, input, shape, w, b, /*allow_empty=*/true);
  TORCH_CHECK_VALUE(!(rms && has(b)), op, ": RMSNorm takes no bias");
  TORCH_CHECK_VALUE(p >= 0.0 && p <= 1.0, op, ": dropout_p must be in [0, 1], got ", std::to_string(p));  // not streamed: checks.cpp
  at::ScalarType rt = residual_dtype ? *residual_dtype : has(residual) ? residual->scalar_type() : input.scalar_type();
  TORCH_CHECK_VALUE(rt == input.scalar_type() || (rt == at::kFloat && input.scalar_type() != at::kDouble), op,
                    ": residual_dtype must be the input's dtype (", input.scalar_type(),
                    ") or float32 (for 16-bit inputs), got ", rt);
  if (has(residual)) {
    TORCH_CHECK_VALUE(residual->sym_sizes().equals(input.sym_sizes()), op,
                      ": residual must have the input's shape");
    TORCH_CHECK_VALUE(at::isFloatingType(residual->scalar_type()), op, ": residual must be a floating tensor, got ",
                      residual->scalar_type());
    TORCH_CHECK(residual->device() == input.device(), op, ": residual is on ", residual->device(),
                " but input is on ", input.device(), "; they must be on the same device");
  }
  return rt;
}

void check_bwd(const char* op, const Tensor& dy, const OptTensor& dh, const Tensor& h, at::IntArrayRef shape,
               const OptTensor& mean, const Tensor& rstd, const OptTensor& w, const OptTensor& b, bool rms,
               at::ScalarType xt, double p, const OptTensor& rng) {
  check_norm_args(op, h, shape, std::nullopt, std::nullopt, /*allow_empty=*/true);
  TORCH_CHECK_VALUE(dy.sym_sizes().equals(h.sym_sizes()) && dy.scalar_type() == xt, op,
                    ": grad_out must have h's shape and the input's dtype");
  if (has(dh))
    TORCH_CHECK_VALUE(dh->sym_sizes().equals(h.sym_sizes()) && dh->scalar_type() == h.scalar_type(), op,
                      ": grad_h must have h's shape and dtype");
  if (has(w))
    TORCH_CHECK_VALUE(w->sym_sizes().equals(c10::fromIntArrayRefSlow(shape)), op, ": weight must have shape normalized_shape");
  if (has(b))
    TORCH_CHECK_VALUE(b->sym_sizes().equals(c10::fromIntArrayRefSlow(shape)), op, ": bias must have shape normalized_shape");
  if (!rms) {
    TORCH_CHECK_VALUE(has(mean), op, ": mean is required for LayerNorm");
    check_stats(op, "mean", *mean, h, shape);
  }
  TORCH_CHECK_VALUE(stats_dtype(h.scalar_type()) == stats_dtype(xt), op, ": h and the input must share a compute dtype");
  check_stats(op, "rstd", rstd, h, shape);
  TORCH_CHECK_VALUE(p == 0.0 || (has(rng) && rng->numel() == 2 && rng->scalar_type() == at::kLong), op,
                    ": dropout needs the forward's rng_state (int64, 2 elements)");
}

Tensor empty_like_rows(const Tensor& like, at::ScalarType dt) {
  return at::empty(like.sizes(), like.options().dtype(dt).memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace

FwdOut add_norm_fwd_impl(const AddNormBackend& be, const Tensor& input, const OptTensor& residual,
                         at::IntArrayRef shape, const OptTensor& weight, const OptTensor& bias,
                         std::optional<double> eps, bool rms, double dropout_p, double weight_offset,
                         std::optional<at::ScalarType> residual_dtype, bool store_h, bool store_mask,
                         const OptGenerator& gen) {
  const char* op = op_name(rms);
  const at::ScalarType rt = check_fwd(op, input, residual, shape, weight, bias, rms, dropout_p, residual_dtype);
  const at::ScalarType wt = has(weight) ? weight->scalar_type() : has(bias) ? bias->scalar_type() : input.scalar_type();
  const int64_t cols = product(shape), rows = cols ? input.numel() / cols : 0;  // an empty row: nothing to do
  const auto lead = input.sizes().slice(0, input.dim() - int64_t(shape.size()));
  const auto stats_opts = input.options().dtype(stats_dtype(input.scalar_type()));
  const bool dropout = dropout_p > 0.0;
  Tensor y = empty_like_rows(input, input.scalar_type());
  Tensor h = store_h ? empty_like_rows(input, rt) : at::empty({0}, input.options().dtype(rt));
  Tensor mean = rms ? at::empty({0}, stats_opts) : at::empty(lead, stats_opts);
  Tensor rstd = at::empty(lead, stats_opts);
  Tensor rng = at::empty({dropout ? 2 : 0}, input.options().dtype(at::kLong));
  Tensor mask = store_mask ? (dropout ? empty_like_rows(input, at::kBool) : at::ones(input.sizes(), input.options().dtype(at::kBool)))
                           : at::empty({0}, input.options().dtype(at::kBool));
  const Rows x = rows_view(input, rows, cols);
  Rows res{Tensor(), 0};
  if (has(residual)) res = rows_view(residual->scalar_type() == rt ? *residual : residual->to(rt), rows, cols);
  Tensor w = has(weight) ? weight->contiguous() : Tensor(), b = has(bias) ? bias->contiguous() : Tensor();
  AddNormFwdParams p;
  p.rows = rows;
  p.cols = cols;
  p.x = x.t.const_data_ptr();
  p.x_stride = x.stride;
  p.residual = res.t.defined() ? res.t.const_data_ptr() : nullptr;
  p.residual_stride = res.stride;
  p.w = w.defined() ? w.const_data_ptr() : nullptr;
  p.b = b.defined() ? b.const_data_ptr() : nullptr;
  p.y = y.mutable_data_ptr();
  p.h = store_h ? h.mutable_data_ptr() : nullptr;
  p.mean = rms ? nullptr : mean.mutable_data_ptr();
  p.rstd = rstd.mutable_data_ptr();
  p.mask = store_mask && dropout ? static_cast<uint8_t*>(mask.mutable_data_ptr()) : nullptr;
  p.eps = eps ? *eps : rms ? default_rms_eps(input.scalar_type()) : 1e-5;
  p.weight_offset = float(weight_offset);
  p.dropout_p = dropout_p;
  p.rms = rms;
  if (dropout) {
    p.rng = be.draw(gen, input);
    p.rng_out = rng.mutable_data_ptr<int64_t>();
  }
  if (rows == 0 || cols == 0) {  // no element. As torch, an empty row's statistics are 0 / 0: mean 0, rstd NaN
    mean.zero_();
    rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    if (dropout) rng.zero_();
    return {y, h, mean, rstd, rng, mask};
  }
  be.fwd(p, input.scalar_type(), wt, rt, input);
  return {y, h, mean, rstd, rng, mask};
}

BwdOut add_norm_bwd_impl(const AddNormBackend& be, const Tensor& grad_out, const OptTensor& grad_h, const Tensor& h,
                         at::IntArrayRef shape, const OptTensor& mean, const Tensor& rstd, const OptTensor& weight,
                         const OptTensor& bias, bool rms, double dropout_p, double weight_offset,
                         const OptTensor& rng_state, at::ScalarType input_dtype, std::array<bool, 4> mask) {
  const char* op = rms ? "fused_layernorm.rms_norm_backward" : "fused_layernorm.layer_norm_backward";
  check_bwd(op, grad_out, grad_h, h, shape, mean, rstd, weight, bias, rms, input_dtype, dropout_p, rng_state);
  const int64_t cols = product(shape), rows = cols ? h.numel() / cols : 0;
  const at::ScalarType rt = h.scalar_type();
  const bool shared = dropout_p == 0.0 && rt == input_dtype;  // dresidual == dx
  Tensor dx = mask[0] || (shared && mask[1]) ? empty_like_rows(h, input_dtype) : Tensor();
  Tensor dres = mask[1] && !shared ? empty_like_rows(h, rt) : Tensor();
  Tensor dw = mask[2] && has(weight) ? at::empty(shape, weight->options()) : Tensor();
  Tensor db = mask[3] && has(bias) ? at::empty(shape, bias->options()) : Tensor();
  if (cols == 0 || rows == 0) {  // no element: the weight gradients are sums of nothing
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
    return {dx, dres, dw, db};
  }
  if (!dw.defined() && !db.defined() && !dx.defined() && !dres.defined()) return {dx, dres, dw, db};
  const at::ScalarType wt = has(weight) ? weight->scalar_type() : input_dtype;
  const Rows hr = rows_view(h, rows, cols), dyr = rows_view(grad_out, rows, cols);
  Rows dhr{Tensor(), 0};
  if (has(grad_h)) dhr = rows_view(*grad_h, rows, cols);
  Tensor w = has(weight) ? weight->contiguous() : Tensor();
  Tensor mean_c = rms ? Tensor() : mean->contiguous(), rstd_c = rstd.contiguous();
  Tensor rng_c = dropout_p > 0.0 ? rng_state->contiguous() : Tensor();
  AddNormBwdParams p;
  p.rows = rows;
  p.cols = cols;
  p.h = hr.t.const_data_ptr();
  p.h_stride = hr.stride;
  p.dy = dyr.t.const_data_ptr();
  p.dy_stride = dyr.stride;
  p.dh = dhr.t.defined() ? dhr.t.const_data_ptr() : nullptr;
  p.dh_stride = dhr.stride;
  p.mean = mean_c.defined() ? mean_c.const_data_ptr() : nullptr;
  p.rstd = rstd_c.const_data_ptr();
  p.w = w.defined() ? w.const_data_ptr() : nullptr;
  p.dx = dx.defined() ? dx.mutable_data_ptr() : nullptr;
  p.dresidual = dres.defined() ? dres.mutable_data_ptr() : nullptr;
  p.dw = dw.defined() ? dw.mutable_data_ptr() : nullptr;
  p.db = db.defined() ? db.mutable_data_ptr() : nullptr;
  p.weight_offset = float(weight_offset);
  p.dropout_p = dropout_p;
  p.rms = rms;
  if (rng_c.defined()) {  // the forward's seed and offset, read on the device
    p.rng.seed_ptr = rng_c.const_data_ptr<int64_t>();
    p.rng.offset_ptr = p.rng.seed_ptr + 1;
  }
  be.bwd(p, input_dtype, wt, rt, h);
  return {dx, dres, dw, db};
}

FwdOut add_norm_fwd_meta(const Tensor& input, const OptTensor& residual, at::IntArrayRef shape, const OptTensor& w,
                         const OptTensor& b, std::optional<double>, bool rms, double dropout_p, double,
                         std::optional<at::ScalarType> residual_dtype, bool store_h, bool store_mask,
                         const OptGenerator&) {
  const char* op = op_name(rms);
  const at::ScalarType rt = check_fwd(op, input, residual, shape, w, b, rms, dropout_p, residual_dtype);
  const auto lead = input.sym_sizes().slice(0, input.dim() - int64_t(shape.size()));
  const auto stats_opts = input.options().dtype(stats_dtype(input.scalar_type()));
  const bool dropout = dropout_p > 0.0;
  auto full = [&](at::ScalarType dt) { return at::empty_symint(input.sym_sizes(), input.options().dtype(dt)); };
  auto none = [&](at::ScalarType dt) { return at::empty({0}, input.options().dtype(dt)); };
  return {full(input.scalar_type()),
          store_h ? full(rt) : none(rt),
          rms ? none(stats_opts.dtype().toScalarType()) : at::empty_symint(lead, stats_opts),
          at::empty_symint(lead, stats_opts),
          at::empty({dropout ? 2 : 0}, input.options().dtype(at::kLong)),
          store_mask ? full(at::kBool) : none(at::kBool)};
}

BwdOut add_norm_bwd_meta(const Tensor& dy, const OptTensor& dh, const Tensor& h, at::IntArrayRef shape,
                         const OptTensor& mean, const Tensor& rstd, const OptTensor& w, const OptTensor& b, bool rms,
                         double dropout_p, double, const OptTensor& rng, at::ScalarType xt, std::array<bool, 4> mask) {
  const char* op = rms ? "fused_layernorm.rms_norm_backward" : "fused_layernorm.layer_norm_backward";
  check_bwd(op, dy, dh, h, shape, mean, rstd, w, b, rms, xt, dropout_p, rng);
  const bool shared = dropout_p == 0.0 && h.scalar_type() == xt;
  auto full = [&](at::ScalarType dt) { return at::empty_symint(h.sym_sizes(), h.options().dtype(dt)); };
  return {mask[0] || (shared && mask[1]) ? full(xt) : Tensor(), mask[1] && !shared ? full(h.scalar_type()) : Tensor(),
          mask[2] && has(w) ? at::empty(shape, w->options()) : Tensor(),
          mask[3] && has(b) ? at::empty(shape, b->options()) : Tensor()};
}

// ---------------------------------------------------------------------------
// CPU backend.
// ---------------------------------------------------------------------------
namespace {

// The instruction set's build of csrc/kernels/add_norm/cpu.h (cpu_kernels.h).
void cpu_fwd(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt, const Tensor&) {
  cpu_add_norm_fwd(p, xt, wt, rt);
}

void cpu_bwd(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt, const Tensor&) {
  cpu_add_norm_bwd(p, xt, wt, rt);
}

DropoutRng cpu_draw(const OptGenerator& gen, const Tensor&) {
  auto* g = at::get_generator_or_default<at::CPUGeneratorImpl>(gen, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(g->mutex_);
  DropoutRng r;
  r.seed = g->random64();
  r.offset = 0;
  return r;
}

}  // namespace

const AddNormBackend kCpuAddNorm{&cpu_fwd, &cpu_bwd, &cpu_draw};

}  // namespace fln::glue
