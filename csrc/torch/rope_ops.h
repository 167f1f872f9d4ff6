// The rotary position embedding op: q and k rotated by per-position cos/sin,
// as Hugging Face's apply_rotary_pos_emb.  Op bodies shared by the CPU and
// CUDA backends (checks, outputs, kernel parameters), meta kernels and
// autograd.  A backend supplies the kernel call.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "../kernels/rope/params.h"

namespace fln::glue {

using RopeOut = std::tuple<at::Tensor, at::Tensor>;

struct RopeBackend {
  // t: q's and k's dtype; c: cos's and sin's.
  void (*run)(const RopeParams& p, at::ScalarType t, at::ScalarType c, const at::Tensor& like);
};

extern const RopeBackend kCpuRope;
#ifdef FLN_WITH_CUDA
extern const RopeBackend kCudaRope;
#endif

// (q_out, k_out) for per-position cos/sin ([batch or 1, seq or 1, rotary_dim],
// or [seq, rotary_dim]); backward: the gradients (rotation by -theta).  An
// absent k (or grad) gives an undefined output.
RopeOut rope_impl(const RopeBackend& be, const std::optional<at::Tensor>& q, const std::optional<at::Tensor>& k,
                  const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved,
                  bool backward);
RopeOut rope_meta(const std::optional<at::Tensor>& q, const std::optional<at::Tensor>& k, const at::Tensor& cos,
                  const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved, bool backward);

template <const RopeBackend& Be>
RopeOut rope_fwd(const at::Tensor& q, const std::optional<at::Tensor>& k, const at::Tensor& cos, const at::Tensor& sin,
                 int64_t unsqueeze_dim, bool interleaved) {
  return rope_impl(Be, q, k, cos, sin, unsqueeze_dim, interleaved, false);
}
template <const RopeBackend& Be>
RopeOut rope_bwd(const std::optional<at::Tensor>& grad_q, const std::optional<at::Tensor>& grad_k,
                 const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved) {
  return rope_impl(Be, grad_q, grad_k, cos, sin, unsqueeze_dim, interleaved, true);
}
RopeOut rope_fwd_meta(const at::Tensor& q, const std::optional<at::Tensor>& k, const at::Tensor& cos,
                      const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved);
RopeOut rope_bwd_meta(const std::optional<at::Tensor>& grad_q, const std::optional<at::Tensor>& grad_k,
                      const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved);

// cos and sin at position_ids when they are tables [max_positions, rotary_dim]
// (Hugging Face before 4.40); per-position cos/sin come back unchanged
// (position_ids is then ignored, as Hugging Face 4.40+ does).
std::tuple<at::Tensor, at::Tensor> rope_gather(const at::Tensor& cos, const at::Tensor& sin,
                                               const std::optional<at::Tensor>& position_ids);

// The differentiable op (Autograd) and its below-autograd form.
RopeOut rope_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                      const std::optional<at::Tensor>& position_ids, int64_t unsqueeze_dim, bool interleaved);
RopeOut rope_composite(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                       const std::optional<at::Tensor>& position_ids, int64_t unsqueeze_dim, bool interleaved);

}  // namespace fln::glue
