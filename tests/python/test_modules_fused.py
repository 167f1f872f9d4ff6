"""FusedLayerNorm / FusedRMSNorm beyond the nn drop-in: isinstance, the fused
constructor arguments (dropout_p, weight_offset, residual_dtype), forward(x, residual),
train/eval dropout, TorchScript scripting, argument types.

Tests that run the fused op (a residual, dropout or a weight offset) skip when the
extension was built without ``fused_layernorm::add_norm``."""
import warnings

import pytest
import torch
from torch import nn

from fused_layernorm import FusedLayerNorm, FusedRMSNorm
from helpers import dtype_name, generator, randn

requires_add_norm = pytest.mark.skipif(
    not hasattr(torch.ops.fused_layernorm, "add_norm"), reason="extension built without fused_layernorm::add_norm"
)
KINDS = pytest.mark.parametrize("kind", ["ln", "rms"])


def make(kind, n=64, **kw):
    return FusedLayerNorm(n, **kw) if kind == "ln" else FusedRMSNorm(n, eps=1e-6, **kw)


def reference(kind, mod, x, residual=None, p_keep_mask=None):
    """float64 reference of forward(x, residual) with dropout mask ``p_keep_mask`` (bool) or none."""
    xd = x.double()
    if p_keep_mask is not None:
        xd = xd * p_keep_mask.double() / (1.0 - mod.dropout_p)
    h = xd if residual is None else xd + residual.double()
    dims = tuple(range(-len(mod.normalized_shape), 0))
    if kind == "ln":
        hn = (h - h.mean(dims, keepdim=True)) * torch.rsqrt(h.var(dims, unbiased=False, keepdim=True) + mod.eps)
    else:
        hn = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + mod.eps)
    y = hn
    if mod.weight is not None:
        y = y * (mod.weight.double() + mod.weight_offset)
    if kind == "ln" and mod.bias is not None:
        y = y + mod.bias.double()
    return y, h


def randomize(mod, seed):
    gen = generator(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(randn(p.shape, dtype=p.dtype, device=p.device, gen=gen, scale=0.5))
    return mod


def test_isinstance_of_torch_modules():
    assert isinstance(FusedLayerNorm(8), nn.LayerNorm)
    assert isinstance(FusedRMSNorm(8), nn.RMSNorm)
    assert not isinstance(FusedRMSNorm(8), nn.LayerNorm)


@KINDS
def test_defaults_keep_torch_repr_and_plain_forward(kind, device, seed):
    """With the fused arguments at their defaults, extra_repr is torch's and forward
    returns one tensor equal to the nn module's."""
    mod = randomize(make(kind, device=device), seed)
    ref = nn.LayerNorm(64, device=device) if kind == "ln" else nn.RMSNorm(64, eps=1e-6, device=device)
    ref.load_state_dict(mod.state_dict())
    assert mod.extra_repr() == ref.extra_repr()
    x = torch.randn(4, 64, device=device)
    torch.testing.assert_close(mod(x), ref(x), rtol=1e-5, atol=1e-5)


@KINDS
def test_fused_args_in_repr_and_attributes(kind):
    mod = make(kind, dropout_p=0.25, weight_offset=1.0, residual_dtype=torch.float32)
    assert (mod.dropout_p, mod.weight_offset, mod.residual_dtype) == (0.25, 1.0, torch.float32)
    r = mod.extra_repr()
    assert "dropout_p=0.25" in r and "weight_offset=1.0" in r and "residual_dtype=torch.float32" in r


@KINDS
def test_weight_offset_init_and_reset(kind):
    """The effective scale weight + weight_offset starts at 1: weight starts at 1 - offset (Gemma: zeros)."""
    mod = make(kind, weight_offset=1.0)
    assert torch.equal(mod.weight, torch.zeros(64))
    with torch.no_grad():
        mod.weight.fill_(3.0)
    mod.reset_parameters()
    assert torch.equal(mod.weight, torch.zeros(64))
    if kind == "ln":
        assert torch.equal(mod.bias, torch.zeros(64))


@KINDS
def test_state_dict_keys_with_fused_args(kind):
    mod = make(kind, dropout_p=0.1, weight_offset=1.0)
    assert list(mod.state_dict()) == list(make(kind).state_dict())


@pytest.mark.parametrize("cls", [FusedLayerNorm, FusedRMSNorm])
@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(eps="1e-5"), TypeError, "eps"),
        (dict(dropout_p="0.1"), TypeError, "dropout_p"),
        (dict(dropout_p=1.5), ValueError, "dropout_p"),
        (dict(dropout_p=-0.1), ValueError, "dropout_p"),
        (dict(weight_offset="1"), TypeError, "weight_offset"),
        (dict(residual_dtype="float32"), TypeError, "residual_dtype"),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(f"{k}={w}" for k, w in v.items()),
)
def test_constructor_argument_errors(cls, kwargs, exc, name):
    with pytest.raises(exc, match=name):
        cls(8, **kwargs)


@requires_add_norm
@KINDS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_weight_offset_without_residual(kind, dtype, device, seed):
    """forward(x) with weight_offset=1: y = norm(x) * (1 + weight), one tensor, offset added in fp32."""
    mod = randomize(make(kind, weight_offset=1.0, device=device, dtype=dtype), seed)
    x = randn((5, 64), dtype=dtype, device=device, gen=generator(seed), scale=2.0, offset=1.0)
    y = mod(x)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype
    ref, _ = reference(kind, mod, x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


@requires_add_norm
@KINDS
@pytest.mark.parametrize("residual_dtype", [None, torch.float32], ids=["same", "f32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_forward_with_residual(kind, dtype, residual_dtype, device, seed):
    """forward(x, residual) returns (y, h): h = x + residual in residual_dtype, y = norm(h) * w (+ b);
    gradients reach x, residual and the parameters.  Inputs are not modified."""
    if residual_dtype is not None and dtype == torch.float32:
        pytest.skip("residual_dtype float32 with float32 x is the default")
    mod = randomize(make(kind, device=device, dtype=dtype, residual_dtype=residual_dtype), seed)
    gen = generator(seed + 1)
    x = randn((3, 5, 64), dtype=dtype, device=device, gen=gen, scale=2.0, offset=1.0).requires_grad_()
    r = randn((3, 5, 64), dtype=dtype, device=device, gen=gen).requires_grad_()
    x0, r0 = x.detach().clone(), r.detach().clone()
    y, h = mod(x, r)
    assert h.dtype == (residual_dtype or dtype) and y.dtype == dtype
    assert torch.equal(x.detach(), x0) and torch.equal(r.detach(), r0)
    y_ref, h_ref = reference(kind, mod, x.detach(), r.detach())
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(h.double(), h_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
    (y.float().sum() + h.float().pow(2).sum()).backward()
    assert x.grad is not None and r.grad is not None and mod.weight.grad is not None


@requires_add_norm
@KINDS
def test_dropout_only_in_training(kind, device, seed):
    """dropout_p applies in train mode only: eval forward equals a p=0 module; train forward
    zeroes some of x's contribution and is reproducible under torch.manual_seed."""
    mod = randomize(make(kind, dropout_p=0.5, device=device), seed)
    plain = make(kind, device=device)
    plain.load_state_dict(mod.state_dict())
    x = torch.randn(8, 64, device=device) + 1.0
    r = torch.randn(8, 64, device=device)
    mod.eval()
    for a, b in zip(mod(x, r), plain(x, r)):
        assert torch.equal(a, b)
    mod.train()
    torch.manual_seed(seed)
    y1, h1 = mod(x, r)
    torch.manual_seed(seed)
    y2, h2 = mod(x, r)
    assert torch.equal(y1, y2) and torch.equal(h1, h2)
    dropped = (h1 - r).abs() < 1e-6
    assert 0 < dropped.sum() < dropped.numel()
    y_ref, h_ref = reference(kind, mod, x, r, p_keep_mask=~dropped)
    torch.testing.assert_close(h1.double(), h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y1.double(), y_ref, rtol=1e-5, atol=1e-5)


# --- TorchScript ---------------------------------------------------------------------


def script(mod):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(mod)


@KINDS
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no-affine"])
def test_script_plain(kind, affine, device, seed):
    """The scripted module gives the eager module's output and gradients (the plain op)."""
    mod = randomize(make(kind, elementwise_affine=affine, device=device), seed)
    sm = script(mod)
    x = torch.randn(3, 7, 64, device=device, requires_grad=True)
    y = mod(x)
    ys = sm(x)
    assert torch.equal(y, ys)
    gx, = torch.autograd.grad(y.sum(), x)
    gxs, = torch.autograd.grad(ys.sum(), x)
    assert torch.equal(gx, gxs)


def test_script_layer_norm_without_bias(device):
    mod = FusedLayerNorm((4, 16), bias=False, device=device)
    x = torch.randn(2, 4, 16, device=device)
    assert torch.equal(script(mod)(x), mod(x))


@requires_add_norm
@KINDS
@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(weight_offset=1.0), dict(dropout_p=0.3, residual_dtype=torch.float32)],
    ids=["plain", "offset", "dropout-f32res"],
)
def test_script_fused(kind, kwargs, device, seed):
    """Scripted forward(x) and forward(x, residual), train and eval, equal eager's (bf16)."""
    mod = randomize(make(kind, device=device, dtype=torch.bfloat16, **kwargs), seed)
    sm = script(mod)
    x = torch.randn(4, 64, device=device, dtype=torch.bfloat16)
    r = torch.randn(4, 64, device=device, dtype=torch.bfloat16)
    for train in (False, True):
        mod.train(train)
        sm.train(train)
        for args in ((x,), (x, r)):
            torch.manual_seed(seed)
            eager = mod(*args)
            torch.manual_seed(seed)
            scripted = sm(*args)
            if len(args) == 1:
                assert torch.equal(eager, scripted)
            else:
                assert len(eager) == len(scripted) == 2
                assert all(torch.equal(a, b) for a, b in zip(eager, scripted))


@requires_add_norm
@KINDS
def test_compile_fused_forward(kind, device, seed):
    """torch.compile (fullgraph) of forward(x) and forward(x, residual) with a weight offset equals eager."""
    mod = randomize(make(kind, weight_offset=1.0, device=device), seed)
    compiled = torch.compile(mod, fullgraph=True, backend="aot_eager")
    x, r = torch.randn(4, 64, device=device), torch.randn(4, 64, device=device)
    assert torch.equal(compiled(x), mod(x))
    for a, b in zip(compiled(x, r), mod(x, r)):
        assert torch.equal(a, b)


class _Parent(nn.Module):
    """A model holding a norm: forward(x) must be a Tensor to its TorchScript caller."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return self.lin(self.norm(x))


class _ResidualParent(nn.Module):
    """A pre-norm block: forward(x, residual) must be a tuple to its TorchScript caller."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.lin = nn.Linear(64, 64)

    def forward(self, x, residual):
        y, h = self.norm(x, residual)
        return self.lin(y) + h


@KINDS
def test_script_inside_a_model(kind, device, seed):
    """A scripted model containing the module (as it would contain nn.LayerNorm) scripts and
    matches eager, for forward(x) and, with add_norm, forward(x, residual)."""
    x, r = torch.randn(4, 64, device=device), torch.randn(4, 64, device=device)
    parents = [_Parent] + ([_ResidualParent] if hasattr(torch.ops.fused_layernorm, "add_norm") else [])
    for parent_cls in parents:
        model = parent_cls(randomize(make(kind, device=device), seed)).to(device)
        sm = script(model)
        args = (x,) if parent_cls is _Parent else (x, r)
        torch.testing.assert_close(sm(*args), model(*args), rtol=1e-6, atol=1e-6)
        assert type(model.norm) in (FusedLayerNorm, FusedRMSNorm)


@KINDS
def test_scripted_module_shares_parameters(kind, device):
    """Like a scripted nn.LayerNorm, the scripted module holds the module's own parameters."""
    mod = make(kind, device=device)
    sm = script(mod)
    assert type(mod) in (FusedLayerNorm, FusedRMSNorm)
    assert all(a is b for a, b in zip(sm.parameters(), mod.parameters()))
    x = torch.randn(2, 64, device=device)
    with torch.no_grad():
        mod.weight.mul_(3.0)
    torch.testing.assert_close(sm(x), mod(x))
