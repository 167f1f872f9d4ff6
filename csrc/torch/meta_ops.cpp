// Meta kernels: shapes and dtypes of the outputs, with the real checks, for
// fake tensors (torch.compile, opcheck).  Leading dims stay symbolic.
#include <ATen/ATen.h>

#include "checks.h"
#include "norm_ops.h"

namespace fln::glue {

namespace {

std::tuple<Tensor, Tensor, Tensor> fwd_meta(const char* op, const Tensor& input, at::IntArrayRef shape,
                                            const OptTensor& w, const OptTensor& b, bool rms) {
  check_norm_args(op, input, shape, w, b, /*allow_empty=*/true);
  const auto lead = input.sym_sizes().slice(0, input.dim() - int64_t(shape.size()));
  const auto stats_opts = input.options().dtype(stats_dtype(input.scalar_type()));
  Tensor y = at::empty_symint(input.sym_sizes(), input.options());
  Tensor mean = rms ? Tensor() : at::empty_symint(lead, stats_opts);
  return {y, mean, at::empty_symint(lead, stats_opts)};
}

std::tuple<Tensor, Tensor, Tensor> bwd_meta(const char* op, const Tensor& dy, const Tensor& input,
                                            at::IntArrayRef shape, const Tensor& mean, const Tensor& rstd,
                                            const OptTensor& w, const OptTensor& b, std::array<bool, 3> mask,
                                            bool rms) {
  check_norm_args(op, input, shape, w, b, /*allow_empty=*/true);
  check_like_input(op, "grad_out", dy, input);
  if (!rms) check_stats(op, "mean", mean, input, shape);
  check_stats(op, "rstd", rstd, input, shape);
  Tensor dx = mask[0] ? at::empty_symint(input.sym_sizes(), input.options()) : Tensor();
  Tensor dw = mask[1] && w.has_value() && w->defined() ? at::empty(shape, w->options()) : Tensor();
  Tensor db = mask[2] && b.has_value() && b->defined() ? at::empty(shape, b->options()) : Tensor();
  return {dx, dw, db};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_meta(const Tensor& input, at::IntArrayRef shape,
                                                       const OptTensor& w, const OptTensor& b, double) {
  return fwd_meta("fused_layernorm.layer_norm", input, shape, w, b, false);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd_meta(const Tensor& dy, const Tensor& input, at::IntArrayRef shape,
                                                       const Tensor& mean, const Tensor& rstd, const OptTensor& w,
                                                       const OptTensor& b, std::array<bool, 3> mask) {
  return bwd_meta("fused_layernorm.layer_norm_bwd", dy, input, shape, mean, rstd, w, b, mask, false);
}

std::tuple<Tensor, Tensor> rms_norm_fwd_meta(const Tensor& input, at::IntArrayRef shape, const OptTensor& w,
                                             std::optional<double>) {
  auto [y, mean, rstd] = fwd_meta("fused_layernorm.rms_norm", input, shape, w, std::nullopt, true);
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_bwd_meta(const Tensor& dy, const Tensor& input, at::IntArrayRef shape,
                                             const Tensor& rstd, const OptTensor& w, std::array<bool, 2> mask) {
  auto [dx, dw, db] = bwd_meta("fused_layernorm.rms_norm_bwd", dy, input, shape, Tensor(), rstd, w, std::nullopt,
                               {mask[0], mask[1], false}, true);
  return {dx, dw};
}

}  // namespace fln::glue
