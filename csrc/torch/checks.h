// Argument checks shared by every op and backend (meta included): each error
// names the op and the argument.  Shapes are read as SymInts so the same
// checks run on fake tensors under torch.compile.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

namespace fln::glue {

// Checks input / normalized_shape / weight / bias and returns the dtype the
// kernels use for weight and bias (the input's dtype when both are absent).
// With allow_empty, normalized_shape may hold zeros (an empty row, which
// torch's layer_norm and rms_norm accept); otherwise its sizes must be positive.
at::ScalarType check_norm_args(const char* op, const at::Tensor& input, at::IntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                               bool allow_empty = false);

// Checks a tensor that must match `input` in shape, dtype and device (grad_out).
void check_like_input(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input);

// Checks saved statistics: shape = leading dims of input, acc dtype, input's device.
void check_stats(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input,
                 at::IntArrayRef normalized_shape);

// Statistics dtype: float32, float64 for double inputs.
inline at::ScalarType stats_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// eps for RMSNorm when None: machine epsilon of the compute dtype, as torch does.
double default_rms_eps(at::ScalarType t);

}  // namespace fln::glue
