#include "checks.h"

#include <c10/util/Exception.h>

#include <limits>
#include <string>

namespace fln::glue {

// Shapes are formatted here with std::to_string, never by streaming integers:
// one device machine's toolchain (g++ from /opt/gcc over another libstdc++'s
// headers) segfaulted in ostream::operator<<(long) inside this library.
static std::string dims(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

static std::string dims(c10::SymIntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto v = s[i].maybe_as_int();
    out += (i ? ", " : "") + (v ? std::to_string(*v) : std::string("?"));
  }
  return out + "]";
}

static bool supported_dtype(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

static void check_param(const char* op, const char* name, const at::Tensor& p, const at::Tensor& input,
                        at::IntArrayRef normalized_shape) {
  TORCH_CHECK_VALUE(p.sym_sizes().equals(c10::fromIntArrayRefSlow(normalized_shape)), op, ": ", name,
                    " must have shape normalized_shape = ", dims(normalized_shape), ", got ", dims(p.sym_sizes()));
  TORCH_CHECK_VALUE(p.scalar_type() == input.scalar_type() || p.scalar_type() == at::kFloat, op, ": ", name,
                    " must have the input's dtype (", input.scalar_type(), ") or float32, got ", p.scalar_type());
  TORCH_CHECK(p.device() == input.device(), op, ": ", name, " is on ", p.device(),
              " but input is on ", input.device(), "; they must be on the same device");
}

at::ScalarType check_norm_args(const char* op, const at::Tensor& input, at::IntArrayRef normalized_shape,
                               const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                               bool allow_empty) {
  TORCH_CHECK_VALUE(input.defined(), op, ": input is undefined");
  TORCH_CHECK_VALUE(supported_dtype(input.scalar_type()), op,
                    ": input must be float64, float32, float16 or bfloat16, got ", input.scalar_type());
  const int64_t k = int64_t(normalized_shape.size()), nd = input.dim();
  TORCH_CHECK_VALUE(k >= 1, op, ": normalized_shape must have at least one dimension");
  TORCH_CHECK_VALUE(k <= nd, op, ": normalized_shape ", dims(normalized_shape),
                    " has more dimensions than input (shape ", dims(input.sym_sizes()), ")");
  for (int64_t j = 0; j < k; ++j) {
    TORCH_CHECK_VALUE(normalized_shape[j] > 0 || (allow_empty && normalized_shape[j] == 0), op,
                      ": normalized_shape must be ", allow_empty ? "non-negative" : "positive", ", got ",
                      dims(normalized_shape));
    TORCH_CHECK_VALUE(input.sym_size(nd - k + j) == normalized_shape[j], op, ": normalized_shape ",
                      dims(normalized_shape), " does not match the trailing dimensions of input (shape ",
                      dims(input.sym_sizes()), ")");
  }
  const bool has_w = weight.has_value() && weight->defined(), has_b = bias.has_value() && bias->defined();
  if (has_w) check_param(op, "weight", *weight, input, normalized_shape);
  if (has_b) check_param(op, "bias", *bias, input, normalized_shape);
  if (has_w && has_b)
    TORCH_CHECK_VALUE(weight->scalar_type() == bias->scalar_type(), op, ": weight (", weight->scalar_type(),
                      ") and bias (", bias->scalar_type(), ") must have the same dtype");
  return has_w ? weight->scalar_type() : has_b ? bias->scalar_type() : input.scalar_type();
}

void check_like_input(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.sym_sizes().equals(input.sym_sizes()), op, ": ", name, " must have the input's shape ",
                    dims(input.sym_sizes()), ", got ", dims(t.sym_sizes()));
  TORCH_CHECK_VALUE(t.scalar_type() == input.scalar_type(), op, ": ", name, " must have the input's dtype ",
                    input.scalar_type(), ", got ", t.scalar_type());
  TORCH_CHECK(t.device() == input.device(), op, ": ", name, " is on ", t.device(), " but input is on ",
              input.device());
}

void check_stats(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input,
                 at::IntArrayRef normalized_shape) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  const auto lead = input.sym_sizes().slice(0, input.dim() - int64_t(normalized_shape.size()));
  TORCH_CHECK_VALUE(t.sym_sizes().equals(lead), op, ": ", name, " must have shape ", dims(lead), ", got ",
                    dims(t.sym_sizes()));
  TORCH_CHECK_VALUE(t.scalar_type() == stats_dtype(input.scalar_type()), op, ": ", name, " must be ",
                    stats_dtype(input.scalar_type()), ", got ", t.scalar_type());
  TORCH_CHECK(t.device() == input.device(), op, ": ", name, " is on ", t.device(), " but input is on ",
              input.device());
}

double default_rms_eps(at::ScalarType t) {
  // What torch.nn.functional.rms_norm does: machine epsilon of the compute
  // type (float32 for half and bfloat16 inputs), so results match torch.
  return t == at::kDouble ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

}  // namespace fln::glue
