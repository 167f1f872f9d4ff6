"""FusedLayerNorm / FusedRMSNorm are drop-ins for nn.LayerNorm / nn.RMSNorm:
same constructor, parameters, state_dict keys, reset_parameters, extra_repr,
and matching outputs and gradients."""
import pytest
import torch
from torch import nn

from fused_layernorm import FusedLayerNorm, FusedRMSNorm
from helpers import dtype_name, generator, randn

# (torch module, fused module, constructor kwargs)
LN_CONFIGS = [
    dict(normalized_shape=64),
    dict(normalized_shape=(5, 64), eps=1e-3),
    dict(normalized_shape=[64], bias=False),
    dict(normalized_shape=64, elementwise_affine=False),
]
RMS_CONFIGS = [
    dict(normalized_shape=64),
    dict(normalized_shape=(5, 64), eps=1e-3),
    dict(normalized_shape=[64], eps=1e-6),
    dict(normalized_shape=64, elementwise_affine=False),
]
CASES = [("ln", nn.LayerNorm, FusedLayerNorm, c) for c in LN_CONFIGS] + [
    ("rms", nn.RMSNorm, FusedRMSNorm, c) for c in RMS_CONFIGS
]
CASE_IDS = [f"{k}-{'-'.join(f'{a}={v}' for a, v in c.items())}" for k, _, _, c in CASES]
cases = pytest.mark.parametrize("kind,torch_cls,fused_cls,kwargs", CASES, ids=CASE_IDS)


def _randomize_params(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(randn(p.shape, dtype=p.dtype, device=p.device, gen=gen, scale=0.5, offset=1.0))


@cases
def test_same_parameters_and_state_dict_keys(kind, torch_cls, fused_cls, kwargs):
    ref, mod = torch_cls(**kwargs), fused_cls(**kwargs)
    assert [n for n, _ in mod.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(mod.state_dict().keys()) == list(ref.state_dict().keys())
    for (n, p), (_, q) in zip(mod.named_parameters(), ref.named_parameters()):
        assert p.shape == q.shape and p.dtype == q.dtype, n
    assert mod.normalized_shape == ref.normalized_shape
    assert mod.eps == ref.eps and mod.elementwise_affine == ref.elementwise_affine
    if kind == "ln":
        assert (mod.bias is None) == (ref.bias is None)
    if not kwargs.get("elementwise_affine", True):
        assert mod.weight is None and list(mod.parameters()) == []


@cases
def test_extra_repr_matches_torch(kind, torch_cls, fused_cls, kwargs):
    assert fused_cls(**kwargs).extra_repr() == torch_cls(**kwargs).extra_repr()


@cases
def test_reset_parameters(kind, torch_cls, fused_cls, kwargs, seed):
    """After randomising the parameters, reset_parameters gives torch's initial values (ones / zeros)."""
    ref, mod = torch_cls(**kwargs), fused_cls(**kwargs)
    for m in (ref, mod):
        _randomize_params(m, generator(seed))
        m.reset_parameters()
    for (n, p), (_, q) in zip(mod.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(p, q), n


@cases
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_name)
def test_load_torch_state_dict_and_match_outputs_and_grads(kind, torch_cls, fused_cls, kwargs, dtype, device, seed):
    """Load an nn module's (random) state_dict strictly into the fused module; the
    output, input gradient and parameter gradients match the torch module's."""
    gen = generator(seed)
    ref = torch_cls(**kwargs, device=device, dtype=dtype)
    _randomize_params(ref, gen)
    mod = fused_cls(**kwargs, device=device, dtype=dtype)
    mod.load_state_dict(ref.state_dict(), strict=True)

    ns = ref.normalized_shape
    x = randn((3, 7) + tuple(ns), dtype=dtype, device=device, gen=gen, scale=2.0, offset=1.0)
    g = randn(x.shape, dtype=dtype, device=device, gen=gen)
    x_ref, x_mod = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_mod = ref(x_ref), mod(x_mod)
    y_ref.backward(g)
    y_mod.backward(g)

    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y_mod, y_ref, **tol)
    torch.testing.assert_close(x_mod.grad, x_ref.grad, **tol)
    grads_ref = {n: p.grad for n, p in ref.named_parameters()}
    grads_mod = {n: p.grad for n, p in mod.named_parameters()}
    assert grads_mod.keys() == grads_ref.keys()
    for n in grads_ref:
        # parameter grads sum over 21 rows
        torch.testing.assert_close(grads_mod[n], grads_ref[n], rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)


@pytest.mark.parametrize("kind,torch_cls,fused_cls", [("ln", nn.LayerNorm, FusedLayerNorm), ("rms", nn.RMSNorm, FusedRMSNorm)])
def test_fused_state_dict_loads_into_torch_module(kind, torch_cls, fused_cls, seed):
    """The other direction: a fused module's state_dict loads strictly into the nn module."""
    mod = fused_cls(32)
    _randomize_params(mod, generator(seed))
    ref = torch_cls(32)
    ref.load_state_dict(mod.state_dict(), strict=True)
    for n, p in mod.state_dict().items():
        assert torch.equal(ref.state_dict()[n], p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_name)
def test_rms_norm_default_eps_matches_torch_module(dtype, device, seed):
    """FusedRMSNorm(eps=None) behaves like nn.RMSNorm(eps=None) on small
    activations (x ~ 1e-3, where the default eps matters).  torch uses
    finfo(float32).eps for fp16/bf16/fp32 inputs."""
    gen = generator(seed)
    x = randn((16, 64), dtype=dtype, device=device, gen=gen, scale=1e-3)
    ref = nn.RMSNorm(64, device=device, dtype=dtype)(x)
    out = FusedRMSNorm(64, device=device, dtype=dtype)(x)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("fused_cls", [FusedLayerNorm, FusedRMSNorm])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=dtype_name)
def test_device_and_dtype_kwargs(fused_cls, dtype, device):
    """Parameters are created on the requested device with the requested dtype,
    and the module runs on an input of that dtype."""
    mod = fused_cls(48, device=device, dtype=dtype)
    for p in mod.parameters():
        assert p.device.type == device and p.dtype == dtype
    x = torch.randn(5, 48, device=device, dtype=dtype)
    y = mod(x)
    assert y.dtype == dtype and y.device == x.device and y.shape == x.shape


@pytest.mark.parametrize("fused_cls", [FusedLayerNorm, FusedRMSNorm])
def test_module_to_dtype(fused_cls, device):
    """module.to(dtype) then forward in that dtype (and float32 params with a bf16 input)."""
    mod = fused_cls(48).to(device)
    x = torch.randn(5, 48, device=device, dtype=torch.bfloat16)
    assert mod(x).dtype == torch.bfloat16  # float32 parameters, bf16 input
    assert mod.to(torch.bfloat16)(x).dtype == torch.bfloat16


@pytest.mark.parametrize("fused_cls", [FusedLayerNorm, FusedRMSNorm])
def test_meta_device(fused_cls):
    """On the meta device the module is constructible and forward gives the right shape/dtype."""
    mod = fused_cls((4, 16), device="meta", dtype=torch.bfloat16)
    y = mod(torch.empty(2, 3, 4, 16, device="meta", dtype=torch.bfloat16))
    assert y.device.type == "meta" and y.shape == (2, 3, 4, 16) and y.dtype == torch.bfloat16
