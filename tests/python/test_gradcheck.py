"""torch.autograd.gradcheck (float64, finite differences) of the differentiable
ops: input, weight and bias gradients, 1-D and 2-D normalized_shape."""
import pytest
import torch
from torch.autograd import gradcheck

from fused_layernorm import layer_norm, rms_norm
from helpers import generator, randn

SHAPE = (3, 5, 8)
NORMALIZED_SHAPES = pytest.mark.parametrize("ns", [(8,), (5, 8)], ids=["ns1", "ns2"])


def _leaf(shape, device, gen, **kw):
    return randn(shape, dtype=torch.float64, device=device, gen=gen, **kw).requires_grad_()


@NORMALIZED_SHAPES
@pytest.mark.parametrize("weight,bias", [(False, False), (True, False), (False, True), (True, True)])
def test_layer_norm_gradcheck(ns, weight, bias, device, seed):
    gen = generator(seed)
    x = _leaf(SHAPE, device, gen, scale=2.0, offset=1.0)
    w = _leaf(ns, device, gen, scale=0.5, offset=1.0) if weight else None
    b = _leaf(ns, device, gen, scale=0.5) if bias else None
    assert gradcheck(lambda x, w, b: layer_norm(x, ns, w, b, 1e-5), (x, w, b))


@NORMALIZED_SHAPES
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("eps", [1e-6, None], ids=["eps1e-6", "eps-default"])
def test_rms_norm_gradcheck(ns, weight, eps, device, seed):
    gen = generator(seed)
    x = _leaf(SHAPE, device, gen, scale=2.0, offset=1.0)
    w = _leaf(ns, device, gen, scale=0.5, offset=1.0) if weight else None
    assert gradcheck(lambda x, w: rms_norm(x, ns, w, eps), (x, w))


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gradcheck_noncontiguous_input(kind, device, seed):
    """Transposed x (the op sees a non-contiguous input in forward and backward)."""
    gen = generator(seed)
    x = randn((8, 6), dtype=torch.float64, device=device, gen=gen, scale=2.0, offset=1.0).t().requires_grad_()
    w = _leaf((8,), device, gen, scale=0.5, offset=1.0)
    b = _leaf((8,), device, gen, scale=0.5)
    if kind == "ln":
        assert gradcheck(lambda x, w, b: layer_norm(x, (8,), w, b), (x, w, b))
    else:
        assert gradcheck(lambda x, w: rms_norm(x, (8,), w), (x, w))


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_backward_node_saved_tensors(kind, device, seed):
    """The backward node keeps its saved tensors as autograd does: a second
    backward needs retain_graph (and then gives the same gradients), an
    in-place change of a saved input is an error, and gradients are asked
    only for what needs them."""
    gen = generator(seed)
    x = _leaf((4, 8), device, gen)
    w = _leaf((8,), device, gen, offset=1.0)
    b = _leaf((8,), device, gen)
    f = (lambda x: layer_norm(x, (8,), w, b)) if kind == "ln" else (lambda x: rms_norm(x, (8,), w))
    y = f(x)
    dy = randn((4, 8), dtype=torch.float64, device=device, gen=gen)
    first = torch.autograd.grad(y, [x, w], dy, retain_graph=True)
    second = torch.autograd.grad(y, [x, w], dy)
    for a, c in zip(first, second):
        assert torch.equal(a, c)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(y, [x], dy)
    (dw,) = torch.autograd.grad(f(x), [w], dy)  # weight only: no input gradient asked for
    torch.testing.assert_close(dw, first[1])
    x2 = x.detach().clone().requires_grad_()
    y2 = f(x2)
    with torch.no_grad():
        x2.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y2.backward(dy)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_unsupported_derivatives_raise(kind, device, seed):
    """No forward-mode AD: an error, never a tangent silently dropped.  (Double
    backward works: tests/python/test_contract.py.)"""
    gen = generator(seed)
    x = _leaf((4, 8), device, gen)
    w = _leaf((8,), device, gen, offset=1.0)
    b = _leaf((8,), device, gen)
    f = (lambda x, w: layer_norm(x, (8,), w, b)) if kind == "ln" else (lambda x, w: rms_norm(x, (8,), w))
    with pytest.raises(RuntimeError, match="not implemented|does not support"):
        torch.func.hessian(lambda a: f(a, w.detach()).pow(3).sum())(x.detach())
    with pytest.raises(RuntimeError, match="forward-mode AD|does not support"):
        torch.func.jvp(lambda a: f(a, w.detach()), (x.detach(),), (torch.ones_like(x),))
    # Forward-over-reverse: a dual incoming gradient, without create_graph.
    with torch.autograd.forward_ad.dual_level():
        y = f(x, w)
        dy = torch.autograd.forward_ad.make_dual(torch.ones_like(y), torch.ones_like(y))
        with pytest.raises(RuntimeError, match="does not support|not implemented"):
            torch.autograd.grad(y, x, dy)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_non_reentrant_checkpoint(kind, device, seed):
    """torch.utils.checkpoint(use_reentrant=False) recomputes the forward
    inside the backward node's unpacking of its saved tensors; the recompute
    must save what the first forward saved, and the gradients match an
    uncheckpointed run."""
    gen = generator(seed)
    x = _leaf((4, 8), device, gen)
    w = _leaf((8,), device, gen, offset=1.0)
    b = _leaf((8,), device, gen)
    m = randn((8, 8), dtype=torch.float64, device=device, gen=gen)
    dy = randn((4, 8), dtype=torch.float64, device=device, gen=gen)
    norm = (lambda h: layer_norm(h, (8,), w, b)) if kind == "ln" else (lambda h: rms_norm(h, (8,), w))
    block = lambda a: norm(a @ m)  # noqa: E731  (the norm saves the matmul's output)
    leaves = [x, w] + ([b] if kind == "ln" else [])
    ref = torch.autograd.grad(block(x), leaves, dy)
    y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    got = torch.autograd.grad(y, leaves, dy)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=0, atol=0)
