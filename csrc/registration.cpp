// The one registration file: every schema is defined here once, and each
// backend (CPU, CUDA, Meta, Autograd, CompositeExplicitAutograd) supplies its
// kernels.  Loading the extension's shared library runs these registrations.
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>
#include <torch/python.h>

#include <string>

#include "torch/add_norm_ops.h"
#include "torch/cpu_kernels.h"
#include "torch/norm_ops.h"
#include "torch/rope_ops.h"
#include "torch/softmax_ops.h"

using namespace fln::glue;

TORCH_LIBRARY(fused_layernorm, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("layer_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps)"
        " -> (Tensor, Tensor, Tensor)", tags);
  m.def("layer_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd,"
        " Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)", tags);
  m.def("rms_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)", tags);
  m.def("rms_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, Tensor? weight,"
        " bool[2] output_mask) -> (Tensor, Tensor)", tags);
  m.def("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None,"
        " float eps=1e-05) -> Tensor", tags);
  m.def("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor", tags);
  // The fused pre-norm op: h = dropout(input) + residual, y = norm(h) * (weight + weight_offset) + bias.
  const std::vector<at::Tag> seeded{at::Tag::pt2_compliant_tag, at::Tag::nondeterministic_seeded};
  m.def("add_norm_fwd(Tensor input, Tensor? residual, int[] normalized_shape, Tensor? weight, Tensor? bias,"
        " float? eps, bool rms, float dropout_p, float weight_offset, ScalarType? residual_dtype, bool store_h,"
        " bool store_mask, Generator? generator) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", seeded);
  m.def("add_norm_bwd(Tensor grad_out, Tensor? grad_h, Tensor h, int[] normalized_shape, Tensor? mean, Tensor rstd,"
        " Tensor? weight, Tensor? bias, bool rms, float dropout_p, float weight_offset, Tensor? rng_state,"
        " ScalarType input_dtype, bool[4] output_mask) -> (Tensor, Tensor, Tensor, Tensor)", tags);
  m.def("add_norm(Tensor input, Tensor? residual, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None,"
        " float? eps=None, bool rms=False, float dropout_p=0., float weight_offset=0., ScalarType? residual_dtype=None,"
        " bool return_residual=False, bool return_mask=False, Generator? generator=None) -> (Tensor, Tensor, Tensor)",
        seeded);
  // Rotary position embedding, as Hugging Face's apply_rotary_pos_emb: (q_embed, k_embed).  The backward is
  // the rotation by -theta; an absent k or gradient gives an undefined output.
  m.def("rope_fwd(Tensor q, Tensor? k, Tensor cos, Tensor sin, int unsqueeze_dim, bool interleaved)"
        " -> (Tensor, Tensor)", tags);
  m.def("rope_bwd(Tensor? grad_q, Tensor? grad_k, Tensor cos, Tensor sin, int unsqueeze_dim, bool interleaved)"
        " -> (Tensor, Tensor)", tags);
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? position_ids=None, int unsqueeze_dim=1,"
        " bool interleaved=False) -> (Tensor, Tensor)", tags);
  // Softmax / log-softmax over the last dim of z = scale * input, causal: the attention mask of
  // [..., q_len, k_len] inputs (query i keeps keys j <= i + k_len - q_len), applied in the kernel.
  m.def("softmax_fwd(Tensor input, bool log, float scale, bool causal) -> Tensor", tags);
  m.def("softmax_bwd(Tensor output, Tensor grad_output, bool log, float scale, bool causal) -> Tensor", tags);
  m.def("softmax(Tensor input, int dim=-1, bool log=False, float scale=1., bool causal=False) -> Tensor", tags);
}

TORCH_LIBRARY_IMPL(fused_layernorm, CPU, m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd<kCpuBackend>);
  m.impl("layer_norm_bwd", &layer_norm_bwd<kCpuBackend>);
  m.impl("rms_norm_fwd", &rms_norm_fwd<kCpuBackend>);
  m.impl("rms_norm_bwd", &rms_norm_bwd<kCpuBackend>);
  m.impl("layer_norm", &layer_norm_y<kCpuBackend>);
  m.impl("rms_norm", &rms_norm_y<kCpuBackend>);
  m.impl("add_norm_fwd", &add_norm_fwd<kCpuAddNorm>);
  m.impl("add_norm_bwd", &add_norm_bwd<kCpuAddNorm>);
  m.impl("rope_fwd", &rope_fwd<kCpuRope>);
  m.impl("rope_bwd", &rope_bwd<kCpuRope>);
  m.impl("softmax_fwd", &softmax_fwd<kCpuSoftmax>);
  m.impl("softmax_bwd", &softmax_bwd<kCpuSoftmax>);
}

#ifdef FLN_WITH_CUDA
TORCH_LIBRARY_IMPL(fused_layernorm, CUDA, m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd<kCudaBackend>);
  m.impl("layer_norm_bwd", &layer_norm_bwd<kCudaBackend>);
  m.impl("rms_norm_fwd", &rms_norm_fwd<kCudaBackend>);
  m.impl("rms_norm_bwd", &rms_norm_bwd<kCudaBackend>);
  m.impl("layer_norm", &layer_norm_y<kCudaBackend>);
  m.impl("rms_norm", &rms_norm_y<kCudaBackend>);
  m.impl("add_norm_fwd", &add_norm_fwd<kCudaAddNorm>);
  m.impl("add_norm_bwd", &add_norm_bwd<kCudaAddNorm>);
  m.impl("rope_fwd", &rope_fwd<kCudaRope>);
  m.impl("rope_bwd", &rope_bwd<kCudaRope>);
  m.impl("softmax_fwd", &softmax_fwd<kCudaSoftmax>);
  m.impl("softmax_bwd", &softmax_bwd<kCudaSoftmax>);
}
#endif

TORCH_LIBRARY_IMPL(fused_layernorm, Meta, m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd_meta);
  m.impl("layer_norm_bwd", &layer_norm_bwd_meta);
  m.impl("rms_norm_fwd", &rms_norm_fwd_meta);
  m.impl("rms_norm_bwd", &rms_norm_bwd_meta);
  m.impl("add_norm_fwd", &add_norm_fwd_meta);
  m.impl("add_norm_bwd", &add_norm_bwd_meta);
  m.impl("rope_fwd", &rope_fwd_meta);
  m.impl("rope_bwd", &rope_bwd_meta);
  m.impl("softmax_fwd", &softmax_fwd_meta);
  m.impl("softmax_bwd", &softmax_bwd_meta);
}

// The fwd/bwd ops have no derivative of their own: called where autograd
// records (a direct call on inputs that require grad, or the backward op
// with a forward-mode tangent), their outputs get a node that raises "not
// implemented" if differentiated, rather than gradients that silently miss a
// term.  (The differentiable ops' backward under create_graph does not call
// them: see autograd.cpp.)
TORCH_LIBRARY_IMPL(fused_layernorm, Autograd, m) {
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_norm", &add_norm_autograd);
  m.impl("rope", &rope_autograd);
  m.impl("softmax", &softmax_autograd);
  for (const char* op : {"layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd", "add_norm_fwd", "add_norm_bwd",
                         "rope_fwd", "rope_bwd", "softmax_fwd", "softmax_bwd"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}

// Other backends (Meta: fake tensors under torch.compile) take the forward
// op's y.
TORCH_LIBRARY_IMPL(fused_layernorm, CompositeExplicitAutograd, m) {
  m.impl("layer_norm", &layer_norm_composite);
  m.impl("rms_norm", &rms_norm_composite);
  m.impl("add_norm", &add_norm_composite);
  m.impl("rope", &rope_composite);
  m.impl("softmax", &softmax_composite);
}

// `import fused_layernorm._C` loads this library (and so the registrations).
// Its two functions are the eager fast path of fused_layernorm.functional:
// the same ops through the dispatcher, without the boxed torch.ops call.
namespace {

// eps as torch's own bindings read a float: a number (float, int, bool, or
// anything with __float__ such as a 0-d tensor), never a string, which
// Python's float() would parse.  A TypeError that names the argument.
double eps_arg(const char* op, pybind11::handle eps) {
  PyObject* o = eps.ptr();
  if (!PyUnicode_Check(o) && !PyBytes_Check(o)) {
    const double v = PyFloat_AsDouble(o);
    if (!(v == -1.0 && PyErr_Occurred())) return v;
    PyErr_Clear();
  }
  throw pybind11::type_error(std::string(op) + ": eps must be a number (float), got " +
                             std::string(Py_TYPE(o)->tp_name));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fused_layernorm ops (registered with torch as torch.ops.fused_layernorm)";
  m.def("layer_norm", [](const Tensor& input, std::vector<int64_t> shape, const OptTensor& w, const OptTensor& b,
                         pybind11::handle eps) {
    return layer_norm_call(input, shape, w, b, eps_arg("fused_layernorm.layer_norm", eps));
  });
  m.def("rms_norm", [](const Tensor& input, std::vector<int64_t> shape, const OptTensor& w, pybind11::handle eps) {
    const std::optional<double> e =
        eps.is_none() ? std::nullopt : std::optional<double>(eps_arg("fused_layernorm.rms_norm", eps));
    return rms_norm_call(input, shape, w, e);
  });
  m.def("cpu_isa", &cpu_kernels_isa, "The instruction set the CPU kernels run with (base, avx2, avx512)");
}
