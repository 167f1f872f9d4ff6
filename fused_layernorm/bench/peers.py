"""The implementations compared.  Each peer binds (op, weight, bias, eps) to a
call y = fn(x) plus the parameter leaves its gradients are taken for.  Peers
whose import fails are reported as not installed, never fatal."""
import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

ALL_PEERS = ("ours", "torch", "compile", "apex", "liger", "quack", "flash", "te")
# Run only when named: ours through the fused family (the add_norm op without a residual),
# the plain ops' candidate replacement (docs/design.md, "Migration").  Not a peer in the summary.
OPT_IN_PEERS = ("ours_fused",)
ALIASES = {"liger_kernel": "liger", "transformer_engine": "te", "fused_layernorm": "ours",
           "eager": "torch", "inductor": "compile", "flash_attn": "flash"}
CPU_PEERS = ("ours", "ours_fused", "torch")


@dataclass
class Bound:
    fn: Callable[[torch.Tensor], torch.Tensor]
    params: List[torch.Tensor]  # weight (and bias): the leaves besides x


@dataclass
class Peer:
    name: str
    bind: Callable  # (op, w, b, eps) -> Bound
    dtypes: Optional[Sequence[str]] = None  # None: all
    # op -> the directions it runs; an op missing here is unsupported
    directions: Dict[str, Sequence[str]] = field(default_factory=dict)
    # Rows longer than this many bytes are not run (None: all); `limit_note` says why.
    max_row_bytes: Optional[int] = None
    limit_note: str = ""

    def supports(self, op: str, dtype: str, direction: str) -> bool:
        if self.dtypes is not None and dtype not in self.dtypes:
            return False
        return direction in self.directions.get(op, ())

    def runs_row(self, hidden: int, dtype: torch.dtype) -> bool:
        return self.max_row_bytes is None or hidden * dtype.itemsize <= self.max_row_bytes


_ALL_DIRS = ("fwd", "bwd", "fwdbwd")
_BOTH = {"layernorm": _ALL_DIRS, "rmsnorm": _ALL_DIRS}


def _functional(ln, rms) -> Callable:
    def bind(op, w, b, eps):
        if op == "layernorm":
            return Bound(lambda x: ln(x, w, b, eps), [w, b])
        return Bound(lambda x: rms(x, w, eps), [w])
    return bind


def _module(make) -> Callable:
    """make(op, hidden, eps, dtype, device) -> nn.Module with .weight (and .bias)."""
    def bind(op, w, b, eps):
        m = make(op, w.shape[0], eps, w.dtype, w.device)
        with torch.no_grad():
            m.weight.copy_(w)
            if op == "layernorm":
                m.bias.copy_(b)
        params = [m.weight, m.bias] if op == "layernorm" else [m.weight]
        return Bound(m, params)
    return bind


# ---- the peers -------------------------------------------------------------

def _ours() -> Peer:
    from fused_layernorm.functional import fused_layer_norm, fused_rms_norm
    return Peer("ours", _functional(fused_layer_norm, fused_rms_norm), directions=_BOTH)


def _ours_fused() -> Peer:
    importlib.import_module("fused_layernorm")  # registers the ops
    op = torch.ops.fused_layernorm.add_norm.default  # (x, residual, shape, w, b, eps, rms, p, offset, ...)

    def ln(x, w, b, eps):
        return op(x, None, [x.shape[-1]], w, b, eps, False, 0.0, 0.0, None, False, False, None)[0]

    def rms(x, w, eps):
        return op(x, None, [x.shape[-1]], w, None, eps, True, 0.0, 0.0, None, False, False, None)[0]
    return Peer("ours_fused", _functional(ln, rms), directions=_BOTH)


def _torch_ln(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _torch_rms(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _torch() -> Peer:
    return Peer("torch", _functional(_torch_ln, _torch_rms), directions=_BOTH)


def _compile(compile_dtypes: Sequence[str]) -> Peer:
    import torch._dynamo as dynamo
    # One code object per op, recompiled per shape/dtype/grad mode: allow many.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(dynamo.config, knob):
            setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), 4096))
    # The 'bwd' timing replays one backward with retain_graph=True, which AOTAutograd
    # refuses for graphs with donated buffers (an in-place memory saving of its own).
    import torch._functorch.config as functorch_config
    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    ln = torch.compile(_torch_ln, dynamic=False)
    rms = torch.compile(_torch_rms, dynamic=False)
    return Peer("compile", _functional(ln, rms), dtypes=tuple(compile_dtypes), directions=_BOTH)


def _apex() -> Peer:
    from apex.normalization import fused_layer_norm as afl
    importlib.import_module("fused_layer_norm_cuda")  # the compiled part; apex imports it lazily
    ln = lambda x, w, b, eps: afl.fused_layer_norm_affine(x, w, b, [x.shape[-1]], eps)  # noqa: E731
    rms = lambda x, w, eps: afl.fused_rms_norm_affine(x, w, [x.shape[-1]], eps)  # noqa: E731
    return Peer("apex", _functional(ln, rms), directions=_BOTH)


def _liger() -> Peer:
    from liger_kernel.transformers.layer_norm import LigerLayerNorm
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    def make(op, hidden, eps, dtype, device):
        if op == "layernorm":
            m = LigerLayerNorm(hidden, eps=eps)
        else:
            try:  # in_place=True (the default) writes dx into dy
                m = LigerRMSNorm(hidden, eps=eps, in_place=False)
            except TypeError:
                m = LigerRMSNorm(hidden, eps=eps)
        return m.to(device=device, dtype=dtype)
    return Peer("liger", _module(make), directions=_BOTH)


def _quack() -> Peer:
    if torch.cuda.get_device_capability()[0] < 9:
        raise RuntimeError("quack needs SM90 or newer")
    qr = importlib.import_module("quack.rmsnorm")
    directions = {"rmsnorm": _ALL_DIRS}
    ln = None
    if hasattr(qr, "layernorm_fwd"):  # forward only, fp32 weight and bias
        directions["layernorm"] = ("fwd",)
        ln = lambda x, w, b, eps: qr.layernorm_fwd(x, w, b, eps)  # noqa: E731
    rms = lambda x, w, eps: qr.rmsnorm(x, w, eps=eps)  # noqa: E731

    def bind(op, w, b, eps):
        if op == "layernorm":
            w32, b32 = w.detach().float(), b.detach().float()
            return Bound(lambda x: ln(x, w32, b32, eps), [])
        return Bound(lambda x: rms(x, w, eps), [w])
    return Peer("quack", bind, directions=directions)


def _flash() -> Peer:
    # flash-attention's Triton kernels (flash_attn/ops/triton/layer_norm.py), no CUDA build needed
    from flash_attn.ops.triton.layer_norm import layer_norm_fn, rms_norm_fn
    ln = lambda x, w, b, eps: layer_norm_fn(x, w, b, eps=eps)  # noqa: E731
    rms = lambda x, w, eps: rms_norm_fn(x, w, None, eps=eps)  # noqa: E731
    return Peer("flash", _functional(ln, rms), directions=_BOTH, max_row_bytes=32 << 10,
                limit_note="rows over 32 KB not run: its one-block kernel refuses rows over 64 KB "
                           "and takes minutes to compile at 64 KB")


def _te() -> Peer:
    import transformer_engine.pytorch as te

    def make(op, hidden, eps, dtype, device):
        cls = te.LayerNorm if op == "layernorm" else te.RMSNorm
        return cls(hidden, eps=eps, params_dtype=dtype, device=device)
    return Peer("te", _module(make), directions=_BOTH)


def normalize_names(names: Sequence[str]) -> List[str]:
    out = []
    for n in names:
        n = ALIASES.get(n.strip().lower(), n.strip().lower())
        if n not in ALL_PEERS + OPT_IN_PEERS:
            raise ValueError(f"unknown peer {n!r}; choose from {', '.join(ALL_PEERS + OPT_IN_PEERS)}")
        if n not in out:
            out.append(n)
    return out


def load_peers(names: Sequence[str], device: str, compile_dtypes: Sequence[str]
               ) -> Tuple[List[Peer], Dict[str, str], Dict[str, str]]:
    """Returns (available peers in `names` order, {name: import error}, {name: why skipped})."""
    loaders = {"ours": _ours, "ours_fused": _ours_fused, "torch": _torch, "compile": lambda: _compile(compile_dtypes),
               "apex": _apex, "liger": _liger, "quack": _quack, "flash": _flash, "te": _te}
    peers, missing, skipped = [], {}, {}
    for name in names:
        if device == "cpu" and name not in CPU_PEERS:
            skipped[name] = "GPU only"
            continue
        if name == "compile" and not compile_dtypes:
            skipped[name] = "--compile-dtypes none"
            continue
        try:
            peers.append(loaders[name]())
        except Exception as e:  # ImportError, OSError from a .so, RuntimeError ...
            msg = str(e).strip().splitlines()
            missing[name] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]
    return peers, missing, skipped
