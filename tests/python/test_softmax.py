"""The softmax op, fused_layernorm.softmax / log_softmax (torch.ops.fused_layernorm.softmax).

Every result is compared with a float64 reference written here (torch's softmax of the
upcast, scaled, masked input).  The backward op is checked against its formula in float64
on the y it is given (so only the kernel's arithmetic is under test), the differentiable op
against autograd on the reference.  On CUDA the outputs' memory is poisoned first, so an
element never written fails."""
import math

import pytest
import torch

import fused_layernorm as fl
from helpers import dtype_name, generator, poison_cuda_cache, randn, requires_cuda

ops = torch.ops.fused_layernorm

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
ULP = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
SHORT = (1, 3, 7, 127, 256, 1000, 1024, 4097)
# CUDA only: one CTA, a cluster of CTAs (sm_90) and the two-pass loop (past 512 KB a row).
LONG = (65536, 100000, 262144, 300000)


def compute_u(dtype):
    return 2.0**-53 if dtype == torch.float64 else 2.0**-24


def growth(n):
    return 64.0 + 4.0 * math.sqrt(n)


# --- reference ------------------------------------------------------------------------


def causal_mask(q_len, k_len, device="cpu"):
    """True where masked: query i keeps keys j <= i + k_len - q_len."""
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None]
    return j > i + (k_len - q_len)


def reference(x, dim=-1, log=False, scale=1.0, causal=False):
    """float64 softmax (log-softmax) of scale * x, masked as the op masks."""
    z = x.double() * scale
    if causal:
        z = z.masked_fill(causal_mask(*z.shape[-2:], device=z.device), -math.inf)
    return torch.log_softmax(z, dim) if log else torch.softmax(z, dim)


def ref_backward(y, dy, log, scale, causal):
    """The backward formula in float64 on the y the op was given (last dim)."""
    y, dy = y.double(), dy.double()
    keep = torch.ones_like(y, dtype=torch.bool)
    if causal:
        keep = ~causal_mask(*y.shape[-2:], device=y.device).expand_as(y)
    dy = dy.masked_fill(~keep, 0)
    if log:
        p = torch.exp(y).masked_fill(~keep, 0)
        dx = scale * (dy - p * dy.sum(-1, keepdim=True))
        slack = abs(scale) * (p * dy.abs().sum(-1, keepdim=True) + dy.abs())
    else:
        y0 = y.masked_fill(~keep, 0)
        s = (dy * y0).sum(-1, keepdim=True)
        dx = scale * y0 * (dy - s)
        slack = abs(scale) * y0.abs() * (dy.abs() + (dy * y0).abs().sum(-1, keepdim=True))
    return dx.masked_fill(~keep, 0), slack


def check(actual, expected, dtype, slack, what, n):
    """|actual - expected| <= ulp |expected| + u growth(n) slack + tiny: one rounding to the
    output dtype after fp32 (fp64) arithmetic on terms of size `slack`.  -inf and NaN must
    match exactly."""
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    a = actual.detach().double()  # compared where it lies: the GPU's float64 is IEEE too
    e = expected.detach().double().to(a.device)
    slack = torch.as_tensor(slack).double().to(a.device)
    special = ~torch.isfinite(e)
    assert torch.equal(a.isnan(), e.isnan()), f"{what}: NaN where the reference has none (or the reverse)"
    assert torch.equal(a[special & ~e.isnan()], e[special & ~e.isnan()]), f"{what}: infinities differ"
    fin = ~special
    assert torch.isfinite(a[fin]).all(), f"{what}: non-finite values (an element never written?)"
    tol = ULP[dtype] * e.abs() + compute_u(dtype) * growth(n) * slack + torch.finfo(dtype).tiny
    err = (a - e).abs()
    bad = fin & (err > tol)
    assert not bad.any(), (f"{what} ({dtype_name(dtype)}): max err {err[fin].max().item():.3e}, "
                           f"worst err/tol {(err[fin] / tol[fin]).max().item():.2f}")


def fwd_slack(x, y_ref, log, scale, causal):
    """The size of the terms behind each output: y itself (softmax, relative error from the
    exponential of |z - max| and the sum), or |z| + |logsumexp| (log-softmax)."""
    z = x.double() * scale
    if causal:
        z = z.masked_fill(causal_mask(*z.shape[-2:], device=z.device), -math.inf)
    zmax = z.amax(-1, keepdim=True)
    if log:
        return (z.abs() + (zmax.abs() + 1)).nan_to_num(0, 0, 0)
    return (y_ref.abs() * (1 + (z - zmax).abs())).nan_to_num(0, 0, 0)


def poison(device, *tensors):
    if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda"):
        poison_cuda_cache(*(t.numel() * t.element_size() for t in tensors))


# --- forward and backward against the reference ----------------------------------------------


def same(a, b):
    """Bitwise-equal values, NaN matching NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def run_and_check(x, *, log=False, scale=1.0, causal=False, dy=None, seed=0):
    """Forward through the public op, then the backward op on our y; both checked.  Causal:
    the masked entries of x, and of y and dy in the backward, are NaN first, so a kernel
    that lets a masked element into a sum (or a 16-byte access straddling the boundary that
    leaks its masked lanes) makes the row NaN."""
    dtype, n = x.dtype, x.shape[-1]
    mask = causal_mask(*x.shape[-2:], device=x.device).expand_as(x) if causal else None
    if causal:
        x = x.masked_fill(mask, math.nan)
    x0 = x.clone()
    poison(x.device.type, x)
    y = fl.softmax(x, log=log, scale=scale, causal=causal)
    assert same(x, x0), "the input was modified"
    assert y.is_contiguous()
    e = reference(x, log=log, scale=scale, causal=causal)
    check(y, e, dtype, fwd_slack(x, e, log, scale, causal), "y", n)
    if dy is None:
        dy = randn(x.shape, dtype=dtype, device=x.device, gen=generator(seed + 1))
    y_in = y.masked_fill(mask, math.nan) if causal else y
    if causal:
        dy = dy.masked_fill(mask, math.nan)
    y0, dy0 = y_in.clone(), dy.clone()
    poison(x.device.type, x)
    dx = ops.softmax_bwd(y_in, dy, log, scale, causal)
    assert same(y_in, y0) and same(dy, dy0), "the backward's inputs were modified"
    dxe, slack = ref_backward(y_in, dy, log, scale, causal)
    check(dx, dxe, dtype, slack, "dx", n)
    return y, dx


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", SHORT)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
def test_rows(device, dtype, n, log, seed):
    x = randn((5, n), dtype=dtype, device=device, gen=generator(seed), scale=3.0)
    run_and_check(x, log=log, seed=seed)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", LONG)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
def test_long_rows_cuda(dtype, n, log, seed):
    x = randn((3, n), dtype=dtype, device="cuda", gen=generator(seed), scale=3.0)
    run_and_check(x, log=log, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_many_rows_and_dims(device, dtype, seed):
    """Several leading dims, rows that share a CTA (short rows) with a partial last group."""
    x = randn((3, 37, 96), dtype=dtype, device=device, gen=generator(seed), scale=2.0)
    run_and_check(x, seed=seed)
    run_and_check(x[..., :33], log=True, scale=0.5, seed=seed)  # a row stride of 96, odd rows


def test_matches_torch(device, seed):
    x = randn((4, 7, 300), dtype=torch.float32, device=device, gen=generator(seed), scale=4.0)
    torch.testing.assert_close(fl.softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(fl.log_softmax(x, 1), torch.log_softmax(x, 1))
    torch.testing.assert_close(fl.softmax(x, 0, scale=0.3), torch.softmax(0.3 * x, 0))


# --- layouts -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_strided_rows_read_in_place(device, dtype, seed):
    """Rows sliced from a wider matrix (a row stride), misaligned starts (one-element accesses),
    a transposed input (copied once), and dim != -1."""
    gen = generator(seed)
    big = randn((6, 1100), dtype=dtype, device=device, gen=gen, scale=3.0)
    for x in (big[:, :1024], big[:, 1:1025], big[::2, 5:1005], big.t()[:700]):
        run_and_check(x, seed=seed)
    x = randn((5, 64, 3), dtype=dtype, device=device, gen=gen)
    for dim in (0, 1, -2):
        for log in (False, True):
            y = fl.softmax(x, dim, log=log)
            check(y, reference(x, dim, log), dtype, 1.0 + 10 * (not log), f"dim {dim}", x.shape[dim])


def test_empty_and_scalar(device):
    for shape in ((0, 5), (3, 0), (0,)):
        x = torch.randn(shape, device=device)
        assert fl.softmax(x).shape == x.shape
    x = torch.tensor(3.0, device=device)
    assert fl.softmax(x).item() == 1.0 and fl.log_softmax(x).item() == 0.0


# --- special values ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [5, 1000, 4097])
def test_infinite_rows(device, dtype, n):
    """A row of -inf gives NaN, as torch; a row with some -inf gives 0 there, including rows
    where whole threads hold only -inf and the maximum is very negative (-100)."""
    x = torch.full((4, n), -math.inf, dtype=dtype, device=device)
    x[1, -1] = -100.0
    x[2, ::3] = torch.linspace(-5, 5, len(range(0, n, 3)), dtype=dtype, device=device)
    x[3, 0] = 7.0
    for log in (False, True):
        y = fl.softmax(x, log=log)
        e = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
        assert torch.isnan(y[0]).all() and torch.isnan(e[0]).all()
        check(y[1:], e[1:], dtype, 1.0 + 20 * log, "partly -inf rows", n)
        assert y[1, -1].item() == (0.0 if log else 1.0)


@requires_cuda
@pytest.mark.parametrize("dtype,n", [(torch.float32, 65536), (torch.float32, 100000), (torch.bfloat16, 262144),
                                     (torch.float32, 300000), (torch.bfloat16, 300001)],
                         ids=["fp32-cluster8", "fp32-cluster13", "bf16-cluster16", "fp32-loop", "bf16-loop-odd"])
def test_infinite_long_rows_cuda(dtype, n):
    """-inf across the CTAs of a cluster and the chunks of the loop kernel: whole CTAs (chunks)
    hold only -inf and must merge as (-inf, 0) without NaN; a row of -inf is NaN."""
    x = torch.full((5, n), -math.inf, dtype=dtype, device="cuda")
    x[1, -1] = -100.0  # only the last CTA (chunk) holds a finite value
    x[2, 0] = 3.0  # only the first
    x[3, ::4099] = torch.linspace(-5, 5, len(range(0, n, 4099)), dtype=dtype, device="cuda")
    x[4, n // 2] = 1e4  # a finite maximum far from 0, in a middle CTA
    for log in (False, True):
        y = fl.softmax(x, log=log)
        e = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
        assert torch.isnan(y[0]).all()
        check(y[1:], e[1:], dtype, 1.0 + 20 * log, "partly -inf rows", n)
        if not log:
            assert y[1, -1].item() == 1.0 and y[2, 0].item() == 1.0 and y[4, n // 2].item() == 1.0


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("n", [8, 1000, 16384, 65536, 131072])
def test_row_max_with_negative_scale_nan_and_inf(device, dtype, n, seed):
    """The row max under every scale sign, on every row strategy (16-bit rows take it from the
    raw pairs, sign-flipped for a negative scale): rows near +40 at scale -3 (z near -120,
    where a max taken without the sign would flush every exponential to 0); a NaN anywhere
    makes the row NaN, also among -infs; +inf under a negative scale is z = -inf (0 out), -inf is z = +inf (NaN).
    softmax(x, scale=-s) is softmax(-x, scale=s) bit for bit."""
    if device == "cpu" and n > 16384:
        pytest.skip("long rows: the CUDA strategies")
    gen = generator(seed)
    x = randn((6, n), dtype=dtype, device=device, gen=gen, scale=2.0, offset=40.0)
    x[1, n // 3] = math.nan
    x[2, n - 1] = math.inf
    x[3, 0] = -math.inf
    x[4, ::7] = math.inf  # every 7th is -inf after the scale
    x[5] = -math.inf  # -inf but one NaN: lanes whose max is -inf carry the NaN (torch: a NaN row)
    x[5, n // 2] = math.nan
    for log in (False, True):
        for scale in (-3.0, 0.5):
            y = fl.softmax(x, log=log, scale=scale)
            e = reference(x, log=log, scale=scale)
            check(y, e, dtype, fwd_slack(x, e, log, scale, False), f"scale {scale}", n)
        assert same(fl.softmax(x, log=log, scale=-3.0), fl.softmax(-x, log=log, scale=3.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_large_magnitude(device, dtype, seed):
    """Inputs near 1e4 (or the dtype's range), and large scales: no overflow, z - max exact enough."""
    gen = generator(seed)
    big = 1e4 if dtype != torch.float16 else 6e4
    x = randn((3, 1000), dtype=dtype, device=device, gen=gen, scale=5.0, offset=big)
    run_and_check(x, seed=seed)
    run_and_check(x, log=True, seed=seed)
    x = randn((3, 257), dtype=dtype, device=device, gen=gen)
    run_and_check(x, scale=30.0, seed=seed)
    run_and_check(x, scale=-2.5, log=True, seed=seed)
    if dtype != torch.float16:
        # Near the top of the float range: z * log2(e) would overflow, z - max does not.
        pick = torch.rand((2, 300), generator=gen) < 0.5
        x = torch.where(pick.to(device), 3e38, 1e38).to(dtype)
        run_and_check(x, seed=seed)
        run_and_check(x, log=True, seed=seed)


# --- causal -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("q_len,k_len", [(1, 1), (7, 7), (64, 64), (5, 37), (100, 1024), (33, 33)])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
def test_causal(device, dtype, q_len, k_len, log, seed):
    """Megatron's square form and rectangular (a KV cache: query i keeps j <= i + k_len - q_len),
    with a scale; masked entries are exactly 0 (-inf) and get a zero gradient."""
    x = randn((2, 3, q_len, k_len), dtype=dtype, device=device, gen=generator(seed), scale=3.0)
    y, dx = run_and_check(x, log=log, scale=0.125, causal=True, seed=seed)
    m = causal_mask(q_len, k_len, device).expand_as(y)
    assert (y[m] == (-math.inf if log else 0.0)).all()
    assert (dx[m] == 0).all()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_causal_long_rows_cuda(dtype, seed):
    """Causal rows held by a cluster and by the loop kernel."""
    for q_len, k_len in [(3, 70000), (2, 300000)]:
        x = randn((1, q_len, k_len), dtype=dtype, device="cuda", gen=generator(seed), scale=3.0)
        run_and_check(x, scale=0.5, causal=True, seed=seed)
        run_and_check(x, log=True, causal=True, seed=seed)


# --- autograd ---------------------------------------------------------------------------------


def test_autograd_matches_reference(device, seed):
    gen = generator(seed)
    for shape, dim, log, scale, causal in [((4, 300), -1, False, 1.0, False), ((2, 9, 9), -1, True, 0.3, True),
                                           ((6, 5, 7), 1, False, 2.0, False), ((3, 4, 11), -1, True, 1.0, False)]:
        x = randn(shape, dtype=torch.float32, device=device, gen=gen, scale=2.0)
        g = randn(shape, dtype=torch.float32, device=device, gen=gen)
        xl = x.clone().requires_grad_()
        fl.softmax(xl, dim, log=log, scale=scale, causal=causal).backward(g)
        if causal:
            # Masked outputs are constants (0, or -inf for log-softmax): their gradient is ignored.
            # (Autograd through -inf - logsumexp would count it in the log-softmax's sum.)
            g = g.masked_fill(causal_mask(*shape[-2:], device=device), 0)
            xm = x.clone().requires_grad_()
            fl.softmax(xm, dim, log=log, scale=scale, causal=causal).backward(g)
            assert torch.equal(xm.grad, xl.grad)
        xr = x.double().requires_grad_()
        reference(xr, dim, log, scale, causal).backward(g.double())
        torch.testing.assert_close(xl.grad, xr.grad.float(), rtol=1e-4, atol=1e-5)


def test_gradcheck(device, seed):
    gen = generator(seed)
    for shape, dim, log, scale, causal in [((3, 8), -1, False, 1.0, False), ((3, 8), -1, True, 0.7, False),
                                           ((2, 5, 5), -1, False, 1.5, True), ((2, 3, 6), -1, True, 1.0, True),
                                           ((4, 3, 5), 1, False, 1.0, False)]:
        x = randn(shape, dtype=torch.float64, device=device, gen=gen).requires_grad_()

        def f(t):
            y = fl.softmax(t, dim, log=log, scale=scale, causal=causal)
            # log-softmax's masked -inf outputs are constants: finite differences there are NaN
            return y.masked_fill(causal_mask(*shape[-2:], device=device), 0) if causal else y

        assert torch.autograd.gradcheck(f, (x,))


def test_saves_only_y(device):
    """The backward node keeps the output, not the input: x may be freed after the forward."""
    x = torch.randn(4, 32, device=device, requires_grad=True)
    y = fl.softmax(x * 1.0)
    assert y.grad_fn.name() == "fused_layernorm::SoftmaxBackward"
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-6, rtol=0)


def test_double_backward_is_refused(device):
    x = torch.randn(3, 8, dtype=torch.float64, device=device, requires_grad=True)
    (g,) = torch.autograd.grad(fl.softmax(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_opcheck(device, seed):
    gen = generator(seed)
    x = randn((3, 5, 40), dtype=torch.float32, device=device, gen=gen).requires_grad_()
    torch.library.opcheck(ops.softmax.default, (x, -1, False, 1.0, False))
    torch.library.opcheck(ops.softmax.default, (x, 1, True, 0.5, False))
    xc = randn((2, 6, 9), dtype=torch.float32, device=device, gen=gen).requires_grad_()
    torch.library.opcheck(ops.softmax.default, (xc, -1, False, 0.125, True))
    torch.library.opcheck(ops.softmax_fwd.default, (x.detach().bfloat16(), True, 2.0, False))
    y = fl.softmax(x.detach())
    torch.library.opcheck(ops.softmax_bwd.default, (y, torch.randn_like(y), False, 1.0, False))
    torch.library.opcheck(ops.softmax_bwd.default, (xc.detach().log_softmax(-1), torch.randn_like(xc), True, 1.0, True))


def test_compile_fullgraph(device, seed):
    torch._dynamo.reset()
    x = randn((4, 16, 16), dtype=torch.float32, device=device, gen=generator(seed))
    g = torch.randn_like(x)

    def f(x):
        return fl.softmax(x * 2, scale=0.5, causal=True) + fl.log_softmax(x, 1)

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        xl = x.clone().requires_grad_()
        y = fn(xl)
        y.backward(g)
        outs.append((y.detach(), xl.grad))
    for a, e in zip(*outs):
        torch.testing.assert_close(a, e)
    torch._dynamo.reset()


# --- errors ---------------------------------------------------------------------------------


def test_errors(device):
    x = torch.randn(2, 3, 5, device=device)
    cases = [
        (lambda: fl.softmax(torch.randint(0, 3, (2, 5), device=device)), ValueError,
         "input must be float64, float32, float16 or bfloat16"),
        (lambda: fl.softmax(x.to(torch.complex64)), ValueError, "input must be float64"),
        (lambda: fl.softmax(x, causal=True).sum() + fl.softmax(x.transpose(1, 2), causal=True).sum(), ValueError,
         "causal needs q_len <= k_len"),
        (lambda: fl.softmax(torch.randn(5, device=device), causal=True), ValueError, "at least 2 dims"),
        (lambda: fl.softmax(x, 0, causal=True), ValueError, "causal needs dim=-1"),
        (lambda: fl.softmax(x, 3), IndexError, "dim 3 is out of range"),
        (lambda: fl.softmax(x, scale="2"), TypeError, "scale must be a number"),
        (lambda: fl.softmax(x, dim=1.0), TypeError, "dim must be an int"),
        (lambda: ops.softmax_bwd(x, x[:1], False, 1.0, False), ValueError, "grad_output must have output's shape"),
        (lambda: ops.softmax_bwd(x, x.double(), False, 1.0, False), ValueError, "grad_output must have output's dtype"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


@requires_cuda
def test_device_mismatch_is_an_error():
    y = torch.randn(2, 8, device="cuda")
    with pytest.raises(RuntimeError, match="grad_output is on cpu"):
        ops.softmax_bwd(y, torch.randn(2, 8), False, 1.0, False)


# --- CUDA ---------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_sanitize_small_cuda(dtype, seed):
    """Small cases for compute-sanitizer memcheck: every strategy (short rows sharing a CTA, a
    CTA a row, a cluster, the loop kernel), 16-byte and one-element accesses, causal, log."""
    gen = generator(seed)
    for rows, n in [(5, 7), (9, 256), (3, 1000), (2, 4096), (2, 40000), (1, 140000), (1, 300001)]:
        x = randn((rows, n), dtype=dtype, device="cuda", gen=gen, scale=2.0)
        run_and_check(x, seed=seed)
        run_and_check(x[:, 1:], log=True, scale=0.5, seed=seed)
    x = randn((2, 9, 40), dtype=dtype, device="cuda", gen=gen)
    run_and_check(x, causal=True, scale=0.25, seed=seed)


@requires_cuda
def test_cuda_matches_cpu(seed):
    x = randn((7, 3000), dtype=torch.bfloat16, device="cpu", gen=generator(seed), scale=3.0)
    for log in (False, True):
        a, b = fl.softmax(x, log=log), fl.softmax(x.cuda(), log=log).cpu()
        torch.testing.assert_close(b, a, rtol=2**-7, atol=1e-6)


@requires_cuda
def test_cuda_graph_capture(seed):
    """Forward and backward captured in a CUDA graph and replayed on new inputs."""
    gen = generator(seed)
    x = randn((8, 12, 12), dtype=torch.bfloat16, device="cuda", gen=gen)
    g = randn((8, 12, 12), dtype=torch.bfloat16, device="cuda", gen=gen)
    sx = x.clone().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up
            fl.softmax(sx, scale=0.5, causal=True).backward(g)
            sx.grad = None
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fl.softmax(sx, scale=0.5, causal=True)
        y.backward(g)
    x2 = randn((8, 12, 12), dtype=torch.bfloat16, device="cuda", gen=gen)
    with torch.no_grad():
        sx.copy_(x2)
    graph.replay()
    torch.cuda.synchronize()
    e = reference(x2, scale=0.5, causal=True)
    check(y, e, torch.bfloat16, fwd_slack(x2, e, False, 0.5, True), "replayed y", 12)
    xr = x2.double().requires_grad_()
    reference(xr, scale=0.5, causal=True).backward(g.double())
    torch.testing.assert_close(sx.grad.double(), xr.grad, rtol=2e-2, atol=2e-3)


@requires_cuda
@pytest.mark.parametrize("dtype,n,kernel", [(torch.bfloat16, 4096, "row"), (torch.bfloat16, 32768, "cluster"),
                                            (torch.float32, 131072, "cluster"), (torch.float32, 300000, "loop")],
                         ids=["bf16-4096", "bf16-32768", "fp32-131072", "fp32-300000"])
def test_rows_take_their_strategy(dtype, n, kernel, seed):
    """The kernels that ran (profiler), forward and backward: rows of one CTA the row kernel
    (Mode 0), rows of 64 KB and 512 KB on sm_90 a cluster (Mode 1: 2 and 16 CTAs of 512
    threads), longer rows the loop kernels.  A cluster the device refuses falls back to the
    loop kernels, right but slower: this test names it.  The names come from the benchmarks'
    own recorder (bench.timing.kernels_run), so this also runs it."""
    from fused_layernorm.bench.timing import kernels_run
    if kernel == "cluster" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    x = randn((3, n), dtype=dtype, device="cuda", gen=generator(seed))

    def both():
        y = ops.softmax_fwd(x, False, 1.0, False)
        ops.softmax_bwd(y, x, False, 1.0, False)

    names = [k for k in kernels_run(both) if "softmax_" in k and "_kernel" in k]
    marks = {"row": ("Mode)0", "ModeE0"), "cluster": ("Mode)1", "ModeE1"), "loop": ("loop_kernel",)}[kernel]
    for direction in ("fwd", "bwd"):
        ran = [k for k in names if f"softmax_{direction}_" in k]
        assert ran and all(any(m in k for m in marks) for k in ran), f"{direction}: {ran}"


@requires_cuda
def test_cuda_graph_capture_long_rows(seed):
    """Clusters (8, 13 non-portable and 16 CTAs) and the loop kernel, forward and backward ops,
    captured after a warm-up and replayed on new data: equal to eager, bitwise."""
    gen = generator(seed)
    cases = [(torch.bfloat16, 65536, False), (torch.float32, 100000, True), (torch.bfloat16, 262144, False),
             (torch.float32, 300000, True)]
    xs = [randn((3, n), dtype=dt, device="cuda", gen=gen, scale=2.0) for dt, n, _ in cases]
    gs = [randn((3, n), dtype=dt, device="cuda", gen=gen) for dt, n, _ in cases]

    def body():
        outs = []
        for (_, _, log), x, g in zip(cases, xs, gs):
            y = ops.softmax_fwd(x, log, 0.5, False)
            outs += [y, ops.softmax_bwd(y, g, log, 0.5, False)]
        return outs

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = body()
    for _ in range(2):
        with torch.no_grad():
            for (dt, n, _), x, g in zip(cases, xs, gs):
                x.copy_(randn((3, n), dtype=dt, device="cuda", gen=gen, scale=2.0))
                g.copy_(randn((3, n), dtype=dt, device="cuda", gen=gen))
        graph.replay()
        eager = body()
        torch.cuda.synchronize()
        for i, (a, e) in enumerate(zip(static, eager)):
            assert torch.equal(a, e), f"output {i} of the replay differs from eager"


@requires_cuda
@pytest.mark.slow
def test_64bit_offsets():
    """More than 2^31 elements (bf16, 4.3 GB, rows held by clusters): the last rows are right,
    forward and backward."""
    rows, n = 1 << 15, 65600  # 2.15e9 elements
    x = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda").normal_()
    y = fl.softmax(x)
    tail = x[-3:]
    torch.testing.assert_close(y[-3:].float(), torch.softmax(tail.float(), -1).to(torch.bfloat16).float(),
                               rtol=2e-2, atol=1e-7)
    dx = ops.softmax_bwd(y, x, False, 1.0, False)  # x as the incoming gradient: no third 4.3 GB input
    yt, gt = y[-3:].double(), tail.double()
    dxe = yt * (gt - (gt * yt).sum(-1, keepdim=True))
    torch.testing.assert_close(dx[-3:].double(), dxe, rtol=2e-2, atol=1e-6)
