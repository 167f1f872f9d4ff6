"""Forward and backward accuracy of layer_norm / rms_norm against the float64
reference in helpers.py, on every device and dtype.

Every test draws fresh random inputs (seeded per test), runs the public
differentiable API forward and backward, and compares y, dx, dweight and dbias
element by element (see helpers.py for the tolerances)."""
import pytest
import torch

import fused_layernorm  # noqa: F401  (registers torch.ops.fused_layernorm)
from helpers import (
    ATOL,
    DTYPES,
    HALF_DTYPES,
    LN_EPS,
    RTOL,
    check_result,
    dtype_name,
    generator,
    growth,
    make_inputs,
    randn,
    reference,
    run_fused,
    unit_roundoff,
)

KINDS = ["ln", "rms"]
HIDDEN_SIZES = [1, 2, 3, 127, 128, 1000, 4096, 5120, 7168]
ROW_COUNTS = [0, 1, 7, 1000]

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
kinds = pytest.mark.parametrize("kind", KINDS)


def check(inp, backward=True):
    res = run_fused(inp, backward)
    check_result(inp, res, reference(inp, backward), backward)
    return res


@kinds
@dtypes
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
def test_hidden_sizes(kind, dtype, hidden, device, seed):
    """7 rows of each hidden size (1 .. 7168), weight and bias, fwd + bwd."""
    check(make_inputs(kind, (7, hidden), (hidden,), dtype, device, generator(seed)))


@kinds
@dtypes
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_row_counts(kind, dtype, rows, device, seed):
    """0, 1, 7 and 1000 rows at hidden 1000; zero rows give empty y/dx and zero dweight/dbias."""
    inp = make_inputs(kind, (rows, 1000), (1000,), dtype, device, generator(seed))
    res = check(inp)
    if rows == 0:
        assert res.y.shape == (0, 1000) and res.dx.shape == (0, 1000)
        assert torch.equal(res.dweight, torch.zeros_like(inp.weight))
        if kind == "ln":
            assert torch.equal(res.dbias, torch.zeros_like(inp.bias))


@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_large_rows_and_hidden(kind, dtype, device, seed):
    """1000 rows x 7168: many row blocks and a long reduction for dweight/dbias."""
    check(make_inputs(kind, (1000, 7168), (7168,), dtype, device, generator(seed)))


@pytest.mark.parametrize("weight,bias", [(False, False), (True, False), (False, True), (True, True)])
@dtypes
def test_layer_norm_affine_options(weight, bias, dtype, device, seed):
    """LayerNorm with and without weight / bias (odd hidden size 127)."""
    check(make_inputs("ln", (9, 127), (127,), dtype, device, generator(seed), weight=weight, bias=bias))


@pytest.mark.parametrize("weight", [False, True])
@dtypes
def test_rms_norm_affine_options(weight, dtype, device, seed):
    """RMSNorm with and without weight (odd hidden size 127)."""
    check(make_inputs("rms", (9, 127), (127,), dtype, device, generator(seed), weight=weight))


@kinds
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("hidden", [127, 1024])
def test_float32_params_with_half_input(kind, dtype, hidden, device, seed):
    """Mixed precision: fp16/bf16 input with float32 weight/bias.
    y and dx come back in the input dtype, dweight/dbias in float32."""
    inp = make_inputs(kind, (33, hidden), (hidden,), dtype, device, generator(seed), param_dtype=torch.float32)
    res = check(inp)
    assert res.y.dtype == dtype and res.dx.dtype == dtype
    assert res.dweight.dtype == torch.float32


@kinds
@dtypes
def test_3d_input(kind, dtype, device, seed):
    """(batch, seq, hidden) input normalised over the last dim."""
    check(make_inputs(kind, (3, 11, 257), (257,), dtype, device, generator(seed)))


@kinds
@dtypes
def test_4d_input_2d_normalized_shape(kind, dtype, device, seed):
    """(2, 3, 5, 48) input normalised over the last two dims (5, 48)."""
    check(make_inputs(kind, (2, 3, 5, 48), (5, 48), dtype, device, generator(seed)))


@kinds
@pytest.mark.parametrize("shape", [(0, 5, 16), (4, 0, 16)], ids=["zero-lead", "zero-mid"])
def test_empty_batch_dims(kind, shape, device, seed):
    """Zero-size batch dims (anywhere before normalized_shape) give empty outputs and zero dweight."""
    inp = make_inputs(kind, shape, (16,), torch.float32, device, generator(seed))
    res = check(inp)
    assert res.y.shape == shape and res.dx.shape == shape
    assert torch.equal(res.dweight, torch.zeros_like(inp.weight))


# --- non-contiguous inputs --------------------------------------------------

def _strided_inputs(kind, layout, dtype, device, gen, rows=37, hidden=131):
    """Inputs whose x (and grad_out / weight for some layouts) are non-contiguous views."""
    inp = make_inputs(kind, (rows, hidden), (hidden,), dtype, device, gen)

    def rnd(shape, **kw):
        return randn(shape, dtype=dtype, device=device, gen=gen, **kw)

    if layout == "transpose":
        inp.x = rnd((hidden, rows), scale=2.0, offset=1.0).t()
        inp.grad_out = rnd((hidden, rows)).t()
    elif layout == "slice_odd_offset":
        inp.x = rnd((rows, hidden + 3), scale=2.0, offset=1.0)[:, 1 : hidden + 1]
        inp.grad_out = rnd((rows, hidden + 2))[:, 1:-1]
    elif layout == "expand_rows":  # every row is the same memory (row stride 0)
        inp.x = rnd((1, hidden), scale=2.0, offset=1.0).expand(rows, hidden)
    elif layout == "every_other_row":
        inp.x = rnd((2 * rows, hidden), scale=2.0, offset=1.0)[::2]
    elif layout == "strided_params":
        inp.weight = randn((2 * hidden,), dtype=dtype, device=device, gen=gen, scale=0.5, offset=1.0)[::2]
        if inp.bias is not None:
            inp.bias = randn((hidden + 1,), dtype=dtype, device=device, gen=gen, scale=0.5)[1:]
    else:
        raise AssertionError(layout)
    assert inp.x.shape == (rows, hidden) and inp.grad_out.shape == (rows, hidden)
    return inp


LAYOUTS = ["transpose", "slice_odd_offset", "expand_rows", "every_other_row", "strided_params"]


@kinds
@dtypes
@pytest.mark.parametrize("layout", LAYOUTS)
def test_noncontiguous_inputs(kind, dtype, layout, device, seed):
    """Transposed, sliced (odd offset), expanded and strided views of x / grad_out / weight / bias."""
    inp = _strided_inputs(kind, layout, dtype, device, generator(seed))
    if layout != "strided_params":
        assert not inp.x.is_contiguous()
    check(inp)


@kinds
@pytest.mark.parametrize("layout", ["transpose", "slice_odd_offset"])
def test_noncontiguous_large(kind, layout, device, seed):
    """Non-contiguous x at a size where kernels use vectorised / multi-block paths."""
    inp = _strided_inputs(kind, layout, torch.float32, device, generator(seed), rows=200, hidden=4096)
    check(inp)


def test_noncontiguous_expand_hidden_gives_constant_rows(device, seed):
    """x expanded along the hidden dim (inner stride 0): every row is constant,
    so y is the bias (xhat = 0) and dx = rstd * (w*g - mean(w*g))."""
    gen = generator(seed)
    inp = make_inputs("ln", (16, 256), (256,), torch.float32, device, gen)
    inp.x = randn((16, 1), dtype=torch.float32, device=device, gen=gen, scale=2.0, offset=1.0).expand(16, 256)
    check(inp)


# Sizes that take each CUDA forward: rows of a warp or less (64, 256, 1000 with
# padding; 1001 the scalar kernels), registers of one CTA (4096, 4104 with
# padding), the re-reading kernel (12288 fp32), clusters (32768, 65536), row
# groups (131072, 262144) and split rows (300000; sm_90 sizes, other GPUs take
# other paths).  16-bit x with fp32 weight and bias takes the kernels without
# the shifted one-pass sums; 16-bit rows of the short-row and re-reading
# kernels and of 16 KB and more sum x unshifted (common.cuh's snap_center).
@pytest.mark.parametrize("hidden", [64, 256, 1000, 1001, 4096, 4104, 12288, 20480, 32768, 65536, 131072, 262144,
                                    300000])
@pytest.mark.parametrize("value", [3.1, -1000.3])
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.float16, torch.float16), (torch.bfloat16, torch.float32)],
                         ids=["fp32", "bf16", "fp16", "bf16-fp32w"])
def test_layer_norm_constant_rows_give_the_bias(hidden, value, dtype, weight_dtype, device):
    """A constant row has zero variance, so xhat = 0 and y is exactly the bias
    (rounded once to y's dtype), as torch's Welford statistics give it;
    statistics that leave the mean an ulp off (a sum of n copies of 3.1 is not
    n * 3.1), or xhat formed as x * rstd - mean * rstd, would give ~1e-4
    instead (rstd = 316)."""
    import fused_layernorm as fl

    rows = max(4, (1 << 20) // hidden)
    x = torch.full((rows, hidden), value, device=device, dtype=dtype)
    gen = generator(hidden)
    w = randn((hidden,), dtype=weight_dtype, device=device, gen=gen)
    b = randn((hidden,), dtype=weight_dtype, device=device, gen=gen)
    y = fl.layer_norm(x, [hidden], w, b)
    expect = b.to(dtype).expand_as(y)
    bad = (y != expect).sum().item()
    assert bad == 0, f"{bad} elements differ from the bias; max |y - bias| {(y.float() - expect.float()).abs().max():.3e}"


# Rows all but constant: the 16-bit kernels that sum x unshifted take their
# variance about a 16-bit value next to the mean (snap_center); such a row must
# keep its own mean, not be taken as constant (its elements at the value would
# then give xhat = 0 instead of about -sqrt(outliers / hidden)).
@pytest.mark.parametrize("dtype,hidden,outliers,other", [
    (torch.float16, 1024, 3, 1000.5),    # the short-row kernel
    (torch.float16, 512, 1, 1000.5),
    (torch.bfloat16, 16384, 3, 1004.0),  # the re-reading kernel
    (torch.bfloat16, 65536, 15, 1004.0),  # a staged cluster (K = 0)
    (torch.float16, 65536, 100, 1000.5),
], ids=lambda v: dtype_name(v) if isinstance(v, torch.dtype) else str(v))
def test_layer_norm_near_constant_rows(dtype, hidden, outliers, other, device):
    """1000 but for a few elements one 16-bit step above: xhat (weight 1, bias
    0) matches float64 to the rounding of y and of an fp32 mean near 1000."""
    import fused_layernorm as fl

    rows = 8
    x = torch.full((rows, hidden), 1000.0, device=device, dtype=dtype)
    x[:, 7:7 + outliers] = other
    w = torch.ones(hidden, device=device, dtype=dtype)
    b = torch.zeros(hidden, device=device, dtype=dtype)
    y = fl.layer_norm(x, [hidden], w, b).double()
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + 1e-5)
    ref = (x64 - mean) * rstd
    # y's rounding, and 4 fp32 ulps of the mean (2^-23 * 1000 each) times rstd.
    tol = 2 * torch.finfo(dtype).eps * ref.abs() + 4 * 2.0**-23 * 1000 * rstd
    err = (y - ref).abs()
    assert (err <= tol).all(), f"max |y - ref| {err.max():.3e} where the bound is {tol[err > tol].min():.3e}"


# --- numerical stability and eps ---------------------------------------------

# Rows of one warp's lanes, of several warps, of a thread-block cluster
# (fp32 32768 on sm_90) and of the split path (300000): each sums its parts
# differently, and the register kernels form xhat as x * rstd - mean * rstd.
@pytest.mark.parametrize("rows,hidden", [(256, 128), (256, 1024), (256, 7168), (32, 32768), (4, 300000)])
def test_layer_norm_data_offset_by_1e4(rows, hidden, device, seed):
    """x = randn + 1e4 in float32: the statistics must be computed stably.

    The fp32 inputs are exact; their spacing near 1e4 is ~1e-3, so the
    unavoidable output error is ~1e-3.  A single-pass E[x^2] - E[x]^2 in fp32
    loses everything (variance error ~10 for a variance of 1), giving errors of
    order 1 or NaN."""
    gen = generator(seed)
    inp = make_inputs("ln", (rows, hidden), (hidden,), torch.float32, device, gen, scale=1.0, offset=1e4)
    res = run_fused(inp)
    ref = reference(inp)
    y_err = (res.y.double() - ref.y).abs().max().item()
    assert torch.isfinite(res.y).all()
    # A plain sequential fp32 sum over 7168 values ~1e4 errs by ~0.07 here; a
    # blocked/tree sum by ~5e-3.
    assert y_err < 0.1, f"max |y - ref| = {y_err:.3e} for data offset by 1e4"
    check_result(inp, res, ref)  # also dx / dweight / dbias with the conditioning-aware slack

    _, mean, rstd = torch.ops.fused_layernorm.layer_norm_fwd(inp.x, [hidden], inp.weight, inp.bias, LN_EPS)
    torch.testing.assert_close(mean.double(), ref.mean, rtol=1e-5, atol=0)
    torch.testing.assert_close(rstd.double(), ref.rstd, rtol=1e-2, atol=0)  # variance within 2%


# The CUDA forward sums x - K and (x - K)^2 with K the row's first element,
# in one reduction, and rows whose K lies far from the mean take an exact
# second pass (fwd_kernel.cuh, kMaxShiftRatio).  Rows whose first element
# sits 0.1 to 1e4 standard deviations from the rest cover both sides of that
# switch (the kernels that shift by K = 0 instead see their own test in
# test_cuda_only.py).  Hidden sizes on sm_90, bf16 (fp32): rows of a few
# lanes (128), of two warps in a CTA of two rows (2048), the scalar path
# (1001), one CTA (7168), the 32768 and 49152 register clusters that stage
# the next row, and 65536.  mean and rstd must be as accurate as a two-pass
# computation, whatever the row's conditioning.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [128, 1001, 2048, 7168, 32768, 49152, 65536])
def test_layer_norm_first_element_far_from_mean(hidden, dtype, device, seed):
    gen = generator(seed)
    rows = 64
    inp = make_inputs("ln", (rows, hidden), (hidden,), dtype, device, gen)
    x = randn((rows, hidden), dtype=torch.float64, device="cpu", gen=gen, offset=3.0)
    sign = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0).double()
    x[:, 0] = 3.0 + sign * torch.logspace(-1, 4, rows, dtype=torch.float64)
    inp.x = x.to(device=device, dtype=dtype)
    ref = reference(inp, backward=False)
    _, mean, rstd = torch.ops.fused_layernorm.layer_norm_fwd(inp.x, [hidden], inp.weight, inp.bias, LN_EPS)
    tol = 10 * unit_roundoff(dtype) * growth(hidden)
    mean_err = ((mean.double() - ref.mean) * ref.rstd).abs().max().item()  # in standard deviations
    rstd_err = (rstd.double() / ref.rstd - 1).abs().max().item()
    assert mean_err <= tol, f"mean off by {mean_err:.2e} standard deviations (tolerance {tol:.1e})"
    assert rstd_err <= tol, f"rstd off by {rstd_err:.2e} relative (tolerance {tol:.1e})"
    # y from those statistics: |xhat| reaches sqrt(hidden) at the outlier, so
    # the statistics' error enters y scaled by |xhat| + 1, on top of y's rounding.
    y = run_fused(inp, backward=False).y.double()
    xhat = (inp.x.double() - ref.mean[:, None]) * ref.rstd[:, None]
    bound = ATOL[dtype] + RTOL[dtype] * ref.y.abs() + (xhat.abs() + 1) * inp.weight.double().abs() * tol
    worst = ((y - ref.y).abs() / bound).max().item()
    assert worst <= 1, f"y off by {worst:.2f} times its bound"


@kinds
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=dtype_name)
def test_eps_is_applied(kind, dtype, device, seed):
    """eps comparable to the variance (x ~ 0.1 N(0,1), eps = 0.05): the result
    depends strongly on eps, so a dropped or hard-coded eps fails."""
    inp = make_inputs(kind, (16, 256), (256,), dtype, device, generator(seed), scale=0.1, offset=0.03, eps=0.05)
    check(inp)


# x scale at which the default eps (finfo(compute dtype).eps) changes y by ~1-10%
_DEFAULT_EPS_SCALE = {torch.float64: 1e-7, torch.float32: 1e-3, torch.float16: 1e-3, torch.bfloat16: 1e-3}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_rms_norm_default_eps(dtype, device, seed):
    """rms_norm(eps=None) uses torch.nn.functional.rms_norm's default eps:
    finfo of the compute type (float32 for fp16/bf16 inputs, float64 for fp64).
    Inputs are tiny so that eps is visible in the result; with
    finfo(fp16/bf16).eps instead, fp16/bf16 results would be off by >10x."""
    scale = _DEFAULT_EPS_SCALE[dtype]
    inp = make_inputs("rms", (8, 64), (64,), dtype, device, generator(seed), scale=scale, offset=0.0, eps=None)
    check(inp)
