"""Check a peer's outputs against torch eager in float32 on the upcast inputs.

y and dx: max over elements of |a - ref| / (rms(ref) + |ref|), i.e. the absolute
error after normalizing by the tensor's scale, with a relative allowance for
the largest values.  dweight and dbias (sums over all rows): ||a - ref|| / ||ref||.
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from .cases import Inputs

ELEM_TOL = {"bf16": 3e-2, "fp16": 5e-3, "fp32": 1e-4}
NORM_TOL = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}


@dataclass
class Reference:
    y: torch.Tensor
    dx: Optional[torch.Tensor] = None
    dw: Optional[torch.Tensor] = None
    db: Optional[torch.Tensor] = None


def reference(op: str, inp: Inputs, eps: float, grads: bool) -> Reference:
    x = inp.x.detach().float().requires_grad_(grads)
    w = inp.w.detach().float().requires_grad_(grads)
    b = inp.b.detach().float().requires_grad_(grads) if inp.b is not None else None
    with torch.set_grad_enabled(grads):
        if op == "layernorm":
            y = F.layer_norm(x, (x.shape[-1],), w, b, eps)
        else:
            y = F.rms_norm(x, (x.shape[-1],), w, eps)
    if not grads:
        return Reference(y)
    leaves = [x, w] + ([b] if b is not None else [])
    g = torch.autograd.grad(y, leaves, inp.dy.float())
    return Reference(y.detach(), g[0], g[1], g[2] if len(g) > 2 else None)


def _finite(v: float) -> float:
    return v if math.isfinite(v) else math.inf


def elem_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    if a.shape != ref.shape:
        return math.inf
    scale = ref.pow(2).mean().sqrt().clamp_min(1e-30)
    return _finite(((a.detach().float() - ref).abs_() / (ref.abs() + scale)).max().item())


def norm_err(a: Optional[torch.Tensor], ref: torch.Tensor) -> float:
    if a is None or a.shape != ref.shape:
        return math.inf
    d = (a.detach().double() - ref.double()).norm()
    return _finite((d / ref.double().norm().clamp_min(1e-30)).item())


@dataclass
class Check:
    errors: Dict[str, float]
    fwd_ok: bool = True
    bwd_ok: bool = True

    def ok_for(self, direction: str) -> bool:
        return {"fwd": self.fwd_ok, "bwd": self.bwd_ok, "fwdbwd": self.fwd_ok and self.bwd_ok}[direction]


def check(bound, inp: Inputs, ref: Reference, dtype: str, fwd: bool, bwd: bool) -> Check:
    """fwd: y of a no-grad call.  bwd: y, dx, dw (, db) of a grad-mode call."""
    tol, gtol = ELEM_TOL[dtype], NORM_TOL[dtype]
    errors: Dict[str, float] = {}
    res = Check(errors)
    if fwd:
        with torch.no_grad():
            y = bound.fn(inp.x)
        errors["y"] = elem_err(y, ref.y)
        res.fwd_ok = errors["y"] <= tol
        del y
    if bwd:
        x = inp.x.detach().requires_grad_()
        y = bound.fn(x)
        errors["y_grad_mode"] = elem_err(y, ref.y)
        g = torch.autograd.grad(y, [x] + bound.params, inp.dy.clone())
        del y
        errors["dx"] = elem_err(g[0], ref.dx)
        errors["dw"] = norm_err(g[1], ref.dw)
        if ref.db is not None:
            errors["db"] = norm_err(g[2] if len(g) > 2 else None, ref.db)
        res.bwd_ok = (errors["y_grad_mode"] <= tol and errors["dx"] <= tol and errors["dw"] <= gtol
                      and errors.get("db", 0.0) <= gtol)
    return res
