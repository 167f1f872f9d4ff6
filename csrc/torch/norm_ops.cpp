#include "norm_ops.h"

#include <ATen/ATen.h>

#include <limits>

#include "checks.h"
#include "rows.h"

namespace fln::glue {

namespace {

int64_t product(at::IntArrayRef s) {
  int64_t p = 1;
  for (int64_t v : s) p *= v;
  return p;
}

const void* opt_ptr(const Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

Tensor contiguous_param(const OptTensor& p) {
  return p.has_value() && p->defined() ? p->contiguous() : Tensor();
}

}  // namespace

double rms_eps(const Tensor& input, std::optional<double> eps) {
  return eps.has_value() ? *eps : default_rms_eps(input.scalar_type());
}

std::tuple<Tensor, Tensor, Tensor> norm_fwd(const Backend& be, const char* op, const Tensor& input,
                                            at::IntArrayRef normalized_shape, const OptTensor& weight,
                                            const OptTensor& bias, double eps, bool rms, bool stats) {
  const at::ScalarType wt = check_norm_args(op, input, normalized_shape, weight, bias, /*allow_empty=*/true);
  const auto lead = input.sizes().slice(0, input.dim() - int64_t(normalized_shape.size()));
  const auto stats_opts = input.options().dtype(stats_dtype(input.scalar_type()));
  const int64_t cols = product(normalized_shape);
  if (cols == 0) {
    // Empty rows, as torch: y is empty, and the statistics of an empty row
    // are those of 0 / 0 (mean 0, rstd NaN), never read by the backward.
    Tensor y = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
    Tensor mean = rms || !stats ? Tensor() : at::zeros(lead, stats_opts);
    Tensor rstd = stats ? at::full(lead, std::numeric_limits<double>::quiet_NaN(), stats_opts) : Tensor();
    return {y, mean, rstd};
  }
  const int64_t rows = input.numel() / cols;
  const Rows x = rows_view(input, rows, cols);
  Tensor w = contiguous_param(weight), b = contiguous_param(bias);
  Tensor y = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  Tensor mean = rms || !stats ? Tensor() : at::empty(lead, stats_opts);
  Tensor rstd = stats ? at::empty(lead, stats_opts) : Tensor();
  if (rows == 0) return {y, mean, rstd};
  FwdParams p;
  p.rows = rows;
  p.cols = cols;
  p.x_stride = x.stride;
  p.x = x.t.const_data_ptr();
  p.w = opt_ptr(w);
  p.b = opt_ptr(b);
  p.y = y.mutable_data_ptr();
  p.mean = mean.defined() ? mean.mutable_data_ptr() : nullptr;
  p.rstd = rstd.defined() ? rstd.mutable_data_ptr() : nullptr;
  p.eps = eps;
  p.rms = rms;
  be.fwd(p, input.scalar_type(), wt, input);
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> norm_bwd(const Backend& be, const char* op, const Tensor& grad_out,
                                            const Tensor& input, at::IntArrayRef normalized_shape,
                                            const Tensor& mean, const Tensor& rstd, const OptTensor& weight,
                                            const OptTensor& bias, std::array<bool, 3> mask, bool rms) {
  const at::ScalarType wt = check_norm_args(op, input, normalized_shape, weight, bias, /*allow_empty=*/true);
  check_like_input(op, "grad_out", grad_out, input);
  if (!rms) check_stats(op, "mean", mean, input, normalized_shape);
  check_stats(op, "rstd", rstd, input, normalized_shape);
  const int64_t cols = product(normalized_shape), rows = cols == 0 ? 0 : input.numel() / cols;
  Tensor w = contiguous_param(weight);
  const bool has_b = bias.has_value() && bias->defined();
  Tensor dx = mask[0] ? at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous))
                      : Tensor();
  Tensor dw = mask[1] && w.defined() ? at::empty(normalized_shape, w.options()) : Tensor();
  Tensor db = mask[2] && has_b ? at::empty(normalized_shape, bias->options()) : Tensor();
  if (cols == 0) return {dx, dw, db};  // every output is empty
  if (!dw.defined() && !db.defined() && (!dx.defined() || rows == 0)) return {dx, dw, db};
  const Rows x = rows_view(input, rows, cols), dy = rows_view(grad_out, rows, cols);
  Tensor mean_c = rms ? Tensor() : mean.contiguous(), rstd_c = rstd.contiguous();
  BwdParams p;
  p.rows = rows;
  p.cols = cols;
  p.x_stride = x.stride;
  p.dy_stride = dy.stride;
  p.x = x.t.const_data_ptr();
  p.dy = dy.t.const_data_ptr();
  p.mean = opt_ptr(mean_c);
  p.rstd = rstd_c.const_data_ptr();
  p.w = opt_ptr(w);
  p.dx = dx.defined() ? dx.mutable_data_ptr() : nullptr;
  p.dw = dw.defined() ? dw.mutable_data_ptr() : nullptr;
  p.db = db.defined() ? db.mutable_data_ptr() : nullptr;
  p.rms = rms;
  be.bwd(p, input.scalar_type(), wt, input);
  return {dx, dw, db};
}

}  // namespace fln::glue
