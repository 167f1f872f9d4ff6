"""torch.compile support: torch.library.opcheck on every registered op (schema,
fake/meta kernels, autograd registration, AOT dispatch with dynamic shapes),
and torch.compile(fullgraph=True) of forward + backward compared with eager."""
import pytest
import torch

import fused_layernorm as fl
from helpers import dtype_name, generator, randn

ops = torch.ops.fused_layernorm


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# --- opcheck -------------------------------------------------------------------

# (dtype, param dtype or None for no weight/bias, shape, normalized_shape)
SAMPLES = [
    (torch.float32, torch.float32, (4, 7, 33), [33]),
    (torch.float32, None, (5, 40), [40]),
    (torch.bfloat16, torch.bfloat16, (6, 64), [64]),
    (torch.bfloat16, torch.float32, (3, 4, 16), [4, 16]),
    (torch.bfloat16, None, (2, 48), [48]),
]
SAMPLE_IDS = [f"{dtype_name(d)}-w_{dtype_name(p) if p else 'none'}-ns{len(ns)}" for d, p, _, ns in SAMPLES]
samples = pytest.mark.parametrize("dtype,pdtype,shape,ns", SAMPLES, ids=SAMPLE_IDS)

# Non-differentiable fwd/bwd ops are called with inputs that do not require
# grad, so the autograd-registration check (which needs such inputs) is left out.
NON_DIFF_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


def _tensors(dtype, pdtype, shape, ns, device, seed, requires_grad=False):
    gen = generator(seed)
    x = randn(shape, dtype=dtype, device=device, gen=gen, scale=2.0, offset=1.0)
    w = randn(ns, dtype=pdtype, device=device, gen=gen, scale=0.5, offset=1.0) if pdtype else None
    b = randn(ns, dtype=pdtype, device=device, gen=gen, scale=0.5) if pdtype else None
    g = randn(shape, dtype=dtype, device=device, gen=gen)
    if requires_grad:
        x, w, b = (None if t is None else t.requires_grad_() for t in (x, w, b))
    return x, w, b, g


@samples
def test_opcheck_layer_norm(dtype, pdtype, shape, ns, device, seed):
    x, w, b, _ = _tensors(dtype, pdtype, shape, ns, device, seed, requires_grad=True)
    torch.library.opcheck(ops.layer_norm.default, (x, ns, w, b, 1e-5))


@samples
@pytest.mark.parametrize("eps", [1e-6, None], ids=["eps1e-6", "eps-default"])
def test_opcheck_rms_norm(dtype, pdtype, shape, ns, eps, device, seed):
    x, w, _, _ = _tensors(dtype, pdtype, shape, ns, device, seed, requires_grad=True)
    torch.library.opcheck(ops.rms_norm.default, (x, ns, w, eps))


@samples
def test_opcheck_layer_norm_fwd(dtype, pdtype, shape, ns, device, seed):
    x, w, b, _ = _tensors(dtype, pdtype, shape, ns, device, seed)
    torch.library.opcheck(ops.layer_norm_fwd.default, (x, ns, w, b, 1e-5), test_utils=NON_DIFF_UTILS)


@samples
@pytest.mark.parametrize("mask", [[True, True, True], [True, False, False], [False, True, True]],
                         ids=["111", "100", "011"])
def test_opcheck_layer_norm_bwd(dtype, pdtype, shape, ns, mask, device, seed):
    x, w, b, g = _tensors(dtype, pdtype, shape, ns, device, seed)
    _, mean, rstd = ops.layer_norm_fwd(x, ns, w, b, 1e-5)
    torch.library.opcheck(ops.layer_norm_bwd.default, (g, x, ns, mean, rstd, w, b, mask), test_utils=NON_DIFF_UTILS)


@samples
def test_opcheck_rms_norm_fwd(dtype, pdtype, shape, ns, device, seed):
    x, w, _, _ = _tensors(dtype, pdtype, shape, ns, device, seed)
    torch.library.opcheck(ops.rms_norm_fwd.default, (x, ns, w, None), test_utils=NON_DIFF_UTILS)


@samples
@pytest.mark.parametrize("mask", [[True, True], [True, False], [False, True]], ids=["11", "10", "01"])
def test_opcheck_rms_norm_bwd(dtype, pdtype, shape, ns, mask, device, seed):
    x, w, _, g = _tensors(dtype, pdtype, shape, ns, device, seed)
    _, rstd = ops.rms_norm_fwd(x, ns, w, 1e-6)
    torch.library.opcheck(ops.rms_norm_bwd.default, (g, x, ns, rstd, w, mask), test_utils=NON_DIFF_UTILS)


# --- torch.compile -------------------------------------------------------------

def _run(fn, x, params, g):
    """fn(x, *params) forward + backward on fresh leaves; returns (y, dx, dparams)."""
    x = x.detach().clone().requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in params]
    y = fn(x, *params)
    y.backward(g)
    return y.detach(), x.grad, [p.grad for p in params]


def _assert_same(compiled, eager):
    y_c, dx_c, dp_c = compiled
    y_e, dx_e, dp_e = eager
    torch.testing.assert_close(y_c, y_e)
    torch.testing.assert_close(dx_c, dx_e)
    for a, b in zip(dp_c, dp_e):
        torch.testing.assert_close(a, b)


# Surrounding ops put the custom op inside a larger graph.  They are exact in
# every dtype (power-of-two scaling, relu), so inductor's fusion (which skips
# intermediate bf16 roundings) cannot change the result.
def _ln_fn(x, w, b):
    return fl.fused_layer_norm(x * 2, w, b, 1e-5).relu() * 4


def _rms_fn(x, w):
    return fl.fused_rms_norm(x * 0.5, w, 1e-6).relu() * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_compile_fullgraph_forward_backward(kind, dtype, device, seed):
    gen = generator(seed)
    x = randn((4, 9, 160), dtype=dtype, device=device, gen=gen, scale=2.0)
    g = randn((4, 9, 160), dtype=dtype, device=device, gen=gen)
    w = randn((160,), dtype=dtype, device=device, gen=gen, scale=0.5, offset=1.0)
    b = randn((160,), dtype=dtype, device=device, gen=gen, scale=0.5)
    fn, params = (_ln_fn, [w, b]) if kind == "ln" else (_rms_fn, [w])
    eager = _run(fn, x, params, g)
    compiled = _run(torch.compile(fn, fullgraph=True), x, params, g)
    _assert_same(compiled, eager)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_compile_fullgraph_module(kind, device, seed):
    """torch.compile(module, fullgraph=True) with a 2-D normalized_shape; compare with eager."""
    gen = generator(seed)
    mod = (fl.FusedLayerNorm if kind == "ln" else fl.FusedRMSNorm)((6, 32), device=device)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(randn(p.shape, dtype=p.dtype, device=device, gen=gen, scale=0.5, offset=1.0))
    x = randn((5, 6, 32), dtype=torch.float32, device=device, gen=gen, scale=2.0, offset=1.0)
    g = randn((5, 6, 32), dtype=torch.float32, device=device, gen=gen)

    def run(m):
        mod.zero_grad(set_to_none=True)
        xl = x.clone().requires_grad_()
        y = m(xl)
        y.backward(g)
        return y.detach(), xl.grad, [p.grad.clone() for p in mod.parameters()]

    eager = run(mod)
    compiled = run(torch.compile(mod, fullgraph=True))
    _assert_same(compiled, eager)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_compile_dynamic_shapes(kind, device, seed):
    """dynamic=True: one compiled graph serves several batch sizes (symbolic shapes
    through the meta kernels) and matches eager for each."""
    gen = generator(seed)
    w = randn((96,), dtype=torch.float32, device=device, gen=gen, scale=0.5, offset=1.0)
    b = randn((96,), dtype=torch.float32, device=device, gen=gen, scale=0.5)
    fn, params = (_ln_fn, [w, b]) if kind == "ln" else (_rms_fn, [w])
    cfn = torch.compile(fn, fullgraph=True, dynamic=True)
    for rows in (3, 17, 64):
        x = randn((rows, 96), dtype=torch.float32, device=device, gen=gen, scale=2.0)
        g = randn((rows, 96), dtype=torch.float32, device=device, gen=gen)
        _assert_same(_run(cfn, x, params, g), _run(fn, x, params, g))
