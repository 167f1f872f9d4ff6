"""Argument checking: every bad input raises RuntimeError or ValueError whose
message names the offending argument; and no op ever modifies its inputs.

Each bad-input case is checked on the public differentiable functions
(layer_norm / rms_norm) and on the raw forward ops."""
import pytest
import torch

import fused_layernorm as fl
from helpers import DTYPES, dtype_name, generator, make_inputs, requires_cuda

ops = torch.ops.fused_layernorm
ERRORS = (RuntimeError, ValueError)

LN_ENTRIES = ["layer_norm", "layer_norm_fwd"]
RMS_ENTRIES = ["rms_norm", "rms_norm_fwd"]
ALL_ENTRIES = LN_ENTRIES + RMS_ENTRIES

all_entries = pytest.mark.parametrize("entry", ALL_ENTRIES)
ln_entries = pytest.mark.parametrize("entry", LN_ENTRIES)


def call(entry, x, normalized_shape, weight=None, bias=None):
    ns = list(normalized_shape)
    if entry == "layer_norm":
        return fl.layer_norm(x, ns, weight, bias, 1e-5)
    if entry == "layer_norm_fwd":
        return ops.layer_norm_fwd(x, ns, weight, bias, 1e-5)
    assert bias is None
    if entry == "rms_norm":
        return fl.rms_norm(x, ns, weight, None)
    if entry == "rms_norm_fwd":
        return ops.rms_norm_fwd(x, ns, weight, None)
    raise AssertionError(entry)


def x_f32(*shape, device="cpu", dtype=torch.float32):
    return torch.randn(shape, device=device, dtype=dtype)


# --- normalized_shape -------------------------------------------------------

@all_entries
def test_normalized_shape_not_matching_trailing_dims(entry, device):
    with pytest.raises(ERRORS, match="normalized_shape"):
        call(entry, x_f32(4, 8, device=device), [7])


@all_entries
def test_normalized_shape_matching_a_non_trailing_dim(entry, device):
    with pytest.raises(ERRORS, match="normalized_shape"):
        call(entry, x_f32(4, 8, device=device), [4])


@all_entries
def test_empty_normalized_shape(entry, device):
    with pytest.raises(ERRORS, match="normalized_shape"):
        call(entry, x_f32(4, 8, device=device), [])


@all_entries
def test_normalized_shape_longer_than_input_dim(entry, device):
    with pytest.raises(ERRORS, match="normalized_shape"):
        call(entry, x_f32(4, 8, device=device), [3, 4, 8])


@all_entries
def test_negative_normalized_dim(entry, device):
    """A negative size in normalized_shape.  (An empty one, size 0, is valid
    as in torch: tests/python/test_contract.py.)"""
    with pytest.raises(ERRORS, match="normalized_shape"):
        call(entry, x_f32(4, 8, device=device), [-1])


def test_fused_wrappers_reject_0d_input(device):
    x = torch.tensor(1.0, device=device)
    with pytest.raises(ERRORS, match="input"):
        fl.fused_layer_norm(x)
    with pytest.raises(ERRORS, match="input"):
        fl.fused_rms_norm(x)


# --- input dtype --------------------------------------------------------------

@all_entries
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8], ids=dtype_name)
def test_integer_input(entry, dtype, device):
    x = torch.randint(0, 5, (4, 8), device=device, dtype=dtype)
    with pytest.raises(ERRORS, match="input"):
        call(entry, x, [8])


@all_entries
def test_bool_input(entry, device):
    x = torch.randint(0, 2, (4, 8), device=device).bool()
    with pytest.raises(ERRORS, match="input"):
        call(entry, x, [8])


@all_entries
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=dtype_name)
def test_complex_input(entry, dtype, device):
    with pytest.raises(ERRORS, match="input"):
        call(entry, x_f32(4, 8, device=device, dtype=dtype), [8])


# --- weight / bias ------------------------------------------------------------

@all_entries
@pytest.mark.parametrize("wshape", [(7,), (1,), (8, 1), (2, 8)], ids=str)
def test_weight_wrong_shape(entry, wshape, device):
    with pytest.raises(ERRORS, match="weight"):
        call(entry, x_f32(4, 8, device=device), [8], weight=torch.ones(wshape, device=device))


@ln_entries
@pytest.mark.parametrize("bshape", [(7,), (8, 1)], ids=str)
def test_bias_wrong_shape(entry, bshape, device):
    with pytest.raises(ERRORS, match="bias"):
        call(entry, x_f32(4, 8, device=device), [8], weight=torch.ones(8, device=device),
             bias=torch.zeros(bshape, device=device))


@all_entries
def test_weight_float64_with_float32_input(entry, device):
    w = torch.ones(8, device=device, dtype=torch.float64)
    with pytest.raises(ERRORS, match="weight"):
        call(entry, x_f32(4, 8, device=device), [8], weight=w)


@all_entries
def test_weight_float16_with_bfloat16_input(entry, device):
    x = x_f32(4, 8, device=device, dtype=torch.bfloat16)
    with pytest.raises(ERRORS, match="weight"):
        call(entry, x, [8], weight=torch.ones(8, device=device, dtype=torch.float16))


@ln_entries
def test_bias_float64_with_float32_input(entry, device):
    b = torch.zeros(8, device=device, dtype=torch.float64)
    with pytest.raises(ERRORS, match="bias"):
        call(entry, x_f32(4, 8, device=device), [8], bias=b)


@ln_entries
def test_bias_float16_with_bfloat16_input(entry, device):
    x = x_f32(4, 8, device=device, dtype=torch.bfloat16)
    with pytest.raises(ERRORS, match="bias"):
        call(entry, x, [8], bias=torch.zeros(8, device=device, dtype=torch.float16))


@ln_entries
@pytest.mark.parametrize("wdtype,bdtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)],
                         ids=["w_f32-b_bf16", "w_bf16-b_f32"])
def test_weight_and_bias_dtypes_differ(entry, wdtype, bdtype, device):
    """Each dtype alone is allowed for a bf16 input (bf16 or float32), but they must agree."""
    x = x_f32(4, 8, device=device, dtype=torch.bfloat16)
    w = torch.ones(8, device=device, dtype=wdtype)
    b = torch.zeros(8, device=device, dtype=bdtype)
    with pytest.raises(ERRORS, match="bias"):
        call(entry, x, [8], weight=w, bias=b)


@requires_cuda
@all_entries
def test_weight_on_cpu_with_cuda_input(entry):
    with pytest.raises(ERRORS, match="weight"):
        call(entry, x_f32(4, 8, device="cuda"), [8], weight=torch.ones(8))


@requires_cuda
@ln_entries
def test_bias_on_cpu_with_cuda_input(entry):
    with pytest.raises(ERRORS, match="bias"):
        call(entry, x_f32(4, 8, device="cuda"), [8], weight=torch.ones(8, device="cuda"), bias=torch.zeros(8))


@requires_cuda
@all_entries
def test_weight_on_cuda_with_cpu_input(entry):
    with pytest.raises(ERRORS, match="weight"):
        call(entry, x_f32(4, 8), [8], weight=torch.ones(8, device="cuda"))


# --- backward ops -------------------------------------------------------------

def _ln_bwd_args(device):
    x = x_f32(4, 8, device=device)
    w, b = torch.ones(8, device=device), torch.zeros(8, device=device)
    _, mean, rstd = ops.layer_norm_fwd(x, [8], w, b, 1e-5)
    return dict(grad_out=torch.randn_like(x), input=x, mean=mean, rstd=rstd, weight=w, bias=b)


def _call_ln_bwd(a):
    return ops.layer_norm_bwd(a["grad_out"], a["input"], [8], a["mean"], a["rstd"], a["weight"], a["bias"],
                              [True, True, True])


@pytest.mark.parametrize("arg,bad", [
    ("grad_out", lambda t: t[:, :7]),
    ("grad_out", lambda t: t.double()),
    ("mean", lambda t: t[:3]),
    ("rstd", lambda t: t[:3]),
    ("rstd", lambda t: t.half()),
    ("weight", lambda t: t[:7]),
], ids=["grad_out-shape", "grad_out-dtype", "mean-shape", "rstd-shape", "rstd-dtype", "weight-shape"])
def test_layer_norm_bwd_bad_argument(arg, bad, device):
    a = _ln_bwd_args(device)
    a[arg] = bad(a[arg])
    with pytest.raises(ERRORS, match=arg):
        _call_ln_bwd(a)


@pytest.mark.parametrize("arg,bad", [
    ("grad_out", lambda t: t[:, :7]),
    ("rstd", lambda t: t[:3]),
    ("weight", lambda t: t.double()),
], ids=["grad_out-shape", "rstd-shape", "weight-dtype"])
def test_rms_norm_bwd_bad_argument(arg, bad, device):
    x = x_f32(4, 8, device=device)
    a = dict(grad_out=torch.randn_like(x), input=x, weight=torch.ones(8, device=device))
    a["rstd"] = ops.rms_norm_fwd(x, [8], a["weight"], None)[1]
    a[arg] = bad(a[arg])
    with pytest.raises(ERRORS, match=arg):
        ops.rms_norm_bwd(a["grad_out"], a["input"], [8], a["rstd"], a["weight"], [True, True])


# --- inputs are never modified ------------------------------------------------

def _snapshot(*tensors):
    return [None if t is None else t.clone() for t in tensors]


def _assert_unchanged(tensors, snapshots, names):
    for t, s, name in zip(tensors, snapshots, names):
        if t is not None:
            assert torch.equal(t, s), f"{name} was modified by the op"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_layer_norm_ops_do_not_modify_inputs(dtype, layout, device, seed):
    inp = make_inputs("ln", (33, 160), (160,), dtype, device, generator(seed))
    if layout == "transposed":
        inp.x = inp.x.t().contiguous().t()
        inp.grad_out = inp.grad_out.t().contiguous().t()
    names = ("x", "weight", "bias", "grad_out")
    tensors = (inp.x, inp.weight, inp.bias, inp.grad_out)
    snaps = _snapshot(*tensors)

    y, mean, rstd = ops.layer_norm_fwd(inp.x, [160], inp.weight, inp.bias, 1e-5)
    _assert_unchanged(tensors, snaps, names)
    stats = _snapshot(mean, rstd)
    ops.layer_norm_bwd(inp.grad_out, inp.x, [160], mean, rstd, inp.weight, inp.bias, [True, True, True])
    _assert_unchanged(tensors + (mean, rstd), snaps + stats, names + ("mean", "rstd"))

    x, w, b = (t.detach().requires_grad_() for t in (inp.x, inp.weight, inp.bias))
    fl.layer_norm(x, [160], w, b).backward(inp.grad_out)
    _assert_unchanged((x.detach(), w.detach(), b.detach(), inp.grad_out), snaps, names)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_rms_norm_ops_do_not_modify_inputs(dtype, layout, device, seed):
    inp = make_inputs("rms", (33, 160), (160,), dtype, device, generator(seed))
    if layout == "transposed":
        inp.x = inp.x.t().contiguous().t()
        inp.grad_out = inp.grad_out.t().contiguous().t()
    names = ("x", "weight", "grad_out")
    tensors = (inp.x, inp.weight, inp.grad_out)
    snaps = _snapshot(*tensors)

    y, rstd = ops.rms_norm_fwd(inp.x, [160], inp.weight, None)
    _assert_unchanged(tensors, snaps, names)
    stats = _snapshot(rstd)
    ops.rms_norm_bwd(inp.grad_out, inp.x, [160], rstd, inp.weight, [True, True])
    _assert_unchanged(tensors + (rstd,), snaps + stats, names + ("rstd",))

    x, w = (t.detach().requires_grad_() for t in (inp.x, inp.weight))
    fl.rms_norm(x, [160], w).backward(inp.grad_out)
    _assert_unchanged((x.detach(), w.detach(), inp.grad_out), snaps, names)


# --- argument types ----------------------------------------------------------

BAD_NUMBERS = ["1e-5", [1e-5], object()]


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=["str", "list", "object"])
@pytest.mark.parametrize("fn", ["layer_norm", "fused_layer_norm", "rms_norm", "fused_rms_norm"])
def test_eps_must_be_a_number(fn, bad, device):
    """eps="1e-5" raises TypeError naming eps, as torch's functions do (not a silent float())."""
    x = x_f32(4, 8, device=device)
    args = (x, [8]) if fn in ("layer_norm", "rms_norm") else (x,)
    with pytest.raises(TypeError, match="eps"):
        getattr(fl, fn)(*args, eps=bad)


@pytest.mark.parametrize("eps", [1e-5, 1, True, torch.tensor(1e-5)], ids=["float", "int", "bool", "0d-tensor"])
def test_eps_numbers_accepted_as_torch_does(eps):
    x = x_f32(4, 8)
    ref = torch.nn.functional.layer_norm(x, [8], eps=eps)
    torch.testing.assert_close(fl.layer_norm(x, [8], eps=eps), ref)
    torch.testing.assert_close(fl.rms_norm(x, [8], eps=eps), torch.nn.functional.rms_norm(x, [8], eps=eps))


def test_eps_numpy_scalar_accepted():
    np = pytest.importorskip("numpy")
    x = x_f32(4, 8)
    torch.testing.assert_close(fl.layer_norm(x, [8], eps=np.float32(1e-3)),
                               torch.nn.functional.layer_norm(x, [8], eps=1e-3))


@pytest.mark.skipif(not hasattr(ops, "add_norm"), reason="extension built without fused_layernorm::add_norm")
@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(dropout_p="0.1"), TypeError, "dropout_p"),
        (dict(dropout_p=2.0), ValueError, "dropout_p"),
        (dict(weight_offset="1"), TypeError, "weight_offset"),
        (dict(residual_dtype="float32", return_residual=True), TypeError, "residual_dtype"),
        (dict(eps="1e-5", weight_offset=1.0), TypeError, "eps"),
    ],
    ids=["dropout_p-str", "dropout_p-range", "weight_offset-str", "residual_dtype-str", "eps-str-fused"],
)
@pytest.mark.parametrize("fn", ["layer_norm", "rms_norm"])
def test_fused_argument_types(fn, kwargs, exc, name):
    x = x_f32(4, 8)
    with pytest.raises(exc, match=name):
        getattr(fl, fn)(x, [8], **kwargs)
