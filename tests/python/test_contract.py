"""The torch contract: what torch.nn.functional.layer_norm / rms_norm do, ours
does too.

* Double backward (create_graph=True): gradgradcheck in float64, and second
  derivatives that match torch's.
* An empty normalized dimension (hidden size 0): an empty output and empty
  gradients, as torch returns, instead of an error.
* eps must be a number: a string is a TypeError that names eps."""
import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

import fused_layernorm as fl
from fused_layernorm import _C
from helpers import generator, randn

SHAPE = (3, 5, 8)
NORMALIZED_SHAPES = pytest.mark.parametrize("ns", [(8,), (5, 8)], ids=["ns1", "ns2"])
AFFINE = pytest.mark.parametrize("weight,bias", [(False, False), (True, False), (False, True), (True, True)])


def _leaf(shape, device, gen, dtype=torch.float64, **kw):
    return randn(shape, dtype=dtype, device=device, gen=gen, **kw).requires_grad_()


# ---------------------------------------------------------------- double backward


@NORMALIZED_SHAPES
@AFFINE
def test_layer_norm_gradgradcheck(ns, weight, bias, device, seed):
    gen = generator(seed)
    x = _leaf(SHAPE, device, gen, scale=2.0, offset=1.0)
    w = _leaf(ns, device, gen, scale=0.5, offset=1.0) if weight else None
    b = _leaf(ns, device, gen, scale=0.5) if bias else None
    assert gradgradcheck(lambda x, w, b: fl.layer_norm(x, ns, w, b, 1e-5), (x, w, b))


@NORMALIZED_SHAPES
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("eps", [1e-6, None], ids=["eps1e-6", "eps-default"])
def test_rms_norm_gradgradcheck(ns, weight, eps, device, seed):
    gen = generator(seed)
    x = _leaf(SHAPE, device, gen, scale=2.0, offset=1.0)
    w = _leaf(ns, device, gen, scale=0.5, offset=1.0) if weight else None
    assert gradgradcheck(lambda x, w: fl.rms_norm(x, ns, w, eps), (x, w))


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gradgradcheck_noncontiguous_input(kind, device, seed):
    gen = generator(seed)
    x = randn((8, 6), dtype=torch.float64, device=device, gen=gen, scale=2.0, offset=1.0).t().requires_grad_()
    w = _leaf((8,), device, gen, scale=0.5, offset=1.0)
    b = _leaf((8,), device, gen, scale=0.5)
    if kind == "ln":
        assert gradgradcheck(lambda x, w, b: fl.layer_norm(x, (8,), w, b), (x, w, b))
    else:
        assert gradgradcheck(lambda x, w: fl.rms_norm(x, (8,), w), (x, w))


def _second_derivatives(norm, x, w, b, dy):
    """Gradients of sum(first-order gradients * fixed weights) w.r.t. x, w, b
    (a Hessian-vector product through the backward)."""
    leaves = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(norm(x, w, b), leaves, dy, create_graph=True)
    gen = torch.Generator(device="cpu").manual_seed(7)
    probe = sum((g * torch.randn(g.shape, generator=gen, dtype=torch.float64).to(g)).sum() for g in grads)
    return torch.autograd.grad(probe, leaves + [dy], allow_unused=True)


@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_double_backward_matches_torch(kind, dtype, device, seed):
    gen = generator(seed)
    x = _leaf((6, 32), device, gen, dtype=dtype, scale=2.0, offset=1.0)
    w = _leaf((32,), device, gen, dtype=dtype, scale=0.5, offset=1.0)
    b = _leaf((32,), device, gen, dtype=dtype, scale=0.5) if kind == "ln" else None
    dy = randn((6, 32), dtype=dtype, device=device, gen=gen).requires_grad_()
    if kind == "ln":
        ours = _second_derivatives(lambda x, w, b: fl.layer_norm(x, (32,), w, b, 1e-5), x, w, b, dy)
        ref = _second_derivatives(lambda x, w, b: F.layer_norm(x, (32,), w, b, 1e-5), x, w, b, dy)
    else:
        ours = _second_derivatives(lambda x, w, b: fl.rms_norm(x, (32,), w, 1e-6), x, w, None, dy)
        ref = _second_derivatives(lambda x, w, b: F.rms_norm(x, (32,), w, 1e-6), x, w, None, dy)
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-4)
    for o, r in zip(ours, ref):
        if r is None:
            assert o is None or not o.any()
        else:
            torch.testing.assert_close(o, r, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_double_backward_16bit_runs(dtype, device, seed):
    """create_graph with 16-bit inputs: the differentiable backward computes in
    float32 and returns gradients in the input's and weight's dtypes, close to
    the first-order kernels' gradients."""
    gen = generator(seed)
    x = _leaf((4, 64), device, gen, dtype=dtype)
    w = _leaf((64,), device, gen, dtype=dtype, offset=1.0)
    b = _leaf((64,), device, gen, dtype=dtype)
    dy = randn((4, 64), dtype=dtype, device=device, gen=gen)
    y = fl.layer_norm(x, (64,), w, b)
    g2 = torch.autograd.grad(y, [x, w, b], dy, create_graph=True)
    g1 = torch.autograd.grad(fl.layer_norm(x, (64,), w, b), [x, w, b], dy)
    for a, c in zip(g2, g1):
        assert a.dtype == c.dtype and a.shape == c.shape
        torch.testing.assert_close(a.float(), c.float(), rtol=2e-2, atol=2e-2)
    (gx2,) = torch.autograd.grad(g2[0].float().pow(2).sum(), [x])
    assert gx2.dtype == dtype and torch.isfinite(gx2.float()).all()


def test_backward_without_create_graph_uses_kernel_op(device, seed):
    """A plain backward runs the bwd kernels (the ops below autograd), whose
    results carry no graph; create_graph gives differentiable results."""
    gen = generator(seed)
    x = _leaf((4, 8), device, gen)
    w = _leaf((8,), device, gen, offset=1.0)
    (gx,) = torch.autograd.grad(fl.layer_norm(x, (8,), w, None).sum(), [x])
    assert gx.grad_fn is None
    (gx,) = torch.autograd.grad(fl.layer_norm(x, (8,), w, None).pow(2).sum(), [x], create_graph=True)
    assert gx.grad_fn is not None


# ---------------------------------------------------------------- empty normalized dim


@pytest.mark.parametrize("shape,ns", [((4, 0), (0,)), ((2, 3, 0), (3, 0)), ((0, 0), (0,))],
                         ids=["4x0", "2x3x0", "0x0"])
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("affine", [False, True])
def test_empty_normalized_dim_matches_torch(shape, ns, kind, affine, device):
    x = torch.randn(shape, device=device, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    w = torch.randn(ns, device=device, requires_grad=True) if affine else None
    b = torch.randn(ns, device=device, requires_grad=True) if affine and kind == "ln" else None
    wr = w.detach().clone().requires_grad_() if w is not None else None
    br = b.detach().clone().requires_grad_() if b is not None else None
    if kind == "ln":
        y, yr = fl.layer_norm(x, ns, w, b, 1e-5), F.layer_norm(xr, ns, wr, br, 1e-5)
    else:
        y, yr = fl.rms_norm(x, ns, w), F.rms_norm(xr, ns, wr)
    assert y.shape == yr.shape and y.dtype == yr.dtype and y.numel() == 0
    y.sum().backward()
    yr.sum().backward()
    for a, r in ((x, xr), (w, wr), (b, br)):
        if r is not None:
            assert a.grad is not None and a.grad.shape == r.grad.shape and a.grad.dtype == r.grad.dtype


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_empty_normalized_dim_ops(kind, device):
    """The raw ops: empty y and gradients; the statistics keep their shape."""
    x = torch.randn(4, 0, device=device)
    dy = torch.randn(4, 0, device=device)
    w = torch.randn(0, device=device)
    if kind == "ln":
        y, mean, rstd = torch.ops.fused_layernorm.layer_norm_fwd(x, [0], w, w, 1e-5)
        assert mean.shape == (4,) and rstd.shape == (4,)
        dx, dw, db = torch.ops.fused_layernorm.layer_norm_bwd(dy, x, [0], mean, rstd, w, w, [True, True, True])
        assert db.shape == (0,)
    else:
        y, rstd = torch.ops.fused_layernorm.rms_norm_fwd(x, [0], w, None)
        assert rstd.shape == (4,)
        dx, dw = torch.ops.fused_layernorm.rms_norm_bwd(dy, x, [0], rstd, w, [True, True])
    assert y.shape == (4, 0) and dx.shape == (4, 0) and dw.shape == (0,)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_empty_normalized_dim_gradcheck(kind, device):
    x = torch.randn(3, 0, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(0, dtype=torch.float64, device=device, requires_grad=True)
    f = (lambda x, w: fl.layer_norm(x, (0,), w, w)) if kind == "ln" else (lambda x, w: fl.rms_norm(x, (0,), w))
    assert gradcheck(f, (x, w))
    assert gradgradcheck(f, (x, w))


# ---------------------------------------------------------------- argument types


def test_eps_string_is_a_type_error_in_the_bindings(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(TypeError, match="eps"):
        _C.layer_norm(x, [8], None, None, "1e-5")
    with pytest.raises(TypeError, match="eps"):
        _C.rms_norm(x, [8], None, "1e-5")
    with pytest.raises(TypeError, match="eps"):
        _C.layer_norm(x, [8], None, None, None)
    with pytest.raises(RuntimeError, match="eps"):
        torch.ops.fused_layernorm.layer_norm(x, [8], None, None, "1e-5")
    with pytest.raises(RuntimeError, match="eps"):
        torch.ops.fused_layernorm.rms_norm(x, [8], None, "1e-5")


@pytest.mark.parametrize("eps", [1e-5, 1, True, torch.tensor(1e-5)], ids=["float", "int", "bool", "tensor"])
def test_eps_numbers_are_accepted_as_torch_does(eps, device):
    """torch's layer_norm takes any number (and a 0-d tensor) as eps."""
    x = torch.randn(4, 8, device=device)
    ref = F.layer_norm(x, (8,), eps=float(eps))
    torch.testing.assert_close(_C.layer_norm(x, [8], None, None, eps), ref)
    torch.testing.assert_close(_C.rms_norm(x, [8], None, eps), F.rms_norm(x, (8,), eps=float(eps)))


@pytest.mark.parametrize("fn", ["layer_norm", "rms_norm", "fused_layer_norm", "fused_rms_norm"])
def test_eps_string_is_a_type_error(fn, device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(TypeError, match="eps"):
        if fn in ("layer_norm", "rms_norm"):
            getattr(fl, fn)(x, (8,), None, eps="1e-5")
        else:
            getattr(fl, fn)(x, eps="1e-5")
