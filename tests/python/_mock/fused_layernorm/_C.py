"""Python mock of the C++ extension (test-suite validation only).
MOCK_BUG env var plants bugs to check that the tests have teeth."""
import os
import torch

BUG = os.environ.get("MOCK_BUG", "")
lib = torch.library.Library("fused_layernorm", "DEF")
lib.define("layer_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)")
lib.define("layer_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor?, Tensor?, Tensor?)")
lib.define("rms_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)")
lib.define("rms_norm_bwd(Tensor grad_out, Tensor input, int[] normalized_shape, Tensor rstd, Tensor? weight, bool[2] output_mask) -> (Tensor?, Tensor?)")
lib.define("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> Tensor")
lib.define("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> Tensor")

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _check(x, ns, weight, bias=None):
    ns = list(ns)
    if x.dtype not in FLOATS:
        raise RuntimeError(f"input: unsupported dtype {x.dtype}")
    if len(ns) == 0 or len(ns) > x.dim() or list(x.shape[x.dim() - len(ns):]) != ns:
        raise RuntimeError(f"normalized_shape {ns} does not match trailing dims of input {list(x.shape)}")
    if any(d == 0 for d in ns):
        raise RuntimeError("normalized_shape must not contain zeros")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if list(t.shape) != ns:
            raise RuntimeError(f"{name} shape mismatch")
        if t.dtype not in (x.dtype, torch.float32):
            raise RuntimeError(f"{name} dtype mismatch")
        if t.device != x.device:
            raise RuntimeError(f"{name} device mismatch")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise RuntimeError("weight and bias dtype differ")


def _acc(x):
    if BUG == "half_acc" and x.dtype in (torch.float16, torch.bfloat16):
        return x.dtype
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rows(x, ns):
    n = 1
    for d in ns:
        n *= d
    return x.reshape(-1, n).to(_acc(x)), n


def ln_fwd(x, ns, weight, bias, eps):
    _check(x, ns, weight, bias)
    x2, n = _rows(x, ns)
    if BUG == "naive_var":
        mean = x2.mean(-1, keepdim=True)
        var = (x2 * x2).mean(-1, keepdim=True) - mean * mean
    else:
        mean = x2.mean(-1, keepdim=True)
        var = (x2 - mean).square().mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + (0.0 if BUG == "no_eps" else eps))
    y = (x2 - mean) * rstd
    if weight is not None:
        y = y * weight.reshape(-1).to(y.dtype)
    if bias is not None and BUG != "no_bias":
        y = y + bias.reshape(-1).to(y.dtype)
    bshape = x.shape[: x.dim() - len(ns)]
    sdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return y.to(x.dtype).reshape(x.shape), mean.reshape(bshape).to(sdt), rstd.reshape(bshape).to(sdt)


def _check_bwd(g, x, ns, stats, weight, bias=None):
    _check(x, ns, weight, bias)
    if g.shape != x.shape or g.dtype != x.dtype:
        raise RuntimeError("grad_out must match input")
    bshape = x.shape[: x.dim() - len(ns)]
    sdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    for name, t in stats.items():
        if t.shape != bshape or t.dtype != sdt:
            raise RuntimeError(f"{name} has wrong shape/dtype")


def ln_bwd(g, x, ns, mean, rstd, weight, bias, mask):
    _check_bwd(g, x, ns, {"mean": mean, "rstd": rstd}, weight, bias)
    x2, n = _rows(x, ns)
    g2 = g.reshape(-1, n).to(x2.dtype)
    mean = mean.reshape(-1, 1).to(x2.dtype)
    rstd = rstd.reshape(-1, 1).to(x2.dtype)
    xhat = (x2 - mean) * rstd
    wg = g2 * weight.reshape(-1).to(x2.dtype) if weight is not None else g2
    dx = dw = db = None
    if mask[0]:
        c2 = 0 if BUG == "no_xhat_term" else (wg * xhat).mean(-1, keepdim=True)
        dx = (rstd * (wg - wg.mean(-1, keepdim=True) - xhat * c2)).to(x.dtype).reshape(x.shape)
    if mask[1] and weight is not None:
        dw = (g2 * xhat).sum(0).to(weight.dtype).reshape(weight.shape)
        if BUG == "nondet" and dw.numel():
            dw = dw + torch.rand(()).to(dw.dtype) * 1e-7
    if mask[2] and bias is not None:
        db = g2.sum(0).to(bias.dtype).reshape(bias.shape)
    return dx, dw, db


def _rms_eps(x, eps):
    if eps is not None:
        return eps
    if BUG == "eps_own_dtype":
        return torch.finfo(x.dtype).eps
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def rms_fwd(x, ns, weight, eps):
    _check(x, ns, weight)
    x2, n = _rows(x, ns)
    rstd = torch.rsqrt(x2.square().mean(-1, keepdim=True) + _rms_eps(x, eps))
    y = x2 * rstd
    if weight is not None:
        y = y * weight.reshape(-1).to(y.dtype)
    bshape = x.shape[: x.dim() - len(ns)]
    sdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return y.to(x.dtype).reshape(x.shape), rstd.reshape(bshape).to(sdt)


def rms_bwd(g, x, ns, rstd, weight, mask):
    _check_bwd(g, x, ns, {"rstd": rstd}, weight)
    x2, n = _rows(x, ns)
    g2 = g.reshape(-1, n).to(x2.dtype)
    rstd = rstd.reshape(-1, 1).to(x2.dtype)
    xhat = x2 * rstd
    wg = g2 * weight.reshape(-1).to(x2.dtype) if weight is not None else g2
    dx = dw = None
    if mask[0]:
        dx = (rstd * (wg - xhat * (wg * xhat).mean(-1, keepdim=True))).to(x.dtype).reshape(x.shape)
    if mask[1] and weight is not None:
        dw = (g2 * xhat).sum(0).to(weight.dtype).reshape(weight.shape)
    return dx, dw


for key in ("CPU", "CUDA"):
    lib.impl("layer_norm_fwd", ln_fwd, key)
    lib.impl("layer_norm_bwd", ln_bwd, key)
    lib.impl("rms_norm_fwd", rms_fwd, key)
    lib.impl("rms_norm_bwd", rms_bwd, key)


def ln_fwd_meta(x, ns, weight, bias, eps):
    _check(x, ns, weight, bias)
    bshape = x.shape[: x.dim() - len(ns)]
    sdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(bshape, dtype=sdt), x.new_empty(bshape, dtype=sdt)


def ln_bwd_meta(g, x, ns, mean, rstd, weight, bias, mask):
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if mask[0] else None,
            torch.empty_like(weight) if mask[1] and weight is not None else None,
            torch.empty_like(bias) if mask[2] and bias is not None else None)


def rms_fwd_meta(x, ns, weight, eps):
    _check(x, ns, weight)
    bshape = x.shape[: x.dim() - len(ns)]
    sdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(bshape, dtype=sdt)


def rms_bwd_meta(g, x, ns, rstd, weight, mask):
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if mask[0] else None,
            torch.empty_like(weight) if mask[1] and weight is not None else None)


lib.impl("layer_norm_fwd", ln_fwd_meta, "Meta")
lib.impl("layer_norm_bwd", ln_bwd_meta, "Meta")
lib.impl("rms_norm_fwd", rms_fwd_meta, "Meta")
lib.impl("rms_norm_bwd", rms_bwd_meta, "Meta")

_ops = torch.ops.fused_layernorm


class _LN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ns, weight, bias, eps):
        with torch._C._AutoDispatchBelowAutograd():
            y, mean, rstd = _ops.layer_norm_fwd(x, ns, weight, bias, eps)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        ctx.ns = ns
        return y

    @staticmethod
    def backward(ctx, g):
        x, mean, rstd, weight, bias = ctx.saved_tensors
        nig = ctx.needs_input_grad
        dx, dw, db = _ops.layer_norm_bwd(g, x, ctx.ns, mean, rstd, weight, bias, [nig[0], nig[2], nig[3]])
        return dx, None, dw, db, None


class _RMS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ns, weight, eps):
        with torch._C._AutoDispatchBelowAutograd():
            y, rstd = _ops.rms_norm_fwd(x, ns, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        ctx.ns = ns
        return y

    @staticmethod
    def backward(ctx, g):
        x, rstd, weight = ctx.saved_tensors
        nig = ctx.needs_input_grad
        dx, dw = _ops.rms_norm_bwd(g, x, ctx.ns, rstd, weight, [nig[0], nig[2]])
        return dx, None, dw, None


lib.impl("layer_norm", lambda x, ns, w, b, eps: _LN.apply(x, ns, w, b, eps), "Autograd")
lib.impl("rms_norm", lambda x, ns, w, eps: _RMS.apply(x, ns, w, eps), "Autograd")
lib.impl("layer_norm", lambda x, ns, w, b, eps: _ops.layer_norm_fwd(x, ns, w, b, eps)[0], "CompositeExplicitAutograd")
lib.impl("rms_norm", lambda x, ns, w, eps: _ops.rms_norm_fwd(x, ns, w, eps)[0], "CompositeExplicitAutograd")
