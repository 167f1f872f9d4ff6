"""Drop-in modules for torch.nn.LayerNorm and torch.nn.RMSNorm, and a rotary embedding
module (FusedRotaryEmbedding, at the end of this file).

They subclass the torch modules, so ``isinstance(m, nn.LayerNorm)`` holds and the
constructor, parameters, state_dict keys, reset_parameters and extra_repr are
torch's.  On top of that they take the fused pre-norm arguments:

* ``dropout_p``: dropout on the input before the residual add, in training mode only.
* ``weight_offset``: ``y = norm(h) * (weight + weight_offset)``, the offset added in
  float32 (Gemma's ``1 + weight`` is ``weight_offset=1.0``).
* ``residual_dtype``: dtype of the residual stream ``h`` that ``forward`` returns.

``forward(x)`` returns ``y``; ``forward(x, residual)`` returns ``(y, h)`` with
``h = dropout(x) + residual``, the pre-norm residual stream for the next block.
Both work under ``torch.jit.script``.
"""
import copy
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from . import functional as _F


def _check_fused_args(cls: str, dropout_p, weight_offset, residual_dtype) -> Tuple[float, float]:
    dropout_p = _F._number(cls, "dropout_p", dropout_p)
    weight_offset = _F._number(cls, "weight_offset", weight_offset)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"fused_layernorm.{cls}: dropout_p must be in [0, 1], got {dropout_p}")
    if residual_dtype is not None and not isinstance(residual_dtype, torch.dtype):
        raise TypeError(f"fused_layernorm.{cls}: residual_dtype must be a torch.dtype or None, "
                        f"got {type(residual_dtype).__name__}")
    return dropout_p, weight_offset


def _fused_repr(base: str, dropout_p: float, weight_offset: float, residual_dtype) -> str:
    # Only non-default fused arguments are shown, so a plain module's repr is torch's.
    if dropout_p != 0.0:
        base += f", dropout_p={dropout_p}"
    if weight_offset != 0.0:
        base += f", weight_offset={weight_offset}"
    if residual_dtype is not None:
        base += f", residual_dtype={residual_dtype}"
    return base


def _init_weight(weight: Optional[Tensor], weight_offset: float) -> None:
    # The effective scale weight + weight_offset starts at 1, as torch's weight does.
    if weight is not None:
        nn.init.constant_(weight, 1.0 - weight_offset)


class FusedLayerNorm(nn.LayerNorm):
    """Drop-in for :class:`torch.nn.LayerNorm` backed by the fused kernels.

    ``forward(x)`` is ``layer_norm(x, ...)``; ``forward(x, residual)`` returns ``(y, h)``
    with ``h = dropout(x) + residual`` and ``y = layer_norm(h) * (weight + weight_offset) + bias``.
    Dropout applies only in training mode.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "dropout_p", "weight_offset",
                     "residual_dtype"]
    dropout_p: float
    weight_offset: float

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        dropout_p: float = 0.0,
        weight_offset: float = 0.0,
        residual_dtype: Optional[torch.dtype] = None,
    ) -> None:
        eps = _F._number("FusedLayerNorm", "eps", eps)
        dropout_p, weight_offset = _check_fused_args("FusedLayerNorm", dropout_p, weight_offset, residual_dtype)
        # Set before nn.LayerNorm.__init__, whose reset_parameters reads weight_offset.
        self.dropout_p = dropout_p
        self.weight_offset = weight_offset
        self.residual_dtype = residual_dtype
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.elementwise_affine and self.weight_offset != 0.0:
            _init_weight(self.weight, self.weight_offset)

    @torch.jit.unused
    def _eager(self, input: Tensor, residual: Optional[Tensor], p: float) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        if residual is None and p == 0.0 and self.weight_offset == 0.0:
            return _F._layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        return _F._fused(input, self.normalized_shape, self.weight, self.bias, self.eps, False, residual, p,
                         self.weight_offset, self.residual_dtype, residual is not None, None, False)

    # The overloads give TorchScript callers a Tensor or a tuple, not a Union they must refine.
    @torch.jit._overload_method  # noqa: F811
    def forward(self, input: Tensor, residual: None = None) -> Tensor:  # noqa: F811
        ...

    @torch.jit._overload_method  # noqa: F811
    def forward(self, input: Tensor, residual: Tensor) -> Tuple[Tensor, Tensor]:  # noqa: F811
        ...

    def forward(self, input: Tensor, residual: Optional[Tensor] = None):  # noqa: F811
        p = self.dropout_p if self.training else 0.0
        if not torch.jit.is_scripting():
            return self._eager(input, residual, p)
        y, h = self._script(input, residual, p)
        if residual is None:
            return y
        return y, h

    def _script(self, input: Tensor, residual: Optional[Tensor], p: float) -> Tuple[Tensor, Tensor]:
        """TorchScript's forward: (y, h), h being y when there is no residual.  It calls
        the registered ops, which TorchScript understands, directly."""
        if residual is None and p == 0.0 and self.weight_offset == 0.0:
            y = torch.ops.fused_layernorm.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
            return y, y
        y, h, _ = torch.ops.fused_layernorm.add_norm(input, residual, self.normalized_shape, self.weight, self.bias,
                                                     self.eps, False, p, self.weight_offset, self.residual_dtype,
                                                     residual is not None, False, None)
        return y, h

    def __prepare_scriptable__(self):
        return _scriptable(self, _ScriptRootLayerNorm)

    def extra_repr(self) -> str:
        return _fused_repr(super().extra_repr(), self.dropout_p, self.weight_offset, self.residual_dtype)


class FusedRMSNorm(nn.RMSNorm):
    """Drop-in for :class:`torch.nn.RMSNorm` backed by the fused kernels.

    ``forward(x)`` is ``rms_norm(x, ...)``; ``forward(x, residual)`` returns ``(y, h)``
    with ``h = dropout(x) + residual`` and ``y = rms_norm(h) * (weight + weight_offset)``.
    Dropout applies only in training mode.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "dropout_p", "weight_offset",
                     "residual_dtype"]
    dropout_p: float
    weight_offset: float

    def __init__(
        self,
        normalized_shape,
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        dropout_p: float = 0.0,
        weight_offset: float = 0.0,
        residual_dtype: Optional[torch.dtype] = None,
    ) -> None:
        if eps is not None:
            eps = _F._number("FusedRMSNorm", "eps", eps)
        dropout_p, weight_offset = _check_fused_args("FusedRMSNorm", dropout_p, weight_offset, residual_dtype)
        # Set before nn.RMSNorm.__init__, whose reset_parameters reads weight_offset.
        self.dropout_p = dropout_p
        self.weight_offset = weight_offset
        self.residual_dtype = residual_dtype
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.elementwise_affine and self.weight_offset != 0.0:
            _init_weight(self.weight, self.weight_offset)

    @torch.jit.unused
    def _eager(self, x: Tensor, residual: Optional[Tensor], p: float) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        if residual is None and p == 0.0 and self.weight_offset == 0.0:
            return _F._rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return _F._fused(x, self.normalized_shape, self.weight, None, self.eps, True, residual, p, self.weight_offset,
                         self.residual_dtype, residual is not None, None, False)

    # The overloads give TorchScript callers a Tensor or a tuple, not a Union they must refine.
    @torch.jit._overload_method  # noqa: F811
    def forward(self, x: Tensor, residual: None = None) -> Tensor:  # noqa: F811
        ...

    @torch.jit._overload_method  # noqa: F811
    def forward(self, x: Tensor, residual: Tensor) -> Tuple[Tensor, Tensor]:  # noqa: F811
        ...

    def forward(self, x: Tensor, residual: Optional[Tensor] = None):  # noqa: F811
        p = self.dropout_p if self.training else 0.0
        if not torch.jit.is_scripting():
            return self._eager(x, residual, p)
        y, h = self._script(x, residual, p)
        if residual is None:
            return y
        return y, h

    def _script(self, x: Tensor, residual: Optional[Tensor], p: float) -> Tuple[Tensor, Tensor]:
        """TorchScript's forward: (y, h), h being y when there is no residual.  It calls
        the registered ops, which TorchScript understands, directly."""
        if residual is None and p == 0.0 and self.weight_offset == 0.0:
            y = torch.ops.fused_layernorm.rms_norm(x, self.normalized_shape, self.weight, self.eps)
            return y, y
        y, h, _ = torch.ops.fused_layernorm.add_norm(x, residual, self.normalized_shape, self.weight, None,
                                                     self.eps, True, p, self.weight_offset, self.residual_dtype,
                                                     residual is not None, False, None)
        return y, h

    def __prepare_scriptable__(self):
        return _scriptable(self, _ScriptRootRMSNorm)

    def extra_repr(self) -> str:
        return _fused_repr(super().extra_repr(), self.dropout_p, self.weight_offset, self.residual_dtype)


# TorchScript and the two forwards.  Inside a scripted model, a caller of forward(x)
# needs a Tensor and a caller of forward(x, residual) a tuple: the overloads above give
# it that.  But a module scripted on its own with overloads has no method called
# forward (torch's own nn.LSTM has the same limitation), so torch.jit.script(module)
# scripts, instead, a copy of the module (sharing its parameters) whose class has a
# single forward returning Union[Tensor, Tuple[Tensor, Tensor]].


def _scripted_on_its_own() -> bool:
    """Whether torch.jit.script was called on this module itself rather than on a model
    containing it: torch's call_prepare_scriptable_func_impl, our caller, has an empty
    memo for the root only.  Where that cannot be seen, False: the overloads, which
    serve scripted models."""
    import sys

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "call_prepare_scriptable_func_impl":
            memo = frame.f_locals.get("memo")
            return isinstance(memo, dict) and len(memo) == 0
        frame = frame.f_back
    return False


def _scriptable(module: nn.Module, root_cls: type) -> nn.Module:
    if not _scripted_on_its_own():
        return module
    root = copy.copy(module)  # shares the parameter dict, so the scripted module trains the same weights
    root.__class__ = root_cls
    return root


class _ScriptRootLayerNorm(FusedLayerNorm):
    def forward(self, input: Tensor, residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        y, h = self._script(input, residual, self.dropout_p if self.training else 0.0)
        if residual is None:
            return y
        return y, h

    def __prepare_scriptable__(self):
        return self


class _ScriptRootRMSNorm(FusedRMSNorm):
    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        y, h = self._script(x, residual, self.dropout_p if self.training else 0.0)
        if residual is None:
            return y
        return y, h

    def __prepare_scriptable__(self):
        return self


class FusedRotaryEmbedding(nn.Module):
    """Rotary position embedding with cached cos/sin tables:
    ``forward(q, k, position_ids=None)`` returns ``(q_embed, k_embed)`` from
    :func:`fused_layernorm.apply_rotary_pos_emb`, the tables' rows gathered inside the op.

    The tables hold ``max_positions`` rows of ``rotary_dim`` (default ``head_dim``) angles
    ``position * base ** (-2i / rotary_dim)``, laid out as Llama's ``cat(freqs, freqs)`` or,
    with ``interleaved``, GPT-J's (each frequency twice in a row); computed in float64 and
    kept in float32 (non-persistent buffers).  ``position_ids`` [batch, seq] or [seq] picks
    the rows (default: positions 0 .. seq - 1).  ``unsqueeze_dim`` names q's and k's layout
    as in :func:`~fused_layernorm.apply_rotary_pos_emb`.
    """

    def __init__(self, head_dim: int, max_positions: int = 2048, base: float = 10000.0, *,
                 rotary_dim: Optional[int] = None, interleaved: bool = False, unsqueeze_dim: int = 1, device=None):
        super().__init__()
        rot = head_dim if rotary_dim is None else rotary_dim
        if rot < 2 or rot % 2 or rot > head_dim:
            raise ValueError(f"fused_layernorm.FusedRotaryEmbedding: rotary_dim must be even and from 2 to head_dim "
                             f"({head_dim}), got {rot}")
        self.head_dim, self.rotary_dim, self.base = head_dim, rot, float(base)
        self.interleaved, self.unsqueeze_dim = bool(interleaved), int(unsqueeze_dim)
        inv_freq = self.base ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=device) / rot)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64, device=device), inv_freq)
        emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
        self.register_buffer("cos_cached", emb.cos().float(), persistent=False)
        self.register_buffer("sin_cached", emb.sin().float(), persistent=False)

    def forward(self, q: Tensor, k: Tensor, position_ids: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        cos, sin = self.cos_cached, self.sin_cached
        if q.dtype in (torch.float64, torch.float32) and cos.dtype != q.dtype:  # float32 tables serve 16-bit q as they are
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        if position_ids is None:
            seq = q.shape[2 if self.unsqueeze_dim in (1, -3) else 1]
            cos, sin = cos[:seq], sin[:seq]
        return _F.apply_rotary_pos_emb(q, k, cos, sin, position_ids, self.unsqueeze_dim, interleaved=self.interleaved)

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, max_positions={self.cos_cached.shape[0]}, base={self.base}"
        if self.interleaved:
            s += ", interleaved=True"
        return s + (f", unsqueeze_dim={self.unsqueeze_dim}" if self.unsqueeze_dim != 1 else "")
