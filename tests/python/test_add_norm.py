"""The fused pre-norm op: h = dropout(x) + residual, y = norm(h) * (weight + weight_offset) + bias.

Every result is compared with a float64 reference on fresh random inputs; the
reference normalizes h rounded to its dtype, as the op does (y normalizes the
h it returns).  The dropout mask comes back through return_dropout_mask and
the reference applies that mask."""
import math

import pytest
import torch

import fused_layernorm as fl
from helpers import ATOL, RTOL, dtype_name, generator, poison_cuda_cache, randn, requires_cuda, unit_roundoff

ops = torch.ops.fused_layernorm

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _norm(kind, h, w, b, eps, offset):
    if kind == "ln":
        mean = h.mean(-1, keepdim=True)
        var = (h - mean).square().mean(-1, keepdim=True)
        y = (h - mean) * torch.rsqrt(var + eps)
    else:
        y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    scale = (w.double() if w is not None else torch.ones((), dtype=torch.float64, device=h.device)) + offset
    y = y * scale
    if b is not None:
        y = y + b.double()
    return y


def reference(kind, x, residual, w, b, eps, *, mask=None, p=0.0, offset=0.0, h_dtype=None, h_actual=None):
    """(y, h) in float64 with autograd; h rounded to h_dtype straight-through.
    With h_actual (the op's h), y normalizes exactly that h: the op rounds the
    float32 sum, which may land one ulp away from the rounded float64 sum."""
    h = x.double()
    if mask is not None:
        h = h * mask.double() / (1.0 - p) if p < 1 else h * 0
    if residual is not None:
        h = h + residual.double()
    h_dtype = h_dtype or (residual.dtype if residual is not None else x.dtype)
    rounded = h.detach().to(h_dtype).double() if h_actual is None else h_actual.detach().double()
    h = h + (rounded - h.detach())
    return _norm(kind, h, w, b, eps, offset), h


def check(actual, expected, dtype, n, *, scale=1.0, what="y"):
    """|actual - expected| <= atol + rtol |expected| + u (8 + sqrt(n)) * scale, element-wise."""
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    a = actual.detach().double()  # compared where it lies: the GPU's float64 is IEEE too
    e = expected.detach().to(dtype).double().to(a.device)
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    u = unit_roundoff(dtype) if dtype == torch.float64 else 2.0**-24
    tol = ATOL[dtype] + RTOL[dtype] * e.abs() + 16 * u * (8 + math.sqrt(n)) * scale
    err = (a - e).abs()
    assert (err <= tol).all(), f"{what} ({dtype_name(dtype)}): max err {err.max().item():.3e}, worst err/tol {(err / tol).max().item():.2f}"


def _inputs(shape, dtype, device, seed, *, residual=True, h_dtype=None, weight=True, bias=True, kind="ln"):
    gen = generator(seed)
    n = shape[-1]
    x = randn(shape, dtype=dtype, device=device, gen=gen, scale=2.0, offset=0.5)
    r = randn(shape, dtype=h_dtype or dtype, device=device, gen=gen, scale=1.5, offset=0.5) if residual else None
    w = randn((n,), dtype=dtype, device=device, gen=gen, scale=0.5, offset=1.0) if weight else None
    b = randn((n,), dtype=dtype, device=device, gen=gen, scale=0.5) if bias and kind == "ln" else None
    dy = randn(shape, dtype=dtype, device=device, gen=gen)
    dh = randn(shape, dtype=h_dtype or dtype, device=device, gen=gen, scale=0.5)
    return x, r, w, b, dy, dh


def _run(kind, x, r, w, b, eps, **kw):
    fn = fl.layer_norm if kind == "ln" else fl.rms_norm
    if kind == "ln":
        return fn(x, x.shape[-1:], w, b, eps, residual=r, **kw)
    return fn(x, x.shape[-1:], w, eps, residual=r, **kw)


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_() for t in ts]


HIDDEN = [1, 3, 8, 127, 256, 1000, 1024, 5120]


@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_residual_forward_backward(kind, dtype, hidden, device, seed):
    """y, h and every gradient (the gradient flowing into h included) against float64."""
    shape = (3, 5, hidden)
    x, r, w, b, dy, dh = _inputs(shape, dtype, device, seed, kind=kind)
    eps = 1e-5
    xl, rl, wl, bl = _leaves(x, r, w, b)
    if device == "cuda":
        poison_cuda_cache(*(2 * [x.numel() * x.element_size()]))
    y, h = _run(kind, xl, rl, wl, bl, eps, weight_offset=0.25, return_residual=True)
    torch.autograd.backward([y, h], [dy, dh])
    xr, rr, wr, br = _leaves(x, r, w, b)
    ye, he = reference(kind, xr, rr, wr, br, eps, offset=0.25)
    torch.autograd.backward([ye, he], [dy.double(), dh.double()])
    check(h, he, dtype, 1, what="h")
    check(y, ye, dtype, hidden, scale=4.0, what="y")
    gscale = float(dy.abs().max()) * 8
    check(xl.grad, xr.grad, dtype, hidden, scale=gscale, what="dx")
    check(rl.grad, rr.grad, dtype, hidden, scale=gscale, what="dresidual")
    rows = x.numel() // hidden
    check(wl.grad, wr.grad, dtype, hidden * rows, scale=gscale * 4, what="dweight")
    if bl is not None:
        check(bl.grad, br.grad, dtype, rows, scale=gscale, what="dbias")


@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [64, 4096])
def test_fp32_residual_stream(kind, dtype, hidden, device, seed):
    """residual_dtype=float32 with 16-bit activations: h and dresidual come back in float32."""
    shape = (6, hidden)
    x, r, w, b, dy, dh = _inputs(shape, dtype, device, seed, h_dtype=torch.float32, kind=kind)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    y, h = _run(kind, xl, rl, wl, bl, 1e-5, residual_dtype=torch.float32, return_residual=True)
    assert h.dtype == torch.float32 and y.dtype == dtype
    torch.autograd.backward([y, h], [dy, dh])
    xr, rr, wr, br = _leaves(x, r, w, b)
    ye, he = reference(kind, xr, rr, wr, br, 1e-5, h_dtype=torch.float32)
    torch.autograd.backward([ye, he], [dy.double(), dh.double()])
    check(h, he, torch.float32, 1, what="h")
    check(y, ye, dtype, hidden, scale=4.0, what="y")
    check(rl.grad, rr.grad, torch.float32, hidden, scale=16.0, what="dresidual")
    check(xl.grad, xr.grad, dtype, hidden, scale=16.0, what="dx")


def _dropout_case(kind, dtype, device, seed, p, hidden=1000, rows=16):
    x, r, w, b, dy, dh = _inputs((rows, hidden), dtype, device, seed, kind=kind)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    torch.manual_seed(seed)
    y, h, mask = _run(kind, xl, rl, wl, bl, 1e-5, dropout_p=p, return_residual=True, return_dropout_mask=True)
    torch.autograd.backward([y, h], [dy, dh])
    xr, rr, wr, br = _leaves(x, r, w, b)
    ye, he = reference(kind, xr, rr, wr, br, 1e-5, mask=mask, p=p, h_actual=h)
    torch.autograd.backward([ye, he], [dy.double(), dh.double()])
    _, he_own = reference(kind, x, r, w, b, 1e-5, mask=mask, p=p)
    return (y, h, mask, xl, rl, wl), (ye, he_own, xr, rr, wr)


@pytest.mark.sanitize
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_dropout_matches_its_mask(kind, dtype, device, seed):
    """Forward and backward equal the reference built from the returned mask: the
    backward regenerates the forward's mask."""
    p = 0.3
    (y, h, mask, xl, rl, wl), (ye, he, xr, rr, wr) = _dropout_case(kind, dtype, device, seed, p)
    assert mask.dtype == torch.bool and mask.shape == y.shape
    check(h, he, dtype, 1, scale=4.0, what="h")
    check(y, ye, dtype, y.shape[-1], scale=4.0, what="y")
    check(xl.grad, xr.grad, dtype, y.shape[-1], scale=32.0, what="dx")
    check(rl.grad, rr.grad, dtype, y.shape[-1], scale=32.0, what="dresidual")
    assert not xl.grad[~mask].any(), "dx must be zero where x was dropped"


def test_dropout_statistics(device):
    """The keep rate is 1 - p, and dropout(x) has mean x and variance p / (1 - p) x^2."""
    n, p = 1 << 20, 0.25
    x = torch.ones(64, n // 64, device=device)
    _, h, mask = fl.layer_norm(x, x.shape[-1:], dropout_p=p, return_residual=True, return_dropout_mask=True)
    keep = mask.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(keep - (1 - p)) < 6 * sigma, keep
    hd = h.double()
    assert abs(hd.mean().item() - 1.0) < 6 * math.sqrt(p / (1 - p) / n)
    assert abs(hd.var().item() - p / (1 - p)) < 0.02
    values = torch.unique(hd).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - p))


def test_dropout_seeded(device):
    """torch.manual_seed reproduces a mask; the generator advances between calls; an
    explicit generator is used when given."""
    x = torch.randn(8, 512, device=device)

    def masks(**kw):
        return fl.rms_norm(x, [512], dropout_p=0.5, return_dropout_mask=True, **kw)[1]

    torch.manual_seed(7)
    a1, a2 = masks(), masks()
    torch.manual_seed(7)
    b1, b2 = masks(), masks()
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)
    g = torch.Generator(device=device)
    g.manual_seed(3)
    c1 = masks(generator=g)
    g.manual_seed(3)
    assert torch.equal(c1, masks(generator=g))


@pytest.mark.parametrize("n", [4, 12, 40, 4104, 8200])
def test_dropout_mask_is_layout_free(n, device):
    """The mask depends on (seed, offset, row, column) alone: 16-byte accesses of bf16 (8
    elements) and fp32 (4; lane pairs share a draw where a row's team is even) and
    one-element accesses of a misaligned view see the same mask, and each backward
    regenerates its forward's."""
    rows = 6  # 8200: a cluster row of the fp32 forward on sm_90
    base = torch.randn(rows * n + 1, device=device)
    dy = torch.arange(rows * n, device=device, dtype=torch.float32).sin().view(rows, n)
    masks = []
    for dtype, start in ((torch.bfloat16, 0), (torch.float32, 0), (torch.float32, 1)):
        x = base.to(dtype)[start:start + rows * n].view(rows, n).detach().requires_grad_()
        torch.manual_seed(5)
        y, mask = fl.layer_norm(x, [n], dropout_p=0.4, return_dropout_mask=True)
        (y.float() * dy).sum().backward()
        what = f"{dtype} starting at element {start}"
        assert not x.grad[~mask].any(), f"{what}: dx nonzero where x was dropped"
        # (a row of 4 with one element kept has dx ~ 0 there: LayerNorm ignores its scale)
        min_nonzero = 0.99 if n >= 40 else 0.9
        assert x.grad[mask].ne(0).float().mean().item() > min_nonzero, f"{what}: dx zero where x was kept"
        masks.append(mask)
    keep = masks[0].double().mean().item()
    assert abs(keep - 0.6) < 6 * math.sqrt(0.24 / masks[0].numel()), keep
    for m in masks[1:]:
        assert torch.equal(m, masks[0])


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_dropout_zero_is_bitwise_plain(kind, device, seed):
    """dropout_p=0 gives bitwise the no-dropout result; p=1 drops x entirely."""
    x, r, w, b, _, _ = _inputs((4, 384), torch.bfloat16, device, seed, kind=kind)
    y0, h0 = _run(kind, x, r, w, b, 1e-5, return_residual=True)
    y1, h1 = _run(kind, x, r, w, b, 1e-5, dropout_p=0.0, return_residual=True)
    assert torch.equal(y0, y1) and torch.equal(h0, h1)
    xl, rl = _leaves(x, r)
    y, h = _run(kind, xl, rl, w, b, 1e-5, dropout_p=1.0, return_residual=True)
    assert torch.equal(h, r)
    y.float().sum().backward()
    assert not xl.grad.any()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_plain_equals_layer_norm(dtype, device, seed):
    """Without residual or dropout (weight_offset only) the fused op is LayerNorm of x."""
    x, _, w, b, _, _ = _inputs((7, 200), dtype, device, seed, residual=False)
    y = fl.layer_norm(x, [200], w, b, weight_offset=0.5)
    ye, _ = reference("ln", x, None, w, b, 1e-5, offset=0.5)
    check(y, ye, dtype, 200, scale=4.0)


@pytest.mark.parametrize("n", [4096, 12288])
def test_constant_rows_give_the_bias(n, device):
    """A constant row has zero variance: y is the bias to fp32 rounding (12288: a cluster row
    on sm_90, whose CTAs' statistics merge)."""
    x = torch.full((4, n), 3.1, device=device)
    r = torch.full((4, n), 0.7, device=device)
    b = torch.randn(n, device=device)
    w = torch.randn(n, device=device)
    y = fl.layer_norm(x, [n], w, b, residual=r)
    assert (y - b).abs().max().item() <= 4 * torch.finfo(torch.float32).eps * b.abs().max().item() + 1e-6


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_gradcheck_with_dropout(kind, device):
    """fp64 gradcheck with the mask held fixed (a fresh generator of the same seed each call)."""
    x, r, w, b, _, _ = _inputs((3, 24), torch.float64, device, 11, kind=kind)
    x, r, w = (t.requires_grad_() for t in (x, r, w))
    args = [x, r, w] + ([b.requires_grad_()] if kind == "ln" else [])

    def f(x, r, w, b=None):
        g = torch.Generator(device=device)
        g.manual_seed(5)
        return _run(kind, x, r, w, b, 1e-5, dropout_p=0.4, weight_offset=0.5, generator=g, return_residual=True)

    assert torch.autograd.gradcheck(f, args)


def test_errors(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="residual must have the input's shape"):
        fl.layer_norm(x, [16], residual=torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="dropout_p"):
        fl.layer_norm(x, [16], dropout_p=1.5)
    with pytest.raises(ValueError, match="residual_dtype"):
        fl.layer_norm(x, [16], residual_dtype=torch.float16)
    with pytest.raises(ValueError, match="normalized_shape"):
        fl.rms_norm(x, [8], residual=x)


def test_inputs_not_modified(device, seed):
    x, r, w, b, _, _ = _inputs((5, 96), torch.float32, device, seed)
    copies = [t.clone() for t in (x, r, w, b)]
    fl.layer_norm(x, [96], w, b, residual=r, dropout_p=0.2, return_residual=True)
    assert all(torch.equal(a, c) for a, c in zip((x, r, w, b), copies))


def test_strided_inputs(device, seed):
    """Row-sliced x and residual are read through their row stride."""
    big, rbig, w, b, _, _ = _inputs((6, 160), torch.float32, device, seed)
    x, r = big[:, :128], rbig[:, 32:]
    y, h = fl.layer_norm(x, [128], w[:128], b[:128], residual=r, return_residual=True)
    ye, he = reference("ln", x, r, w[:128], b[:128], 1e-5)
    check(y, ye, torch.float32, 128, scale=4.0)
    check(h, he, torch.float32, 1)


# --- the torch contract ------------------------------------------------------------------


def test_opcheck(device, seed):
    x, r, w, b, _, _ = _inputs((4, 3, 40), torch.float32, device, seed)
    x, r, w, b = (t.requires_grad_() for t in (x, r, w, b))
    torch.library.opcheck(ops.add_norm.default, (x, r, [40], w, b, 1e-5, False, 0.0, 0.5, None, True, False, None))
    xb = x.detach().bfloat16().requires_grad_()
    torch.library.opcheck(ops.add_norm.default,
                          (xb, r, [40], w.detach().bfloat16(), None, None, True, 0.0, 0.0, torch.float32, True, False, None))


def test_compile_fullgraph(device, seed):
    torch._dynamo.reset()
    x, r, w, b, dy, dh = _inputs((4, 256), torch.float32, device, seed)

    def f(x, r, w, b):
        y, h = fl.layer_norm(x, [256], w, b, residual=r, return_residual=True, weight_offset=1.0)
        return y * 2, h

    compiled = torch.compile(f, fullgraph=True)
    outs = []
    for fn in (f, compiled):
        xl, rl, wl, bl = _leaves(x, r, w, b)
        y, h = fn(xl, rl, wl, bl)
        torch.autograd.backward([y, h], [dy, dh])
        outs.append([y.detach(), h.detach(), xl.grad, rl.grad, wl.grad, bl.grad])
    for a, e in zip(*outs):
        torch.testing.assert_close(a, e)
    torch._dynamo.reset()


@requires_cuda
def test_cuda_graph_replay_advances_the_mask():
    """A captured call draws a new mask at every replay, as torch's dropout does."""
    x = torch.randn(16, 1024, device="cuda")
    static = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fl.layer_norm(x, [1024], dropout_p=0.5, return_dropout_mask=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static["y"], static["mask"] = fl.layer_norm(x, [1024], dropout_p=0.5, return_dropout_mask=True)
    masks = []
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        masks.append(static["mask"].clone())
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    for m in masks:
        assert abs(m.float().mean().item() - 0.5) < 0.02


@requires_cuda
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 20000), (torch.bfloat16, 70000), (torch.float32, 36864),
                                          (torch.bfloat16, 300000), (torch.float32, 300000), (torch.bfloat16, 8200),
                                          (torch.bfloat16, 65536), (torch.float32, 16384), (torch.float32, 2100000)])
def test_long_rows(kind, dtype, hidden, seed):
    """Rows held by a cluster, by a group of resident CTAs (300000), and rows split over CTAs
    whose group cannot be resident (2100000: inputs read twice), forward and backward."""
    x, r, w, b, dy, dh = _inputs((3, hidden), dtype, "cuda", seed, kind=kind)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    torch.manual_seed(seed)
    y, h, mask = _run(kind, xl, rl, wl, bl, 1e-5, dropout_p=0.1, return_residual=True, return_dropout_mask=True)
    torch.autograd.backward([y, h], [dy, dh])
    xr, rr, wr, br = _leaves(x, r, w, b)
    ye, he = reference(kind, xr, rr, wr, br, 1e-5, mask=mask, p=0.1, h_actual=h)
    torch.autograd.backward([ye, he], [dy.double(), dh.double()])
    _, he_own = reference(kind, x, r, w, b, 1e-5, mask=mask, p=0.1)
    check(h, he_own, dtype, 1, scale=4.0, what="h")
    check(y, ye, dtype, hidden, scale=4.0, what="y")
    check(xl.grad, xr.grad, dtype, hidden, scale=64.0, what="dx")
    check(wl.grad, wr.grad, dtype, hidden * 3, scale=64.0, what="dweight")


@requires_cuda
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 12288), (torch.float16, 7168), (torch.float32, 7000),
                                          (torch.bfloat16, 32768)],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("rows", [pytest.param(1001, marks=pytest.mark.sanitize), 5003])
def test_rows_walked_by_a_persistent_grid(kind, dtype, hidden, p, rows, seed):
    """Forward rows of one CTA that fit few CTAs an SM, and cluster rows (bf16 32768 on
    sm_90), walk a persistent grid with the next row in flight: with more rows than the grid
    holds (each group walks several, the last round partial; at 5003, past 16 rows a group on
    up to 2 CTAs of 156 SMs, rows taken from a counter), y and h match float64 and every row
    is written (outputs poisoned)."""
    x, r, w, b, dy, dh = _inputs((rows, hidden), dtype, "cuda", seed, kind=kind)
    poison_cuda_cache(*(2 * [x.numel() * x.element_size()]))
    torch.manual_seed(seed)
    kw = {"return_dropout_mask": True} if p else {}
    out = _run(kind, x, r, w, b, 1e-5, dropout_p=p, weight_offset=0.25, return_residual=True, **kw)
    y, h, mask = out if p else (*out, None)
    _, he = reference(kind, x, r, w, b, 1e-5, mask=mask, p=p, offset=0.25)
    ye, _ = reference(kind, x, r, w, b, 1e-5, mask=mask, p=p, offset=0.25, h_actual=h)
    check(h, he, dtype, 1, scale=4.0, what="h")
    check(y, ye, dtype, hidden, scale=4.0, what="y")


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 2304), (torch.bfloat16, 1000), (torch.bfloat16, 200),
                                          (torch.float32, 896), (torch.float16, 3000), (torch.bfloat16, 2303)],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("rows", [1777, 3])
def test_forward_rows_prefetched(kind, dtype, hidden, p, rows, seed):
    """Forward rows a CTA takes once, whose resident CTAs hold few bytes an SM, also ask L2
    for the rows a quarter round of resident CTAs later (plan.h): a CTA of 3 warps (bf16
    2304), CTAs of several rows of 32 lanes (1000) and of 8 (200), a row part past its last
    warp (fp32 896, fp16 3000), one-element accesses (bf16 2303); more rows than the
    distance (1777) or fewer (3). y and h against float64, outputs poisoned.
    Where the rule takes no prefetch (an H100) the same rows run the kernel without it."""
    test_rows_walked_by_a_persistent_grid(kind, dtype, hidden, p, rows, seed)


def _backward_against_float64(kind, inputs, leaves, y, h, mask, p):
    """Outputs poisoned, then the backward of (y, h) from the op's forward (weight_offset 0.25)
    with dh in: dx, dresidual and the weight gradients against float64.  Returns the float64 y
    of the op's own h."""
    x, r, w, b, dy, dh = inputs
    xl, rl, wl, bl = leaves
    rows, hidden = x.shape[0], x.shape[-1]
    poison_cuda_cache(*(2 * [x.numel() * x.element_size()]))
    torch.autograd.backward([y, h], [dy, dh])
    xr, rr, wr, br = _leaves(x, r, w, b)
    ye, he = reference(kind, xr, rr, wr, br, 1e-5, mask=mask, p=p, offset=0.25, h_actual=h)
    torch.autograd.backward([ye, he], [dy.double(), dh.double()])
    check(xl.grad, xr.grad, x.dtype, hidden, scale=64.0, what="dx")
    check(rl.grad, rr.grad, x.dtype, hidden, scale=64.0, what="dresidual")
    check(wl.grad, wr.grad, x.dtype, rows, scale=64.0, what="dweight")
    if bl is not None:
        check(bl.grad, br.grad, x.dtype, rows, scale=64.0, what="dbias")
    return ye


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 8192), (torch.float16, 12296), (torch.bfloat16, 5120),
                                          (torch.bfloat16, 4096), (torch.float16, 3592), (torch.bfloat16, 2048)],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("rows", [777, 3])
def test_backward_rows_in_pairs(kind, dtype, hidden, p, rows, seed):
    """16-bit backward rows of whole warps go two a reduction where that keeps as many CTAs
    resident: clusters (8192, 12296) and rows of one CTA of 16, 15 and 8 warps (4096; 3592, the
    last warp part past the row; 2048), one at a time where not (5120: CTAs of 10 warps). An
    odd number of rows, each CTA walking several (777; the last pair of some half past the end)
    or at most one (3), with dh in: dx, dresidual and the weight gradients against float64."""
    x, r, w, b, dy, dh = _inputs((rows, hidden), dtype, "cuda", seed, kind=kind)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    torch.manual_seed(seed)
    kw = {"return_dropout_mask": True} if p else {}
    out = _run(kind, xl, rl, wl, bl, 1e-5, dropout_p=p, weight_offset=0.25, return_residual=True, **kw)
    y, h, mask = out if p else (*out, None)
    _backward_against_float64(kind, (x, r, w, b, dy, dh), (xl, rl, wl, bl), y, h, mask, p)


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 2304), (torch.float32, 5120), (torch.float16, 1000),
                                          (torch.bfloat16, 200), (torch.bfloat16, 100), (torch.bfloat16, 2303)],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("rows", [777, 3])
def test_backward_rows_prefetched(kind, dtype, hidden, p, rows, seed):
    """Backward rows walked one at a time whose registers hold few bytes ahead also prefetch
    the row after into L2 (plan.h): a CTA of 9 warps (bf16 2304), a cluster of two CTAs of 10
    (fp32 5120), a row part past its last warp (fp16 1000), CTAs of several rows of a warp
    (bf16 200) and of 16 lanes (bf16 100), and one-element accesses (bf16 2303). An odd
    number of rows, each CTA walking several (777) or at most one (3), with dh in: dx,
    dresidual and the weight gradients against float64.  Where the rule takes no prefetch
    (an H100) the same rows run the kernel without it."""
    test_backward_rows_in_pairs(kind, dtype, hidden, p, rows, seed)


@requires_cuda
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 140000), (torch.bfloat16, 300000), (torch.float32, 262144)],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_rows_walked_by_row_groups(kind, dtype, hidden, p, seed, rows=37):
    """Rows past a cluster take groups of CTAs, all resident at once, that trade their
    statistics through global memory: 37 rows over a few groups (18-64 CTAs each on 132
    SMs), so each group walks several rows with the next in flight, the last round partial;
    threads past the row's end (140000, 300000) and none (262144). y, h, dx, dresidual and
    the weight gradients against float64, outputs poisoned."""
    x, r, w, b, dy, dh = _inputs((rows, hidden), dtype, "cuda", seed, kind=kind)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    poison_cuda_cache(*(2 * [x.numel() * x.element_size()]))
    torch.manual_seed(seed)
    kw = {"return_dropout_mask": True} if p else {}
    out = _run(kind, xl, rl, wl, bl, 1e-5, dropout_p=p, weight_offset=0.25, return_residual=True, **kw)
    y, h, mask = out if p else (*out, None)
    ye = _backward_against_float64(kind, (x, r, w, b, dy, dh), (xl, rl, wl, bl), y, h, mask, p)
    _, he_own = reference(kind, x, r, w, b, 1e-5, mask=mask, p=p, offset=0.25)
    check(h, he_own, dtype, 1, scale=4.0, what="h")
    check(y, ye, dtype, hidden, scale=4.0, what="y")


# Mode's values in the kernels' names (csrc/kernels/add_norm/cuda/kernel.cuh), demangled or not.
# The pair kernel is the cluster mode's (1) with kPair true; the prefetching one has kPrefetch true.
_MODE_NAMES = {"group": ("Mode)2", "ModeE2E"), "split": ("Mode)3", "ModeE3E", "Mode)4", "ModeE4E"),
               "pairs": ("Mode)1, true, false>", "ModeE1ELb1ELb0E"),
               "prefetch": ("false, true>", "ELb0ELb1E"),
               # forward, p = 0: kDropout false, kWhole either, kPrefetch true
               "fwd_prefetch": ("Mode)0, false, false, true>", "Mode)0, false, true, true>",
                                "ModeE0ELb0ELb0ELb1E", "ModeE0ELb0ELb1ELb1E")}
_NOT_NAMES = {"no_prefetch": _MODE_NAMES["prefetch"]}


@requires_cuda
@pytest.mark.parametrize("dtype,hidden,strategy,directions",
                         [(torch.float32, 140000, "group", ("fwd", "bwd")),
                          (torch.float32, 2100000, "split", ("fwd", "bwd")),
                          (torch.bfloat16, 4096, "pairs", ("bwd",)),
                          (torch.bfloat16, 2304, "prefetch", ("fwd", "bwd")),
                          (torch.float32, 16384, "no_prefetch", ("bwd",))],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
def test_rows_take_their_strategy(dtype, hidden, strategy, directions, seed):
    """The kernels that ran (profiler): fp32 rows of 140000 take the row-group kernels forward and
    backward (groups of 18 and 35 CTAs, resident at once on a GPU of 35 SMs or more), rows of
    2100000 the split's (257 and 1026 CTAs cannot be resident); on sm_90, bf16 backward rows of
    4096 the pair kernel (a CTA of 16 warps fits once an SM at 96 registers and at 128), rows of
    2304 the prefetching ones where the bytes an SM holds are fewer than the SM's share of DRAM
    bandwidth moves in a microsecond (backward: two CTAs of 9 warps, 27 KB ahead) or 2.5 (forward:
    seven CTAs of a row with its residual, 65 KB): an H200, not an H100; fp32 backward rows of
    16384 (clusters of 4 CTAs of 512 threads, 48 KB an SM) never."""
    from torch.profiler import ProfilerActivity, profile
    props = torch.cuda.get_device_properties(0)
    if props.multi_processor_count < 35:
        pytest.skip("fewer than 35 SMs: a group of 35 CTAs cannot be resident")
    if strategy in ("pairs", "prefetch") and (props.major, props.minor) != (9, 0):
        pytest.skip("the kernel's residency is stated for sm_90's 64K registers and 2048 threads an SM")
    if strategy == "prefetch":  # plan.h: the bytes an SM holds against its DRAM share over 1 us (bwd), 2.5 (fwd)
        per_sm_per_us = 2 * props.memory_clock_rate * props.memory_bus_width // 8 // 1000 // props.multi_processor_count
        held = {"bwd": (2 * 288 * 48, 1.0), "fwd": (7 * 2304 * 4, 2.5)}
        directions = tuple(d for d in directions if held[d][0] < held[d][1] * per_sm_per_us)
        if not directions:
            pytest.skip(f"{per_sm_per_us} bytes a microsecond an SM: the bytes held keep this GPU's DRAM busy")
    x, r, w, b, dy, dh = _inputs((2, hidden), dtype, "cuda", seed)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y, h = _run("ln", xl, rl, wl, bl, 1e-5, return_residual=True)
        torch.autograd.backward([y, h], [dy, dh])
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    for direction in directions:
        ran = [n for n in names if f"add_norm_{direction}_kernel" in n]
        assert ran, f"no add_norm_{direction}_kernel in the profile: {sorted(set(names))[:8]}"
        if strategy in _NOT_NAMES:
            assert not any(m in n for n in ran for m in _NOT_NAMES[strategy]), f"{direction}: {sorted(set(ran))}"
        else:
            names_of = _MODE_NAMES["fwd_prefetch" if (strategy, direction) == ("prefetch", "fwd") else strategy]
            assert all(any(m in n for m in names_of) for n in ran), f"{direction}: {sorted(set(ran))}"


@requires_cuda
def test_row_groups_replay_in_a_cuda_graph(seed):
    """A row-group launch (cooperative, its exchange slots zeroed by a memset on the stream)
    captured in a CUDA graph gives, at each replay on new inputs, the eager call's bits."""
    hidden = 140000
    x, r, w, b, _, _ = _inputs((9, hidden), torch.float32, "cuda", seed)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fl.layer_norm(x, [hidden], w, b, residual=r, return_residual=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y, h = fl.layer_norm(x, [hidden], w, b, residual=r, return_residual=True)
    for k in range(2):
        x.copy_(torch.randn_like(x))
        r.copy_(torch.randn_like(r) * (k + 1))
        g.replay()
        ye, he = fl.layer_norm(x, [hidden], w, b, residual=r, return_residual=True)
        assert torch.equal(y, ye) and torch.equal(h, he)


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_row_groups_small(kind, seed):
    """Row groups small enough for the sanitizers: fp32 140000, 9 rows (more than the
    forward's 7 groups of 18 CTAs and the backward's 3 of 35 on 132 SMs), with dropout."""
    test_rows_walked_by_row_groups(kind, torch.float32, 140000, 0.1, seed, rows=9)


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_row_tickets_walked(kind, p, seed):
    """The walked rows of test_rows_walked_by_a_persistent_grid past 16 rows a CTA (fp32 7000,
    one CTA an SM: 2200 rows pass 16 x 132 SMs), where later rows come from a counter: small
    enough for the sanitizers."""
    test_rows_walked_by_a_persistent_grid(kind, torch.float32, 7000, p, 2200, seed)


@requires_cuda
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden,h_dtype", [(torch.bfloat16, 8200, None), (torch.bfloat16, 12288, None),
                                                  (torch.bfloat16, 20000, None), (torch.float32, 5000, None),
                                                  (torch.float16, 16384, None), (torch.bfloat16, 12288, torch.float32)],
                         ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
def test_long_rows_without_dropout(kind, dtype, hidden, h_dtype, residual, seed):
    """Rows of 16-80 KB without dropout (test_long_rows draws a mask; these take the kernels
    built without dropout code), one CTA or a cluster a row, with threads whose last access
    lies past the row (8200, 20000, fp32 5000): y, h and the gradients against float64,
    outputs poisoned first, and y without return_residual (h then not stored) the same."""
    shape = (5, hidden)
    x, r, w, b, dy, dh = _inputs(shape, dtype, "cuda", seed, residual=residual, h_dtype=h_dtype, kind=kind)
    xl, rl, wl, bl = _leaves(x, r, w, b)
    poison_cuda_cache(*(2 * [x.numel() * x.element_size()]))
    kw = {"residual_dtype": h_dtype} if h_dtype is not None else {}
    y, h = _run(kind, xl, rl, wl, bl, 1e-5, weight_offset=0.25, return_residual=True, **kw)
    torch.autograd.backward([y, h], [dy, dh.to(h.dtype)])
    xr, rr, wr, br = _leaves(x, r, w, b)
    ye, he = reference(kind, xr, rr, wr, br, 1e-5, offset=0.25, h_dtype=h_dtype)
    torch.autograd.backward([ye, he], [dy.double(), dh.double()])
    check(h, he, h.dtype, 1, what="h")
    check(y, ye, dtype, hidden, scale=4.0, what="y")
    check(xl.grad, xr.grad, dtype, hidden, scale=64.0, what="dx")
    check(wl.grad, wr.grad, dtype, hidden * 5, scale=64.0, what="dweight")
    # Without return_residual h is not stored: the same y.
    y2 = _run(kind, x, r, w, b, 1e-5, weight_offset=0.25, **kw)
    assert torch.equal(y2, y.detach())


@requires_cuda
def test_deterministic_weight_gradients(seed):
    x, r, w, b, dy, _ = _inputs((4096, 768), torch.bfloat16, "cuda", seed)
    grads = []
    for _ in range(2):
        xl, rl, wl, bl = _leaves(x, r, w, b)
        torch.manual_seed(0)
        y = fl.layer_norm(xl, [768], wl, bl, residual=rl, dropout_p=0.1)
        y.backward(dy)
        grads.append((wl.grad, bl.grad, xl.grad))
    for a, e in zip(*grads):
        assert torch.equal(a, e)


@pytest.mark.parametrize("kind", ["ln", "rms"])
def test_empty_rows(kind, device):
    """hidden 0 (and no rows): empty outputs and gradients, as torch."""
    for shape in [(4, 0), (0, 16)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        r = torch.randn(shape, device=device, requires_grad=True)
        w = torch.randn(shape[-1:], device=device, requires_grad=True)
        y, h = _run(kind, x, r, w, None, 1e-5, dropout_p=0.2, return_residual=True)
        assert y.shape == shape and h.shape == shape
        (y.sum() + h.sum()).backward()
        assert x.grad.shape == shape and r.grad.shape == shape
        assert w.grad.shape == shape[-1:] and not w.grad.any()
