"""Put the fused modules into an existing model.

``patch(model)`` replaces, in place, every submodule of ``model`` whose class is one
of these with a :class:`FusedLayerNorm` / :class:`FusedRMSNorm`:

==============================================  ==============================================
class                                           replacement
==============================================  ==============================================
``torch.nn.LayerNorm``                          ``FusedLayerNorm`` (same eps, affine, bias)
``torch.nn.RMSNorm``                            ``FusedRMSNorm`` (same eps, affine)
``LlamaRMSNorm``, ``MistralRMSNorm``,           ``FusedRMSNorm(eps=variance_epsilon)``
``Qwen2RMSNorm``, ``Qwen3RMSNorm`` (q/k norms
too), ``T5LayerNorm``
``GemmaRMSNorm``, ``Gemma2RMSNorm``,            ``FusedRMSNorm(eps=eps, weight_offset=1.0)``
``Gemma3RMSNorm``
==============================================  ==============================================

Hugging Face classes are matched by their qualified name
(``transformers.models.llama.modeling_llama.LlamaRMSNorm``), so transformers need not
be importable.  Only those exact classes are replaced, never subclasses, because a
subclass may compute something else; modules already fused are left alone, so
patching twice replaces nothing the second time.

What is kept: the same ``Parameter`` objects (so an optimizer built before patching
still holds them, and dtype, device and ``requires_grad`` do not change), eps,
train/eval mode, the module's hooks, and the state_dict keys.

Numerics against the stock classes (all compute the statistics in float32):

* Llama/Mistral/Qwen and T5 round the normalized activations to the input (T5: weight)
  dtype and then multiply by the weight, rounding twice; ours rounds once.  For
  float32 the results agree to float32 rounding, for bf16/fp16 to within one unit of
  the 16-bit format.
* Gemma computes ``norm(x) * (1 + weight)`` in float32 and rounds once, exactly what
  ``weight_offset=1.0`` does.
* Output dtype: ours is always the input's dtype.  The stock Llama-style and T5
  classes return float32 when given a 16-bit input with a float32 weight (type
  promotion); in a model whose weights and activations share a dtype, or under
  autocast, this does not arise or does not matter.
* Re-initializing a patched Gemma model with Hugging Face's ``_init_weights`` would
  set the weight to ones as for a plain RMSNorm (scale 2 with the offset); patch
  after loading or initializing the weights.

Modules whose instance ``forward`` was replaced (accelerate's offloading hooks do
that) are skipped and listed in the report: replacing them would drop the hook.

Rotary embedding: with ``rope=True`` (the default) patch also swaps the function
``apply_rotary_pos_emb`` of the Hugging Face modeling modules the model's classes come
from (Llama, Mistral, Qwen2, Qwen3, Gemma 1-3, which share Llama's form) for
:func:`fused_layernorm.apply_rotary_pos_emb`, and counts each swap under
``"apply_rotary_pos_emb"``.  That function is a module global, looked up at each
call, so the swap holds for every model of that architecture in the process (as
Liger's patches do); :func:`restore_rope` puts the originals back and
:func:`stock_rope` does so for the duration of a ``with`` block.  Numerics: the
same formula in float32 with one rounding (the stock function rounds the products
and the sum in the activations' dtype); where cos/sin are float32 and q bf16/fp16
(under autocast), the result keeps q's dtype where the stock function promotes to
float32.
"""
import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional

import torch
from torch import nn

from .functional import apply_rotary_pos_emb
from .modules import FusedLayerNorm, FusedRMSNorm

__all__ = ["patch", "to_fused", "PatchReport", "restore_rope", "stock_rope"]


@dataclass(frozen=True)
class _HFSpec:
    eps_attr: str
    weight_offset: float


_LLAMA_STYLE = _HFSpec("variance_epsilon", 0.0)
_GEMMA_STYLE = _HFSpec("eps", 1.0)

# Qualified class name -> how its attributes map onto FusedRMSNorm.
HF_RMS_NORMS: Dict[str, _HFSpec] = {
    "transformers.models.llama.modeling_llama.LlamaRMSNorm": _LLAMA_STYLE,
    "transformers.models.mistral.modeling_mistral.MistralRMSNorm": _LLAMA_STYLE,
    "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm": _LLAMA_STYLE,
    "transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm": _LLAMA_STYLE,
    "transformers.models.t5.modeling_t5.T5LayerNorm": _LLAMA_STYLE,
    "transformers.models.gemma.modeling_gemma.GemmaRMSNorm": _GEMMA_STYLE,
    "transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm": _GEMMA_STYLE,
    "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm": _GEMMA_STYLE,
}

# Modeling modules whose apply_rotary_pos_emb is Llama's: q * cos + rotate_half(q) * sin
# with cos/sin unsqueezed at unsqueeze_dim.
HF_ROPE_MODULES = (
    "transformers.models.llama.modeling_llama",
    "transformers.models.mistral.modeling_mistral",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.gemma.modeling_gemma",
    "transformers.models.gemma2.modeling_gemma2",
    "transformers.models.gemma3.modeling_gemma3",
)
_ROPE = "apply_rotary_pos_emb"
# Module name -> the function patch swapped out of it.
_original_rope: Dict[str, Callable] = {}


def _fused_rope(q, k, cos, sin, unsqueeze_dim=1):
    """Hugging Face 4.40+'s apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), fused."""
    return apply_rotary_pos_emb(q, k, cos, sin, None, unsqueeze_dim)


def _fused_rope_with_position_ids(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Hugging Face's apply_rotary_pos_emb with position_ids (before 5.0), fused."""
    return apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)


_fused_rope._fused_layernorm = True
_fused_rope_with_position_ids._fused_layernorm = True


def _rope_replacement(fn: Callable) -> Optional[Callable]:
    """The fused function with ``fn``'s parameters, or None when ``fn`` has another signature."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    if names == ["q", "k", "cos", "sin", "unsqueeze_dim"]:
        return _fused_rope
    if names == ["q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"]:
        return _fused_rope_with_position_ids
    return None


def _swap_rope(module_name: str, report: "PatchReport") -> None:
    mod = sys.modules.get(module_name)
    fn = getattr(mod, _ROPE, None)
    if fn is None or getattr(fn, "_fused_layernorm", False):
        return  # nothing to swap, or swapped already
    new = _rope_replacement(fn)
    if new is None:
        report.skipped[f"{module_name}.{_ROPE}"] = "its signature is not Hugging Face's (q, k, cos, sin, [position_ids,] unsqueeze_dim)"
        return
    _original_rope[module_name] = fn
    setattr(mod, _ROPE, new)
    report[_ROPE] = report.get(_ROPE, 0) + 1


def restore_rope() -> int:
    """Put back every ``apply_rotary_pos_emb`` that :func:`patch` swapped; returns how many."""
    for name, fn in _original_rope.items():
        setattr(sys.modules[name], _ROPE, fn)
    n = len(_original_rope)
    _original_rope.clear()
    return n


@contextmanager
def stock_rope() -> Iterator[None]:
    """Inside the block, the swapped modules call their stock ``apply_rotary_pos_emb`` (for a
    stock model run beside a patched one); the fused function is back on exit."""
    swapped = {name: getattr(sys.modules[name], _ROPE) for name in _original_rope}
    for name, fn in _original_rope.items():
        setattr(sys.modules[name], _ROPE, fn)
    try:
        yield
    finally:
        for name, fn in swapped.items():
            setattr(sys.modules[name], _ROPE, fn)


# Hook dictionaries carried over to the replacement, so hooks registered on the
# stock module keep firing.
_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


class PatchReport(dict):
    """What :func:`patch` replaced: class name -> count (a dict), plus ``skipped``
    (module path -> reason) and ``total``."""

    def __init__(self):
        super().__init__()
        self.skipped: Dict[str, str] = {}

    @property
    def total(self) -> int:
        return sum(self.values())

    def __repr__(self) -> str:
        s = f"PatchReport(replaced={dict(self)}, total={self.total}"
        if self.skipped:
            s += f", skipped={self.skipped}"
        return s + ")"


def _qualname(module: nn.Module) -> str:
    t = type(module)
    return f"{t.__module__}.{t.__qualname__}"


def _hf_spec(module: nn.Module) -> Optional[_HFSpec]:
    return HF_RMS_NORMS.get(_qualname(module))


def _supported(module: nn.Module) -> bool:
    return type(module) in (nn.LayerNorm, nn.RMSNorm) or _hf_spec(module) is not None


def _adopt(new: nn.Module, old: nn.Module, names) -> nn.Module:
    """Give ``new`` the parameters (the same objects), mode, hooks and HF flags of ``old``."""
    for name in names:
        p = old._parameters.get(name)
        new._parameters[name] = p
    new.train(old.training)
    for d in _HOOK_DICTS:
        if d in old.__dict__ and d in new.__dict__:
            new.__dict__[d] = old.__dict__[d]
    # Hugging Face marks initialized modules so that from_pretrained does not re-initialize them.
    if hasattr(old, "_is_hf_initialized"):
        new._is_hf_initialized = old._is_hf_initialized
    return new


def to_fused(module: nn.Module) -> Optional[nn.Module]:
    """The fused replacement of one norm module, sharing its parameters, or None
    when its class is not one that :func:`patch` replaces."""
    t = type(module)
    if t is nn.LayerNorm:
        has_w = module.weight is not None
        has_b = module.bias is not None
        new = FusedLayerNorm(module.normalized_shape, module.eps, module.elementwise_affine, bias=has_b,
                             device="meta")
        return _adopt(new, module, [n for n, has in (("weight", has_w), ("bias", has_b)) if has])
    if t is nn.RMSNorm:
        new = FusedRMSNorm(module.normalized_shape, module.eps, module.elementwise_affine, device="meta")
        return _adopt(new, module, ["weight"] if module.weight is not None else [])
    spec = _hf_spec(module)
    if spec is None:
        return None
    weight = module._parameters.get("weight")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise ValueError(f"fused_layernorm.patch: {type(module).__name__} must have a 1-d weight parameter, "
                         f"got {None if weight is None else tuple(weight.shape)}")
    eps = getattr(module, spec.eps_attr)
    new = FusedRMSNorm(weight.shape[0], eps, True, device="meta", weight_offset=spec.weight_offset)
    return _adopt(new, module, ["weight"])


def patch(model: nn.Module, *, rope: bool = True) -> PatchReport:
    """Replace, in place, the norm modules of ``model`` (nn.LayerNorm, nn.RMSNorm and
    the Hugging Face RMSNorm classes listed in this module's docstring) with the fused
    modules, and (``rope``) swap the ``apply_rotary_pos_emb`` of the Hugging Face
    modeling modules it uses for the fused one (process-wide: see this module's
    docstring).  Returns a :class:`PatchReport`: class name (or
    ``"apply_rotary_pos_emb"``) -> number replaced.

    A module that appears at several places in the model is replaced by one fused
    module at all of them.  ``model`` itself is not replaced (it has no parent to
    hold the new module); use :func:`to_fused` for a single norm module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fused_layernorm.patch: model must be a torch.nn.Module, got {type(model).__name__}")
    report = PatchReport()
    if _supported(model):
        raise ValueError(f"fused_layernorm.patch: model is itself a {type(model).__name__}; patch replaces "
                         "submodules in place, use fused_layernorm.to_fused(module) for a single module")
    done: Dict[int, nn.Module] = {}
    # Collected first: the model's module tree must not change while it is walked.
    targets = []
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for name, child in parent._modules.items():
            if child is not None and _supported(child):
                targets.append((parent, name, child, f"{parent_name}.{name}" if parent_name else name))
    for parent, name, child, path in targets:
        new = done.get(id(child))
        if new is None:
            if "forward" in child.__dict__:
                report.skipped[path] = "its forward is replaced on the instance (e.g. an accelerate hook)"
                continue
            new = to_fused(child)
            done[id(child)] = new
            cls = type(child).__name__
            report[cls] = report.get(cls, 0) + 1
        parent._modules[name] = new
    if rope:
        for module_name in sorted({type(m).__module__ for m in model.modules()} & set(HF_ROPE_MODULES)):
            _swap_rope(module_name, report)
    return report
