"""fused_layernorm.patch: module replacement in plain nn.Modules and in small random
Hugging Face models (2 layers, hidden 64, vocab 128).  The patched model's logits,
gradients and a 20-step AdamW loss curve match the stock model's (float32 tightly,
bf16 within bf16 tolerance); counts, parameters and state_dict keys are kept.
patch also swaps Hugging Face's apply_rotary_pos_emb (process-wide): stock models run
under stock_rope(), and every test ends with the stock function restored.
The Hugging Face tests skip when transformers is not importable."""
import copy
import importlib.util
from contextlib import nullcontext

import pytest
import torch
from torch import nn

import fused_layernorm as fl
from fused_layernorm import FusedLayerNorm, FusedRMSNorm
from fused_layernorm.patch import HF_ROPE_MODULES, restore_rope, stock_rope

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
requires_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed")
requires_add_norm = pytest.mark.skipif(
    not hasattr(torch.ops.fused_layernorm, "add_norm"), reason="extension built without fused_layernorm::add_norm"
)

ARCHS = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "t5"]
# Gemma's 1 + weight runs through the fused op (weight_offset).
arch_params = pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=requires_add_norm) if a == "gemma" else a for a in ARCHS]
)
LAYERS = 2
# Architectures whose modeling module has Llama's apply_rotary_pos_emb (patch swaps it).
ROPE_ARCHS = {"llama", "mistral", "qwen2", "qwen3", "gemma"}


@pytest.fixture(autouse=True)
def _stock_rope_after_each_test():
    yield
    restore_rope()


# --- plain nn.Modules -----------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.rms = nn.RMSNorm(16, eps=1e-6)
        self.ln_nobias = nn.LayerNorm(16, bias=False)
        self.ln_noaffine = nn.LayerNorm(16, elementwise_affine=False)
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(self.ln_noaffine(self.ln_nobias(self.rms(self.ln(x)))))


class SubLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x) * 2


def test_patch_plain_modules_in_place():
    model = nn.Sequential(Block(), Block(), nn.ModuleList([SubLayerNorm(16)]))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model[0].ln.weight.requires_grad_(False)
    ref = copy.deepcopy(model)
    params_before = dict(model.named_parameters())
    keys_before = list(model.state_dict())

    report = fl.patch(model)
    assert report == {"LayerNorm": 6, "RMSNorm": 2} and report.total == 8 and not report.skipped
    assert type(model[0].ln) is FusedLayerNorm and type(model[1].rms) is FusedRMSNorm
    assert type(model[2][0]) is SubLayerNorm, "subclasses may compute something else: left alone"
    assert model[0].ln_nobias.bias is None and model[0].ln_noaffine.weight is None
    assert model[1].rms.eps == 1e-6
    # The same Parameter objects, requires_grad kept; the same state_dict keys.
    params_after = dict(model.named_parameters())
    assert params_after.keys() == params_before.keys()
    assert all(params_after[n] is params_before[n] for n in params_before)
    assert not model[0].ln.weight.requires_grad
    assert list(model.state_dict()) == keys_before

    x = torch.randn(3, 16)
    torch.testing.assert_close(model[1](model[0](x)), ref[1](ref[0](x)), rtol=1e-5, atol=1e-5)
    assert fl.patch(model).total == 0, "patching twice replaces nothing"


def test_patch_keeps_mode_hooks_and_sharing():
    shared = nn.LayerNorm(8)
    model = nn.Sequential(shared, nn.ReLU(), shared).eval()
    calls = []
    shared.register_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    report = fl.patch(model)
    assert report == {"LayerNorm": 1}
    assert model[0] is model[2] and isinstance(model[0], FusedLayerNorm)
    assert not model[0].training
    model(torch.randn(2, 8))
    assert calls == ["FusedLayerNorm", "FusedLayerNorm"]


def test_patch_skips_instance_forward_override():
    model = nn.Sequential(nn.LayerNorm(8))
    inner = model[0]
    inner.forward = lambda x: x  # what accelerate's hooks do
    report = fl.patch(model)
    assert report.total == 0 and list(report.skipped) == ["0"]
    assert model[0] is inner


def test_patch_argument_errors():
    with pytest.raises(TypeError, match="model"):
        fl.patch("not a module")
    with pytest.raises(ValueError, match="to_fused"):
        fl.patch(nn.LayerNorm(8))
    assert isinstance(fl.to_fused(nn.LayerNorm(8)), FusedLayerNorm)
    assert fl.to_fused(nn.Linear(2, 2)) is None


def test_patch_module_file_importable():
    from fused_layernorm.patch import HF_RMS_NORMS  # the file, although fl.patch is the function

    assert "transformers.models.llama.modeling_llama.LlamaRMSNorm" in HF_RMS_NORMS


def test_patch_matches_by_qualified_name_without_transformers():
    """A class that only looks like LlamaRMSNorm by name, outside transformers, is not replaced;
    one whose qualified name is transformers' is, with its eps."""

    def rms_class(module_name):
        cls = type("LlamaRMSNorm", (nn.Module,), {
            "__init__": lambda self: (nn.Module.__init__(self), setattr(self, "weight", nn.Parameter(torch.ones(8))),
                                      setattr(self, "variance_epsilon", 1e-3))[0],
        })
        cls.__module__ = module_name
        return cls

    model = nn.Sequential(rms_class("mylib.norms")(), rms_class("transformers.models.llama.modeling_llama")())
    report = fl.patch(model)
    assert report == {"LlamaRMSNorm": 1}
    assert type(model[0]).__module__ == "mylib.norms"
    assert isinstance(model[1], FusedRMSNorm) and model[1].eps == 1e-3


# --- Hugging Face models ------------------------------------------------------------

def _models(arch, dtype, device):
    from fused_layernorm.bench import hf_models

    if not hf_models.available(arch):
        pytest.skip(f"this transformers has no {hf_models.ARCHS[arch][1]}")
    stock = hf_models.build(arch, dtype=dtype, device=device, layers=LAYERS)
    patched = copy.deepcopy(stock)
    report = fl.patch(patched)
    return stock, patched, report


def _batch(stock, device, seed, batch=2, tokens=16):
    from fused_layernorm.bench import hf_models

    return hf_models.batch(stock, tokens, batch, torch.Generator().manual_seed(seed), device)


def _rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@requires_transformers
@arch_params
def test_hf_patch_count_params_and_state_dict(arch, device):
    from fused_layernorm.bench import hf_models

    stock, patched, report = _models(arch, torch.float32, device)
    cls = hf_models.ARCHS[arch][2]
    expected = {cls: hf_models.norm_count(arch, LAYERS)}
    if arch in ROPE_ARCHS:
        expected["apply_rotary_pos_emb"] = 1
    assert dict(report) == expected and not report.skipped
    assert not any(type(m).__name__ == cls for m in patched.modules())
    assert list(patched.state_dict()) == list(stock.state_dict())
    for (n, p), (_, q) in zip(patched.named_parameters(), stock.named_parameters()):
        assert torch.equal(p, q) and p.dtype == q.dtype and p.device == q.device, n
    # In place: the model's own Parameter objects survive patching.
    again = copy.deepcopy(stock)
    before = dict(again.named_parameters())
    fl.patch(again)
    assert all(p is before[n] for n, p in again.named_parameters())
    eps = getattr(stock.config, "layer_norm_epsilon" if arch in ("gpt2", "t5") else "rms_norm_eps")
    fused = [m for m in patched.modules() if isinstance(m, (FusedLayerNorm, FusedRMSNorm))]
    assert len(fused) == report.total - report.get("apply_rotary_pos_emb", 0) and all(m.eps == eps for m in fused)
    assert all(m.weight_offset == (1.0 if arch == "gemma" else 0.0) for m in fused)


def _forward_backward(model, b, stock=False):
    with stock_rope() if stock else nullcontext():
        out = model(**b)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


@requires_transformers
@arch_params
def test_hf_logits_and_grads_match_fp32(arch, device, seed):
    stock, patched, _ = _models(arch, torch.float32, device)
    b = _batch(stock, device, seed)
    logits_s, loss_s, grads_s = _forward_backward(stock, b, stock=True)
    logits_p, loss_p, grads_p = _forward_backward(patched, b)
    torch.testing.assert_close(logits_p, logits_s, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loss_p, loss_s, rtol=1e-5, atol=1e-5)
    assert grads_p.keys() == grads_s.keys()
    for n, g in grads_s.items():
        assert (grads_p[n] is None) == (g is None), n
        if g is not None:
            torch.testing.assert_close(grads_p[n], g, rtol=1e-3, atol=1e-5, msg=lambda m: f"{n}: {m}")


@requires_transformers
@arch_params
def test_hf_logits_and_grads_match_bf16(arch, device, seed):
    """bf16 within bf16 tolerance: against the same model in float32, the patched bf16
    model's logits and every gradient are no further off than the stock bf16 model's
    own error allows (2x it plus 1%; stock T5's bf16 gradients are themselves ~9% off)."""
    from fused_layernorm.bench import hf_models

    stock, patched, _ = _models(arch, torch.bfloat16, device)
    ref = hf_models.build(arch, dtype=torch.float32, device=device, layers=LAYERS)
    b = _batch(stock, device, seed)
    logits_r, _, grads_r = _forward_backward(ref, b, stock=True)
    logits_s, _, grads_s = _forward_backward(stock, b, stock=True)
    logits_p, _, grads_p = _forward_backward(patched, b)
    assert _rel_err(logits_p, logits_r) <= 2 * _rel_err(logits_s, logits_r) + 1e-2
    for n, g in grads_r.items():
        assert (grads_p[n] is None) == (g is None), n
        if g is not None:
            err_p, err_s = _rel_err(grads_p[n], g), _rel_err(grads_s[n], g)
            assert err_p <= 2 * err_s + 1e-2, f"{n}: patched {err_p:.3g}, stock {err_s:.3g}"


@requires_transformers
@arch_params
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_hf_adamw_loss_curve_matches(arch, dtype, device, seed):
    """20 AdamW steps on one batch of random tokens (which the model learns): the patched model's loss curve follows the stock one."""
    stock, patched, _ = _models(arch, dtype, device)
    curves = []
    for model in (stock, patched):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        b = _batch(model, device, seed)
        losses = []
        for _ in range(20):
            with stock_rope() if model is stock else nullcontext():
                loss = model(**b).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    s, p = curves
    assert s[-1] < s[0], "the stock model must learn for the comparison to mean something"
    # bf16 losses are bf16 numbers: one unit at 4 is 0.03.
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(p, s, rtol=tol, atol=tol)
