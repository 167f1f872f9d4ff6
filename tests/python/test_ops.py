"""Contract of the raw registered ops torch.ops.fused_layernorm.{layer_norm,rms_norm}_{fwd,bwd}:
statistics outputs (shape, dtype, values), output_mask semantics of the
backward ops, and agreement of the raw backward with the reference."""
import contextlib
import itertools

import pytest
import torch

import fused_layernorm  # noqa: F401  (registers the ops)
from helpers import (
    DTYPES,
    assert_close,
    compute_dtype,
    default_rms_eps,
    dtype_name,
    generator,
    make_inputs,
    reference,
)

ops = torch.ops.fused_layernorm
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)


@dtypes
@pytest.mark.parametrize("shape,ns", [((6, 130), (130,)), ((2, 3, 4, 33), (4, 33)), ((0, 16), (16,))],
                         ids=["2d", "4d-ns2", "empty"])
def test_layer_norm_fwd_returns_y_mean_rstd(dtype, shape, ns, device, seed):
    """layer_norm_fwd -> (y, mean, rstd): y like input; mean/rstd have the batch
    shape input.shape[:-len(ns)] and dtype float32 (float64 for double); values match."""
    inp = make_inputs("ln", shape, ns, dtype, device, generator(seed))
    y, mean, rstd = ops.layer_norm_fwd(inp.x, list(ns), inp.weight, inp.bias, inp.eps)
    ref = reference(inp, backward=False)
    batch = tuple(shape[: len(shape) - len(ns)])
    for name, t in (("mean", mean), ("rstd", rstd)):
        assert tuple(t.shape) == batch, f"{name} shape {tuple(t.shape)}, expected {batch}"
        assert t.dtype == compute_dtype(dtype), f"{name} dtype {t.dtype}"
        assert t.device == inp.x.device
    assert_close(y, ref.y, dtype=dtype, slack=ref.y_slack, what="y")
    assert_close(mean, ref.mean, dtype=compute_dtype(dtype), slack=ref.mean_slack, what="mean")
    assert_close(rstd, ref.rstd, dtype=compute_dtype(dtype), slack=ref.rstd_slack, what="rstd")


@dtypes
@pytest.mark.parametrize("eps", [1e-6, None], ids=["eps1e-6", "eps-default"])
def test_rms_norm_fwd_returns_y_rstd(dtype, eps, device, seed):
    """rms_norm_fwd -> (y, rstd): rstd has the batch shape, dtype float32 (float64 for double)."""
    inp = make_inputs("rms", (5, 3, 96), (96,), dtype, device, generator(seed), eps=eps)
    if eps is None:  # keep the default-eps convention out of this test (see test_accuracy)
        inp.eps = default_rms_eps(dtype)
    y, rstd = ops.rms_norm_fwd(inp.x, [96], inp.weight, inp.eps)
    ref = reference(inp, backward=False)
    assert tuple(rstd.shape) == (5, 3) and rstd.dtype == compute_dtype(dtype)
    assert_close(y, ref.y, dtype=dtype, slack=ref.y_slack, what="y")
    assert_close(rstd, ref.rstd, dtype=compute_dtype(dtype), slack=ref.rstd_slack, what="rstd")


MASKS3 = list(itertools.product([False, True], repeat=3))


@pytest.mark.parametrize("mask", MASKS3, ids=lambda m: "".join("1" if b else "0" for b in m))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_layer_norm_bwd_output_mask(mask, dtype, device, seed):
    """layer_norm_bwd returns None exactly for the entries whose mask is False;
    the others match the reference gradients."""
    inp = make_inputs("ln", (12, 200), (200,), dtype, device, generator(seed))
    _, mean, rstd = ops.layer_norm_fwd(inp.x, [200], inp.weight, inp.bias, inp.eps)
    grads = ops.layer_norm_bwd(inp.grad_out, inp.x, [200], mean, rstd, inp.weight, inp.bias, list(mask))
    ref = reference(inp)
    expected = [(ref.dx, ref.dx_slack, dtype), (ref.dweight, ref.dweight_slack, dtype), (ref.dbias, ref.dbias_slack, dtype)]
    for name, want, got, (e, slack, dt) in zip(("dx", "dweight", "dbias"), mask, grads, expected):
        if want:
            assert_close(got, e, dtype=dt, slack=slack, what=name)
        else:
            assert got is None, f"{name} should be None when its mask is False"


@pytest.mark.parametrize("weight,bias", [(False, False), (True, False), (False, True)])
def test_layer_norm_bwd_none_for_missing_params(weight, bias, device, seed):
    """With weight/bias None, dweight/dbias come back None even when requested."""
    inp = make_inputs("ln", (4, 64), (64,), torch.float32, device, generator(seed), weight=weight, bias=bias)
    _, mean, rstd = ops.layer_norm_fwd(inp.x, [64], inp.weight, inp.bias, inp.eps)
    dx, dw, db = ops.layer_norm_bwd(inp.grad_out, inp.x, [64], mean, rstd, inp.weight, inp.bias, [True, True, True])
    ref = reference(inp)
    assert_close(dx, ref.dx, dtype=torch.float32, slack=ref.dx_slack, what="dx")
    assert (dw is None) == (not weight) and (db is None) == (not bias)


@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=2)),
                         ids=lambda m: "".join("1" if b else "0" for b in m))
@pytest.mark.parametrize("weight", [False, True])
def test_rms_norm_bwd_output_mask(mask, weight, device, seed):
    """rms_norm_bwd: None where the mask is False or weight is None, reference values elsewhere."""
    inp = make_inputs("rms", (12, 200), (200,), torch.float32, device, generator(seed), weight=weight)
    _, rstd = ops.rms_norm_fwd(inp.x, [200], inp.weight, inp.eps)
    dx, dw = ops.rms_norm_bwd(inp.grad_out, inp.x, [200], rstd, inp.weight, list(mask))
    ref = reference(inp)
    if mask[0]:
        assert_close(dx, ref.dx, dtype=torch.float32, slack=ref.dx_slack, what="dx")
    else:
        assert dx is None
    if mask[1] and weight:
        assert_close(dw, ref.dweight, dtype=torch.float32, slack=ref.dweight_slack, what="dweight")
    else:
        assert dw is None


GRAD_MODES = ["record", "no_grad", "inference_mode", "no_input_requires_grad"]


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 300), (torch.bfloat16, 4096), (torch.float64, 140000)],
                         ids=["fp32-300", "bf16-4096", "fp64-140000"])
def test_differentiable_op_matches_fwd_op(kind, mode, dtype, hidden, device, seed):
    """The differentiable ops return the same y as the fwd ops (bitwise),
    whether autograd records (the fwd op and its statistics) or not (y alone,
    no statistics stored: CUDA's short-row kernel at 300, a one-CTA row at
    4096, the three-kernel split path of fp64 140000, which keeps its
    statistics in scratch memory)."""
    inp = make_inputs(kind, (3, hidden), (hidden,), dtype, device, generator(seed))
    for t in (inp.x, inp.weight, inp.bias):
        if t is not None:
            t.requires_grad_(mode != "no_input_requires_grad")
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
    with ctx():
        if kind == "ln":
            y = ops.layer_norm(inp.x, [hidden], inp.weight, inp.bias, inp.eps)
        else:
            y = ops.rms_norm(inp.x, [hidden], inp.weight, inp.eps)
    assert y.requires_grad == (mode == "record")
    with torch.no_grad():
        if kind == "ln":
            y_fwd = ops.layer_norm_fwd(inp.x, [hidden], inp.weight, inp.bias, inp.eps)[0]
        else:
            y_fwd = ops.rms_norm_fwd(inp.x, [hidden], inp.weight, inp.eps)[0]
    assert torch.equal(y.detach(), y_fwd)


def test_fused_wrappers_normalise_last_dim(device, seed):
    """fused_layer_norm / fused_rms_norm == layer_norm / rms_norm over x.shape[-1:]."""
    from fused_layernorm import fused_layer_norm, fused_rms_norm, layer_norm, rms_norm

    inp = make_inputs("ln", (3, 5, 77), (77,), torch.float32, device, generator(seed))
    assert torch.equal(fused_layer_norm(inp.x, inp.weight, inp.bias, 1e-3), layer_norm(inp.x, 77, inp.weight, inp.bias, 1e-3))
    assert torch.equal(fused_rms_norm(inp.x, inp.weight, 1e-3), rms_norm(inp.x, [77], inp.weight, 1e-3))
    assert torch.equal(fused_rms_norm(inp.x), rms_norm(inp.x, (77,)))


def test_package_imports_in_fresh_interpreter():
    """``import fused_layernorm`` works on its own (without importing torch first)
    and registers all six ops."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(fused_layernorm.__file__)))
    code = (
        "import fused_layernorm, torch\n"
        "for name in ('layer_norm_fwd', 'layer_norm_bwd', 'rms_norm_fwd', 'rms_norm_bwd', 'layer_norm', 'rms_norm'):\n"
        "    getattr(torch.ops.fused_layernorm, name).default\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
