"""Shared helpers for the fused_layernorm tests.

* float64 reference implementations written here (statistics in float64 on the
  upcast inputs, two-pass variance); they are differentiable, so autograd on
  them gives the reference gradients;
* seeded input makers;
* dtype-aware comparison against the reference.

Tolerances
----------
Every element of a result is compared with the float64 reference rounded to
the result's dtype:

    |actual - expected| <= ATOL[dtype] + RTOL[dtype] * |expected| + slack

ATOL/RTOL cover the final rounding to the storage dtype (about one ulp for
fp16/bf16).  ``slack`` covers the rounding errors of the float32 (float64 for
double inputs) arithmetic inside the op; it is ``u * growth(n) * scale`` with
``u`` the unit roundoff of the compute dtype, ``growth(n) = 8 + sqrt(n)`` for a
reduction over n terms (sequential summation grows like sqrt(n), tree
reductions slower) and ``scale`` the size of the terms the op combines,
including the conditioning of the row: LayerNorm output error is proportional
to ``rstd * max|x|``, which is ~3 for centred data but 1e4 for data offset by
1e4, or ~300 for a row of two nearly equal values.  Weight-gradient slack grows
with the number of rows summed.  For the default test data in float32 the
forward slack is ~1e-5 (hidden 127) to ~6e-5 (hidden 7168), so gross errors (a wrong formula, a missing term, a missed row or
column, low-precision accumulation) still fail by orders of magnitude.
"""
import math
import os
import zlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import pytest
import torch

CUDA_AVAILABLE = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason="CUDA not available")

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)

ATOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}
RTOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}

LN_EPS = 1e-5
RMS_EPS = 1e-6  # explicit eps used where the default-eps convention is not under test


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the op does its math in (and stores mean/rstd in)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_rms_eps(dtype: torch.dtype) -> float:
    """eps used by torch.nn.functional.rms_norm when eps=None.

    torch (2.11) uses the machine epsilon of the *computation* type: fp16/bf16
    and fp32 inputs use finfo(float32).eps, fp64 inputs finfo(float64).eps
    (see the nn.RMSNorm docstring), not finfo(input.dtype).eps.
    """
    return torch.finfo(compute_dtype(dtype)).eps


def unit_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff of the op's compute dtype for inputs of ``dtype``."""
    return 2.0**-53 if dtype == torch.float64 else 2.0**-24


def growth(n: int) -> float:
    return 8.0 + math.sqrt(max(n, 0))


def seed_from(text: str) -> int:
    """Per-test seed from the test id; FLN_TEST_SEED=<n> re-rolls every test's inputs."""
    return zlib.crc32(f"{os.environ.get('FLN_TEST_SEED', '')}{text}".encode())


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


GPU_DRAW_MIN = 1 << 16  # elements from which a CUDA tensor is drawn on the GPU


def randn(shape, *, dtype, device, gen, scale=1.0, offset=0.0) -> torch.Tensor:
    """``randn * scale + offset`` in float64, then cast; ``gen`` is a CPU generator.
    Drawn on the CPU, so that small inputs do not depend on the device.  A CUDA
    tensor of GPU_DRAW_MIN elements or more is drawn on the GPU, seeded by a draw
    of ``gen``: reproducible on one GPU model (torch's CUDA draws may depend on the
    SM count).  The CPU draws ~10 ns an element, serially, which cost seconds for
    each of the large tests' inputs."""
    shape = tuple(shape)
    if torch.device(device).type == "cuda" and math.prod(shape) >= GPU_DRAW_MIN:
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        cuda_gen = torch.Generator(device=device).manual_seed(seed)
        t = torch.randn(shape, generator=cuda_gen, dtype=torch.float64, device=device)
        return t.mul_(scale).add_(offset).to(dtype)
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset
    return t.to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


_DEFAULT = object()


@dataclass
class Inputs:
    kind: str  # "ln" or "rms"
    x: torch.Tensor
    normalized_shape: tuple
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    eps: Optional[float]
    grad_out: torch.Tensor


def make_inputs(
    kind: str,
    shape: Sequence[int],
    normalized_shape: Sequence[int],
    dtype: torch.dtype,
    device,
    gen: torch.Generator,
    *,
    weight: bool = True,
    bias: bool = True,
    param_dtype: Optional[torch.dtype] = None,
    eps=_DEFAULT,
    scale: float = 2.0,
    offset: float = 1.0,
) -> Inputs:
    """Random inputs: x ~ scale * N(0,1) + offset (nonzero mean), weight ~ 1 + 0.5 N(0,1),
    bias ~ 0.5 N(0,1) (LayerNorm only), grad_out ~ N(0,1).  ``eps`` defaults to
    LN_EPS / RMS_EPS; pass ``eps=None`` for the op's default (RMSNorm)."""
    normalized_shape = tuple(normalized_shape)
    param_dtype = param_dtype or dtype
    x = randn(shape, dtype=dtype, device=device, gen=gen, scale=scale, offset=offset)
    w = randn(normalized_shape, dtype=param_dtype, device=device, gen=gen, scale=0.5, offset=1.0) if weight else None
    b = None
    if kind == "ln" and bias:
        b = randn(normalized_shape, dtype=param_dtype, device=device, gen=gen, scale=0.5)
    g = randn(shape, dtype=dtype, device=device, gen=gen)
    if eps is _DEFAULT:
        eps = LN_EPS if kind == "ln" else RMS_EPS
    return Inputs(kind, x, normalized_shape, w, b, eps, g)


# ---------------------------------------------------------------------------
# float64 references
# ---------------------------------------------------------------------------


def _norm_dims(x: torch.Tensor, normalized_shape) -> tuple:
    return tuple(range(x.dim() - len(normalized_shape), x.dim()))


def ref_layer_norm(x, normalized_shape, weight=None, bias=None, eps=LN_EPS):
    """LayerNorm in float64: two-pass mean/variance of the float64 upcast."""
    dims = _norm_dims(x, normalized_shape)
    xd = x.double()
    mean = xd.mean(dim=dims, keepdim=True)
    var = (xd - mean).square().mean(dim=dims, keepdim=True)
    y = (xd - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def ref_rms_norm(x, normalized_shape, weight=None, eps=None, *, input_dtype=None):
    """RMSNorm in float64.  ``eps=None`` uses default_rms_eps of the input dtype."""
    if eps is None:
        eps = default_rms_eps(input_dtype or x.dtype)
    dims = _norm_dims(x, normalized_shape)
    xd = x.double()
    y = xd * torch.rsqrt(xd.square().mean(dim=dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return y


@dataclass
class Reference:
    """float64 reference results and the arithmetic slack allowed for each."""

    y: torch.Tensor
    mean: Optional[torch.Tensor]  # batch shape, LN only
    rstd: torch.Tensor  # batch shape
    dx: Optional[torch.Tensor] = None
    dweight: Optional[torch.Tensor] = None
    dbias: Optional[torch.Tensor] = None
    y_slack: torch.Tensor = 0.0
    dx_slack: torch.Tensor = 0.0
    dweight_slack: torch.Tensor = 0.0
    dbias_slack: torch.Tensor = 0.0
    mean_slack: torch.Tensor = 0.0
    rstd_slack: torch.Tensor = 0.0


def reference(inp: Inputs, backward: bool = True) -> Reference:
    """Reference outputs/gradients for ``inp`` and per-element slack."""
    ns = inp.normalized_shape
    dims = _norm_dims(inp.x, ns)
    x = inp.x.detach().double().requires_grad_(backward)
    w = None if inp.weight is None else inp.weight.detach().double().requires_grad_(backward)
    b = None if inp.bias is None else inp.bias.detach().double().requires_grad_(backward)
    if inp.kind == "ln":
        y = ref_layer_norm(x, ns, w, b, inp.eps)
    else:
        y = ref_rms_norm(x, ns, w, inp.eps, input_dtype=inp.x.dtype)
    with torch.no_grad():
        xd = x.detach()
        if inp.kind == "ln":
            mean = xd.mean(dim=dims, keepdim=True)
            var = (xd - mean).square().mean(dim=dims, keepdim=True)
            rstd = torch.rsqrt(var + inp.eps)
            xhat = (xd - mean) * rstd
        else:
            mean = None
            eps = default_rms_eps(inp.x.dtype) if inp.eps is None else inp.eps
            rstd = torch.rsqrt(xd.square().mean(dim=dims, keepdim=True) + eps)
            xhat = xd * rstd
    ref = Reference(
        y=y.detach(),
        mean=None if mean is None else mean.reshape(xd.shape[: xd.dim() - len(ns)]),
        rstd=rstd.reshape(xd.shape[: xd.dim() - len(ns)]),
    )

    # --- slack (see module docstring) ---
    n = math.prod(ns)
    rows = xd.numel() // n if n else 0
    u = unit_roundoff(inp.x.dtype)
    with torch.no_grad():
        absw = w.detach().abs() if w is not None else torch.ones((), dtype=torch.float64, device=xd.device)
        # conditioning of each row: rstd * max|x|  (>= max|xhat|)
        amax_x = xd.abs().amax(dim=dims, keepdim=True) if xd.numel() else torch.zeros_like(rstd)
        cond = rstd * amax_x
        ref.y_slack = u * growth(n) * cond * absw
        batch_shape = ref.rstd.shape
        # mean error ~ u growth(n) max|x|; rstd relative error ~ u growth(n) cond^2
        ref.mean_slack = (u * growth(n) * amax_x).reshape(batch_shape)
        ref.rstd_slack = (u * growth(n) * rstd * cond.square()).reshape(batch_shape)
    if not backward:
        return ref

    g = inp.grad_out.detach().double()
    y.backward(g)
    ref.dx = x.grad
    ref.dweight = None if w is None else w.grad
    ref.dbias = None if b is None else b.grad
    with torch.no_grad():
        wg = (g * absw).abs()
        amax_wg = wg.amax(dim=dims, keepdim=True) if wg.numel() else torch.zeros_like(rstd)
        ref.dx_slack = u * growth(n) * rstd * amax_wg * (1 + cond)
        batch_dims = tuple(range(xd.dim() - len(ns)))
        gabs = g.abs()
        ref.dweight_slack = u * (growth(rows) + growth(n)) * (gabs * (xhat.abs() + cond)).sum(dim=batch_dims)
        ref.dbias_slack = u * growth(rows) * gabs.sum(dim=batch_dims)
    return ref


# ---------------------------------------------------------------------------
# Running the library
# ---------------------------------------------------------------------------


@dataclass
class Result:
    y: torch.Tensor
    dx: Optional[torch.Tensor] = None
    dweight: Optional[torch.Tensor] = None
    dbias: Optional[torch.Tensor] = None


def poison_cuda_cache(*nbytes: int) -> None:
    """Fill blocks of these sizes with 0xFF bytes (NaN in every float dtype)
    and return them to the CUDA caching allocator, which hands the same blocks
    to the next allocations of those sizes: an output element the kernels
    never write then reads as NaN and fails the comparison."""
    blocks = [torch.empty(max(int(n), 1), dtype=torch.uint8, device="cuda").fill_(0xFF) for n in nbytes]
    del blocks


def run_fused(inp: Inputs, backward: bool = True, fn: Optional[Callable] = None) -> Result:
    """Forward (and backward with ``inp.grad_out``) through the public
    differentiable API on detached leaf copies of the inputs (same strides).
    On CUDA the outputs' memory is poisoned first (poison_cuda_cache)."""
    import fused_layernorm as fl

    if inp.x.is_cuda:
        rows = inp.x.numel() // max(math.prod(inp.normalized_shape), 1)
        x_bytes = inp.x.numel() * inp.x.element_size()
        w_bytes = 0 if inp.weight is None else inp.weight.numel() * inp.weight.element_size()
        # y and dx, mean and rstd, dweight and dbias
        poison_cuda_cache(x_bytes, x_bytes, 8 * rows, 8 * rows, w_bytes, w_bytes)

    def leaf(t):
        return None if t is None else t.detach().requires_grad_(backward)

    x, w, b = leaf(inp.x), leaf(inp.weight), leaf(inp.bias)
    if fn is not None:
        y = fn(x, w, b)
    elif inp.kind == "ln":
        y = fl.layer_norm(x, inp.normalized_shape, w, b, inp.eps)
    else:
        y = fl.rms_norm(x, inp.normalized_shape, w, inp.eps)
    if not backward:
        return Result(y.detach())
    y.backward(inp.grad_out)
    return Result(
        y.detach(),
        x.grad,
        None if w is None else w.grad,
        None if b is None else b.grad,
    )


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------


def assert_close(actual, expected, *, dtype, slack=0.0, what="output"):
    """Element-wise comparison of ``actual`` (stored in ``dtype``) against the
    float64 ``expected`` rounded to ``dtype`` (see module docstring)."""
    assert actual is not None, f"{what}: got None"
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    )
    a = actual.detach().double()
    nonfinite = (~torch.isfinite(a)).sum().item()
    assert nonfinite == 0, f"{what}: {nonfinite} non-finite elements of {a.numel()}"
    if a.numel() == 0:
        return
    e = expected.detach().to(dtype).double().to(a.device)
    slack = torch.as_tensor(slack, dtype=torch.float64, device=a.device)
    tol = ATOL[dtype] + RTOL[dtype] * e.abs() + slack
    err = (a - e).abs()
    bad = err > tol
    nbad = bad.sum().item()
    if nbad:
        ratio = err / tol
        i = int(ratio.flatten().argmax())
        idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), a.shape))
        raise AssertionError(
            f"{what} ({dtype_name(dtype)}): {nbad} of {a.numel()} elements out of tolerance; "
            f"max |err| = {err.max().item():.3e}; worst (err/tol = {ratio.flatten()[i].item():.1f}) at {idx}: "
            f"got {a[idx].item():.8g}, expected {e[idx].item():.8g}, tol {tol.expand_as(a)[idx].item():.3e}"
        )


def check_result(inp: Inputs, res: Result, ref: Reference, backward: bool = True):
    """Compare forward (and gradients) of ``res`` against ``ref``."""
    assert_close(res.y, ref.y, dtype=inp.x.dtype, slack=ref.y_slack, what="y")
    if not backward:
        return
    assert_close(res.dx, ref.dx, dtype=inp.x.dtype, slack=ref.dx_slack, what="dx")
    if inp.weight is not None:
        assert_close(res.dweight, ref.dweight, dtype=inp.weight.dtype, slack=ref.dweight_slack, what="dweight")
    if inp.bias is not None:
        assert_close(res.dbias, ref.dbias, dtype=inp.bias.dtype, slack=ref.dbias_slack, what="dbias")
