"""Functional API.  Every call goes straight to one registered C++ op, which
checks its arguments, dispatches to the CPU or CUDA kernels and carries its own
autograd; nothing here does any math.

Plain tensors in eager mode take ``_C``'s bindings of the same ops (a typed
dispatcher call, about 2 us cheaper than the boxed ``torch.ops`` call);
anything else (``torch.compile`` tracing, tensor subclasses, FX proxies) takes
``torch.ops.fused_layernorm``, which those systems understand."""
import numbers
from typing import Optional, Sequence, Union

import torch
from torch import Tensor
from torch.compiler import is_compiling

from . import _C
from .distributed import maybe_register as _maybe_register_sharding

# The overloads themselves, looked up once: cheaper per call than the packets.
_layer_norm_op = torch.ops.fused_layernorm.layer_norm.default
_rms_norm_op = torch.ops.fused_layernorm.rms_norm.default


def _add_norm_op(*args):
    if type(args[0]) is not Tensor and not is_compiling():
        _maybe_register_sharding()
    # Looked up per call: the op may be absent from an older build of the extension.
    return torch.ops.fused_layernorm.add_norm.default(*args)


def _layer_norm(x, shape, weight, bias, eps):
    if type(x) is Tensor and not is_compiling():
        return _C.layer_norm(x, shape, weight, bias, eps)
    if not is_compiling():
        _maybe_register_sharding()  # a DTensor needs the sharding rules (cheap once registered)
    return _layer_norm_op(x, shape, weight, bias, eps)


def _rms_norm(x, shape, weight, eps):
    if type(x) is Tensor and not is_compiling():
        return _C.rms_norm(x, shape, weight, eps)
    if not is_compiling():
        _maybe_register_sharding()
    return _rms_norm_op(x, shape, weight, eps)


def _number(op: str, name: str, value) -> float:
    """``value`` as a float.  Numbers as torch takes them (int, float, bool, numpy
    scalars, 0-d tensors); anything else, a string included, is a TypeError
    rather than a silent ``float(value)``."""
    if type(value) is float:
        return value
    if isinstance(value, numbers.Real) or (isinstance(value, Tensor) and value.dim() == 0):
        return float(value)
    raise TypeError(f"fused_layernorm.{op}: {name} must be a number, got {type(value).__name__}")


def _fused(x, shape, weight, bias, eps, rms, residual, dropout_p, weight_offset, residual_dtype,
           return_residual, generator, return_dropout_mask):
    """The fused op: h = dropout(x) (+ residual), y = norm(h) * (weight + weight_offset) (+ bias).
    Returns y, then h if return_residual, then the keep mask if return_dropout_mask."""
    op = "rms_norm" if rms else "layer_norm"
    dropout_p = _number(op, "dropout_p", dropout_p)
    weight_offset = _number(op, "weight_offset", weight_offset)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"fused_layernorm.{op}: dropout_p must be in [0, 1], got {dropout_p}")
    if residual_dtype is not None and not isinstance(residual_dtype, torch.dtype):
        raise TypeError(f"fused_layernorm.{op}: residual_dtype must be a torch.dtype or None, "
                        f"got {type(residual_dtype).__name__}")
    y, h, mask = _add_norm_op(x, residual, shape, weight, bias, eps, rms, dropout_p, weight_offset,
                              residual_dtype, return_residual, return_dropout_mask, generator)
    out = (y,)
    if return_residual:
        out += (h,)
    if return_dropout_mask:
        out += (mask,)
    return out[0] if len(out) == 1 else out


def _plain(residual, dropout_p, weight_offset, residual_dtype, return_residual, return_dropout_mask) -> bool:
    return (residual is None and dropout_p == 0 and weight_offset == 0 and residual_dtype is None
            and not return_residual and not return_dropout_mask)


_Shape = Union[int, Sequence[int], torch.Size]


def _as_shape(normalized_shape: _Shape) -> list:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
    return list(normalized_shape)


_FUSED_DOC = """
    Fused pre-norm arguments (keyword only; all off by default, which is the plain op):

    * ``residual``: added after dropout, ``h = dropout(x) + residual`` (same shape as x).
    * ``dropout_p``: dropout on x before the add, drawn from ``generator`` (default: the
      device's default generator, so ``torch.manual_seed`` reproduces it and CUDA graphs
      replay it); the mask is recomputed in the backward, never stored.
    * ``weight_offset``: ``y = norm(h) * (weight + weight_offset) + bias``, the offset added in
      float32 (Gemma's ``1 + weight``).
    * ``residual_dtype``: dtype of h (e.g. float32 with bf16 activations); default the
      residual's dtype, else x's.
    * ``return_residual``: also return h (the pre-norm residual stream).  Gradients flowing
      into h are added in the backward kernel.
    * ``return_dropout_mask``: also return the keep mask (bool, x's shape), for tests.

    Returns ``y``, or a tuple ``(y, h)``, ``(y, mask)`` or ``(y, h, mask)``.
"""


def layer_norm(
    input: Tensor,
    normalized_shape: _Shape,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    *,
    residual: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    weight_offset: float = 0.0,
    residual_dtype: Optional[torch.dtype] = None,
    return_residual: bool = False,
    generator: Optional[torch.Generator] = None,
    return_dropout_mask: bool = False,
):
    """LayerNorm over the trailing ``normalized_shape`` dims of ``input``.

    Same contract as :func:`torch.nn.functional.layer_norm`: ``weight`` and
    ``bias`` (optional) have shape ``normalized_shape`` and the input's dtype or
    float32.  Statistics are computed in float32 (float64 for double inputs);
    the output has the input's dtype.  Differentiable in every tensor.
    """
    shape = _as_shape(normalized_shape)
    if _plain(residual, dropout_p, weight_offset, residual_dtype, return_residual, return_dropout_mask):
        return _layer_norm(input, shape, weight, bias, _number("layer_norm", "eps", eps))
    return _fused(input, shape, weight, bias, _number("layer_norm", "eps", eps), False, residual, dropout_p, weight_offset,
                  residual_dtype, return_residual, generator, return_dropout_mask)


def fused_layer_norm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    **fused,
):
    """LayerNorm over the last dimension of ``x`` (the seed's call).

    Equivalent to ``layer_norm(x, x.shape[-1:], weight, bias, eps, **fused)``.
    """
    if x.dim() == 0:
        raise ValueError("fused_layer_norm: input must have at least one dimension, got a 0-d tensor")
    if not fused:
        return _layer_norm(x, [x.shape[-1]], weight, bias, _number("layer_norm", "eps", eps))
    return layer_norm(x, [x.shape[-1]], weight, bias, eps, **fused)


def rms_norm(
    input: Tensor,
    normalized_shape: _Shape,
    weight: Optional[Tensor] = None,
    eps: Optional[float] = None,
    *,
    residual: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    weight_offset: float = 0.0,
    residual_dtype: Optional[torch.dtype] = None,
    return_residual: bool = False,
    generator: Optional[torch.Generator] = None,
    return_dropout_mask: bool = False,
):
    """RMSNorm over the trailing ``normalized_shape`` dims of ``input``.

    Same contract as :func:`torch.nn.functional.rms_norm`; ``eps=None`` means
    machine epsilon of the compute dtype, as torch does: ``torch.finfo(torch.float32).eps``
    for float16/bfloat16/float32 inputs and ``torch.finfo(torch.float64).eps`` for float64.
    """
    shape = _as_shape(normalized_shape)
    eps = None if eps is None else _number("rms_norm", "eps", eps)
    if _plain(residual, dropout_p, weight_offset, residual_dtype, return_residual, return_dropout_mask):
        return _rms_norm(input, shape, weight, eps)
    return _fused(input, shape, weight, None, eps, True, residual, dropout_p, weight_offset,
                  residual_dtype, return_residual, generator, return_dropout_mask)


def fused_rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = None, **fused):
    """RMSNorm over the last dimension of ``x``; ``eps=None`` as in :func:`rms_norm`."""
    if x.dim() == 0:
        raise ValueError("fused_rms_norm: input must have at least one dimension, got a 0-d tensor")
    return rms_norm(x, [x.shape[-1]], weight, eps, **fused)


layer_norm.__doc__ += _FUSED_DOC
rms_norm.__doc__ += _FUSED_DOC


def _rope_op(*args):
    # Looked up per call: the op may be absent from an older build of the extension.
    return torch.ops.fused_layernorm.rope.default(*args)


def apply_rotary_pos_emb(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    position_ids: Optional[Tensor] = None,
    unsqueeze_dim: int = 1,
    *,
    interleaved: bool = False,
):
    """Rotary position embedding of q and k in one kernel, forward and backward:
    Hugging Face's ``apply_rotary_pos_emb`` (Llama family), ``q * cos + rotate_half(q) * sin``.

    * ``q`` [batch, heads, seq, head_dim] and ``k`` [batch, kv_heads, seq, head_dim] with
      ``unsqueeze_dim=1`` (Hugging Face's layout), or [batch, seq, heads, head_dim] with
      ``unsqueeze_dim=2``; any strides with a unit last stride are read in place.  k may have
      fewer heads than q (GQA).  float64, float32, float16 or bfloat16; math in float32
      (float64 for float64).
    * ``cos``, ``sin`` [batch or 1, seq, rotary_dim] (or [seq, rotary_dim]), as Hugging Face's
      rotary embedding returns them: q's dtype, or float32 for 16-bit q.  rotary_dim is even
      and at most head_dim; the dims past it are passed through (partial rotary, GPT-NeoX style).
    * ``position_ids``: when cos and sin are tables [max_positions, rotary_dim], the rows at
      position_ids (Hugging Face before 4.40); with per-position cos/sin it is ignored, as
      Hugging Face 4.40+ does.
    * ``interleaved``: GPT-J's pairs (2i, 2i + 1) instead of Llama's halves (i, i + rotary_dim / 2).

    Returns ``(q_embed, k_embed)`` with q's and k's shapes and dtype, laid out as q and k
    where they are dense.  Differentiable in q, k, cos and sin; inputs are never modified.
    """
    return tuple(_rope_op(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved))


def _softmax_op(*args):
    # Looked up per call: the op may be absent from an older build of the extension.
    return torch.ops.fused_layernorm.softmax.default(*args)


def softmax(x: Tensor, dim: int = -1, *, log: bool = False, scale: float = 1.0, causal: bool = False) -> Tensor:
    """Softmax of ``scale * x`` over ``dim`` in one kernel, forward and backward
    (``log=True``: log-softmax).  Math in float32 (float64 for float64); float64,
    float32, float16 or bfloat16 in and out.

    * ``dim``: the last dim is read in place (rows with a unit inner stride, any row
      stride); another dim is moved to the last with one copy in and one out.
    * ``causal``: the attention form (Megatron's ``scaled_upper_triang_masked_softmax``)
      for x of shape [..., q_len, k_len] with ``q_len <= k_len`` and ``dim=-1``: query i
      keeps keys ``j <= i + k_len - q_len`` (q_len == k_len: the lower triangle with its
      diagonal).  Masked entries give 0 (log-softmax: -inf) and a zero gradient (their
      incoming gradient is ignored: they are constants); the
      mask is applied in the kernel, never materialized.
    * A row of only -inf gives NaN, as ``torch.softmax``.

    Returns a new contiguous tensor (with ``dim`` moved back) of x's shape and dtype;
    x is never modified.  The backward saves only the output.
    """
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"fused_layernorm.softmax: dim must be an int, got {type(dim).__name__}")
    scale = _number("softmax", "scale", scale)
    return _softmax_op(x, dim, bool(log), scale, bool(causal))


def log_softmax(x: Tensor, dim: int = -1, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    """``softmax(x, dim, log=True, scale=scale, causal=causal)``."""
    return softmax(x, dim, log=True, scale=scale, causal=causal)
