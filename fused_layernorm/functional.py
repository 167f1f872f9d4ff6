"""Functional API.  Every call goes straight to one registered C++ op, which
checks its arguments, dispatches to the CPU or CUDA kernels and carries its own
autograd; nothing here does any math.

Plain tensors in eager mode take ``_C``'s bindings of the same ops (a typed
dispatcher call, about 2 us cheaper than the boxed ``torch.ops`` call);
anything else (``torch.compile`` tracing, tensor subclasses, FX proxies) takes
``torch.ops.fused_layernorm``, which those systems understand."""
from typing import Optional, Sequence, Union

import torch
from torch import Tensor
from torch.compiler import is_compiling

from . import _C

# The overloads themselves, looked up once: cheaper per call than the packets.
_layer_norm_op = torch.ops.fused_layernorm.layer_norm.default
_rms_norm_op = torch.ops.fused_layernorm.rms_norm.default


def _layer_norm(x, shape, weight, bias, eps):
    if type(x) is Tensor and not is_compiling():
        return _C.layer_norm(x, shape, weight, bias, eps)
    return _layer_norm_op(x, shape, weight, bias, eps)


def _rms_norm(x, shape, weight, eps):
    if type(x) is Tensor and not is_compiling():
        return _C.rms_norm(x, shape, weight, eps)
    return _rms_norm_op(x, shape, weight, eps)

_Shape = Union[int, Sequence[int], torch.Size]


def _as_shape(normalized_shape: _Shape) -> list:
    if isinstance(normalized_shape, int):
        return [normalized_shape]
    return list(normalized_shape)


def layer_norm(
    input: Tensor,
    normalized_shape: _Shape,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
) -> Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims of ``input``.

    Same contract as :func:`torch.nn.functional.layer_norm`: ``weight`` and
    ``bias`` (optional) have shape ``normalized_shape`` and the input's dtype or
    float32.  Statistics are computed in float32 (float64 for double inputs);
    the output has the input's dtype.  Differentiable in all three tensors.
    """
    return _layer_norm(input, _as_shape(normalized_shape), weight, bias, float(eps))


def fused_layer_norm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
) -> Tensor:
    """LayerNorm over the last dimension of ``x`` (the seed's call).

    Equivalent to ``layer_norm(x, x.shape[-1:], weight, bias, eps)``.
    """
    if x.dim() == 0:
        raise ValueError("fused_layer_norm: input must have at least one dimension, got a 0-d tensor")
    return _layer_norm(x, [x.shape[-1]], weight, bias, float(eps))


def rms_norm(
    input: Tensor,
    normalized_shape: _Shape,
    weight: Optional[Tensor] = None,
    eps: Optional[float] = None,
) -> Tensor:
    """RMSNorm over the trailing ``normalized_shape`` dims of ``input``.

    Same contract as :func:`torch.nn.functional.rms_norm`; ``eps=None`` means
    machine epsilon of the compute dtype, as torch does: ``torch.finfo(torch.float32).eps``
    for float16/bfloat16/float32 inputs and ``torch.finfo(torch.float64).eps`` for float64.
    """
    return _rms_norm(input, _as_shape(normalized_shape), weight, None if eps is None else float(eps))


def fused_rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = None) -> Tensor:
    """RMSNorm over the last dimension of ``x``; ``eps=None`` as in :func:`rms_norm`."""
    if x.dim() == 0:
        raise ValueError("fused_rms_norm: input must have at least one dimension, got a 0-d tensor")
    return _rms_norm(x, [x.shape[-1]], weight, None if eps is None else float(eps))
