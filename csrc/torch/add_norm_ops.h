// The fused pre-norm op, h = dropout(x) + residual, y = norm(h) * (w +
// weight_offset) + b: op bodies shared by the CPU and CUDA backends (checks,
// outputs, kernel parameters), meta kernels and autograd.  A backend
// supplies the kernel calls and its dropout generator.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

#include "../kernels/add_norm/params.h"

namespace fln::glue {

using at::Tensor;
using OptTensor = std::optional<at::Tensor>;
using OptGenerator = std::optional<at::Generator>;

struct AddNormBackend {
  // xt, wt, rt: the dtypes of x, the weight and h.
  void (*fwd)(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt, const Tensor& like);
  void (*bwd)(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt, const Tensor& like);
  // Seed and offset for one call, drawn from the generator (or the device's default).
  DropoutRng (*draw)(const OptGenerator& gen, const Tensor& like);
};

extern const AddNormBackend kCpuAddNorm;
#ifdef FLN_WITH_CUDA
extern const AddNormBackend kCudaAddNorm;
#endif

// (y, h, mean, rstd, rng_state, mask).  h is written when store_h (else an
// empty tensor: h is x); mean is empty for RMSNorm; rng_state (int64 [seed,
// offset]) and mask (bool) are empty without dropout (mask: without store_mask).
using FwdOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
// (dx, dresidual, dweight, dbias).  dresidual is undefined when it equals dx
// (no dropout and h of x's dtype): dx then serves both.
using BwdOut = std::tuple<Tensor, Tensor, Tensor, Tensor>;

FwdOut add_norm_fwd_impl(const AddNormBackend& be, const Tensor& input, const OptTensor& residual,
                         at::IntArrayRef shape, const OptTensor& weight, const OptTensor& bias,
                         std::optional<double> eps, bool rms, double dropout_p, double weight_offset,
                         std::optional<at::ScalarType> residual_dtype, bool store_h, bool store_mask,
                         const OptGenerator& gen);
BwdOut add_norm_bwd_impl(const AddNormBackend& be, const Tensor& grad_out, const OptTensor& grad_h, const Tensor& h,
                         at::IntArrayRef shape, const OptTensor& mean, const Tensor& rstd, const OptTensor& weight,
                         const OptTensor& bias, bool rms, double dropout_p, double weight_offset,
                         const OptTensor& rng_state, at::ScalarType input_dtype, std::array<bool, 4> mask);

template <const AddNormBackend& Be>
FwdOut add_norm_fwd(const Tensor& input, const OptTensor& residual, at::IntArrayRef shape, const OptTensor& w,
                    const OptTensor& b, std::optional<double> eps, bool rms, double p, double offset,
                    std::optional<at::ScalarType> rt, bool store_h, bool store_mask, const OptGenerator& gen) {
  return add_norm_fwd_impl(Be, input, residual, shape, w, b, eps, rms, p, offset, rt, store_h, store_mask, gen);
}

template <const AddNormBackend& Be>
BwdOut add_norm_bwd(const Tensor& dy, const OptTensor& dh, const Tensor& h, at::IntArrayRef shape,
                    const OptTensor& mean, const Tensor& rstd, const OptTensor& w, const OptTensor& b, bool rms,
                    double p, double offset, const OptTensor& rng, at::ScalarType xt, std::array<bool, 4> mask) {
  return add_norm_bwd_impl(Be, dy, dh, h, shape, mean, rstd, w, b, rms, p, offset, rng, xt, mask);
}

FwdOut add_norm_fwd_meta(const Tensor& input, const OptTensor& residual, at::IntArrayRef shape, const OptTensor& w,
                         const OptTensor& b, std::optional<double> eps, bool rms, double p, double offset,
                         std::optional<at::ScalarType> rt, bool store_h, bool store_mask, const OptGenerator& gen);
BwdOut add_norm_bwd_meta(const Tensor& dy, const OptTensor& dh, const Tensor& h, at::IntArrayRef shape,
                         const OptTensor& mean, const Tensor& rstd, const OptTensor& w, const OptTensor& b, bool rms,
                         double p, double offset, const OptTensor& rng, at::ScalarType xt, std::array<bool, 4> mask);

// The differentiable op: (y, h, mask); h and mask are empty unless asked for.
std::tuple<Tensor, Tensor, Tensor> add_norm_autograd(const Tensor& input, const OptTensor& residual,
                                                     at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                                                     std::optional<double> eps, bool rms, double p, double offset,
                                                     std::optional<at::ScalarType> rt, bool return_residual,
                                                     bool return_mask, const OptGenerator& gen);
std::tuple<Tensor, Tensor, Tensor> add_norm_composite(const Tensor& input, const OptTensor& residual,
                                                      at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                                                      std::optional<double> eps, bool rms, double p, double offset,
                                                      std::optional<at::ScalarType> rt, bool return_residual,
                                                      bool return_mask, const OptGenerator& gen);

}  // namespace fln::glue
