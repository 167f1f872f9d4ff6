"""The rotary embedding op, fused_layernorm.apply_rotary_pos_emb (torch.ops.fused_layernorm.rope).

Every result is compared with a float64 reference written here (Hugging Face's formula,
q * cos + rotate_half(q) * sin, on the upcast inputs; autograd on it gives the reference
gradients).  cos and sin are drawn per element (cos[i] != cos[i + rot/2]) unless a test
says otherwise, so the kernel must pair each element with its own cos and sin: tables of
Hugging Face's form would hide a swapped index."""
import math

import pytest
import torch

import fused_layernorm as fl
from helpers import dtype_name, generator, poison_cuda_cache, randn, requires_cuda

ops = torch.ops.fused_layernorm

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# One unit in the last place of the output dtype (the op rounds once) and the unit
# roundoff of its compute dtype.
ULP = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def compute_u(dtype):
    return 2.0**-53 if dtype == torch.float64 else 2.0**-24


# --- reference ------------------------------------------------------------------------


def rotate_pairs(x, interleaved):
    """Hugging Face's rotate_half (Llama) or rotate_every_two (GPT-J)."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def reference(q, k, cos, sin, unsqueeze_dim=1, interleaved=False):
    """float64 (q_embed, k_embed): the first rotary_dim = cos.shape[-1] dims rotated, the rest passed."""
    c = (cos.double() if cos.dim() == 3 else cos.double()[None]).unsqueeze(unsqueeze_dim)
    s = (sin.double() if sin.dim() == 3 else sin.double()[None]).unsqueeze(unsqueeze_dim)
    rot = cos.shape[-1]

    def one(x):
        x = x.double()
        xr, xp = x[..., :rot], x[..., rot:]
        return torch.cat((xr * c + rotate_pairs(xr, interleaved) * s, xp), -1)

    return one(q), one(k)


def check(actual, expected, dtype, scale, what):
    """|actual - expected| <= ulp |expected| + 8 u scale + tiny: one rounding to the output dtype
    after the fp32 (fp64) products and sum, whose terms are at most `scale` in size."""
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    a = actual.detach().double()  # compared where it lies: the GPU's float64 is IEEE too
    e = expected.detach().double().to(a.device)
    assert torch.isfinite(a).all(), f"{what}: non-finite values (an element never written?)"
    tol = ULP[dtype] * e.abs() + 8 * compute_u(dtype) * scale + 1e-30
    err = (a - e).abs()
    assert (err <= tol).all(), f"{what} ({dtype_name(dtype)}): max err {err.max().item():.3e}, worst err/tol {(err / tol).max().item():.2f}"


# --- inputs ---------------------------------------------------------------------------


def make(batch, heads, kv_heads, seq, dim, dtype, device, seed, *, rot=None, layout="bhsd", cos_batch=None,
         cos_dtype=None, hf_tables=False, interleaved=False):
    """q, k in the layout (bhsd: unsqueeze_dim 1; bshd: 2), cos and sin [cos_batch, seq, rot], grads."""
    gen = generator(seed)
    rot = dim if rot is None else rot
    cos_batch = batch if cos_batch is None else cos_batch

    def x(h):
        shape = (batch, h, seq, dim) if layout == "bhsd" else (batch, seq, h, dim)
        return randn(shape, dtype=dtype, device=device, gen=gen, scale=2.0)

    q, k = x(heads), x(kv_heads)
    if hf_tables:  # Hugging Face's layout: one angle a pair
        ang = torch.rand((cos_batch, seq, rot // 2), generator=gen, dtype=torch.float64) * 2 * math.pi
        ang = ang.repeat_interleave(2, -1) if interleaved else torch.cat((ang, ang), -1)
    else:
        ang = torch.rand((cos_batch, seq, rot), generator=gen, dtype=torch.float64) * 2 * math.pi
    scale = 1 + torch.rand((cos_batch, seq, rot), generator=gen, dtype=torch.float64) * 0.5 if not hf_tables else 1.0
    cdt = cos_dtype or dtype
    cos = (ang.cos() * scale).to(device=device, dtype=cdt)
    sin = (ang.sin() * scale).to(device=device, dtype=cdt)
    gq, gk = x(heads), x(kv_heads)
    return q, k, cos, sin, gq, gk


def leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def run_and_check(q, k, cos, sin, gq, gk, ud, interleaved, dtype):
    """Forward and backward through apply_rotary_pos_emb against the float64 reference.  q and k go
    in as they are (detached, not cloned: a clone would realign a q shifted off 16 bytes)."""
    ql, kl = q.detach().requires_grad_(), k.detach().requires_grad_()
    if q.is_cuda:
        poison_cuda_cache(*(2 * [q.numel() * q.element_size()] + 2 * [k.numel() * k.element_size()]))
    qo, ko = fl.apply_rotary_pos_emb(ql, kl, cos, sin, unsqueeze_dim=ud, interleaved=interleaved)
    torch.autograd.backward([qo, ko], [gq, gk])
    qr, kr = leaves(q, k)
    qe, ke = reference(qr, kr, cos, sin, ud, interleaved)
    torch.autograd.backward([qe, ke], [gq.double(), gk.double()])
    cs = float(cos.abs().max()) + float(sin.abs().max())
    check(qo, qe, dtype, 2.0 * cs * float(q.abs().max()), "q_embed")
    check(ko, ke, dtype, 2.0 * cs * float(k.abs().max()), "k_embed")
    check(ql.grad, qr.grad, dtype, 2.0 * cs * float(gq.abs().max()), "dq")
    check(kl.grad, kr.grad, dtype, 2.0 * cs * float(gk.abs().max()), "dk")
    return qo, ko


UD = {"bhsd": 1, "bshd": 2}


# --- forward and backward ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("rot", [64, 32], ids=["full", "partial"])
def test_forward_backward(dtype, interleaved, layout, rot, device, seed):
    """Every dtype, both pairings, both layouts, full and partial rotary, GQA (4 q heads, 2 k heads)."""
    q, k, cos, sin, gq, gk = make(2, 4, 2, 7, 64, dtype, device, seed, rot=rot, layout=layout)
    run_and_check(q, k, cos, sin, gq, gk, UD[layout], interleaved, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dim", [2, 6, 64, 80, 128, 256])
@pytest.mark.parametrize("seq", [1, 7])
def test_head_dims(dtype, interleaved, dim, seq, device, seed):
    """Odd sizes: head_dim 2 and 6 (one element an access), 80 (16-byte accesses, no power of two),
    one and seven positions, 3 q heads against 1 k head."""
    q, k, cos, sin, gq, gk = make(2, 3, 1, seq, dim, dtype, device, seed)
    run_and_check(q, k, cos, sin, gq, gk, 1, interleaved, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_float32_cos_with_16bit_q(dtype, interleaved, device, seed):
    """cos/sin in float32 with 16-bit q and k: the outputs keep q's dtype."""
    q, k, cos, sin, gq, gk = make(2, 4, 4, 9, 128, dtype, device, seed, cos_dtype=torch.float32, rot=96)
    qo, ko = run_and_check(q, k, cos, sin, gq, gk, 1, interleaved, dtype)
    assert qo.dtype == dtype and ko.dtype == dtype


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_hugging_face_tables(interleaved, device, seed):
    """cos/sin of Hugging Face's form (one angle a pair), batch-shared as its rotary embedding returns them."""
    q, k, cos, sin, gq, gk = make(3, 8, 2, 16, 128, torch.bfloat16, device, seed, cos_batch=1, hf_tables=True,
                                  interleaved=interleaved)
    run_and_check(q, k, cos, sin, gq, gk, 1, interleaved, torch.bfloat16)


@pytest.mark.parametrize("cos_shape", ["batch", "shared", "2d", "one_position"])
def test_cos_broadcast(cos_shape, device, seed):
    """cos/sin [batch, seq, rot], [1, seq, rot], [seq, rot] and [batch, 1, rot] (one position for all)."""
    q, k, cos, sin, gq, gk = make(2, 4, 2, 5, 32, torch.float32, device, seed)
    if cos_shape == "shared":
        cos, sin = cos[:1], sin[:1]
    elif cos_shape == "2d":
        cos, sin = cos[0], sin[0]
    elif cos_shape == "one_position":
        cos, sin = cos[:, :1], sin[:, :1]
    run_and_check(q, k, cos, sin, gq, gk, 1, False, torch.float32)


def test_hugging_face_function(device, seed):
    """Against transformers' own apply_rotary_pos_emb (Llama), when importable."""
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k, cos, sin, _, _ = make(2, 4, 2, 6, 64, torch.float32, device, seed, cos_batch=1, hf_tables=True)
    expected = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    actual = fl.apply_rotary_pos_emb(q, k, cos, sin)
    assert isinstance(actual, tuple) and len(actual) == 2
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


# --- position_ids ----------------------------------------------------------------------


@pytest.mark.parametrize("pos_shape", ["batch", "shared"])
def test_position_ids_gather_tables(pos_shape, device, seed):
    """With cos/sin tables [max_positions, rot], rows are taken at position_ids (HF before 4.40),
    and the gradients reach the tables."""
    q, k, _, _, gq, gk = make(2, 4, 2, 5, 32, torch.float64, device, seed)
    gen = generator(seed + 1)
    table_c = randn((20, 32), dtype=torch.float64, device=device, gen=gen).requires_grad_()
    table_s = randn((20, 32), dtype=torch.float64, device=device, gen=gen).requires_grad_()
    pos = torch.randint(0, 20, (2, 5) if pos_shape == "batch" else (5,), generator=gen).to(device)
    qo, ko = fl.apply_rotary_pos_emb(q, k, table_c, table_s, pos)
    (qo * gq).sum().add((ko * gk).sum()).backward()
    tc, ts = table_c.detach().requires_grad_(), table_s.detach().requires_grad_()
    qe, ke = reference(q, k, tc[pos], ts[pos])
    (qe * gq).sum().add((ke * gk).sum()).backward()
    torch.testing.assert_close(qo, qe)
    torch.testing.assert_close(ko, ke)
    torch.testing.assert_close(table_c.grad, tc.grad)
    torch.testing.assert_close(table_s.grad, ts.grad)


def test_position_ids_ignored_with_per_position_cos(device, seed):
    """Per-position cos/sin (3 dims): position_ids is ignored, as Hugging Face 4.40+ does."""
    q, k, cos, sin, _, _ = make(2, 4, 2, 5, 32, torch.float32, device, seed)
    pos = torch.zeros(2, 5, dtype=torch.long, device=device)
    a = fl.apply_rotary_pos_emb(q, k, cos, sin, pos)
    b = fl.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_position_out_of_range_is_an_error():
    q = torch.randn(1, 2, 3, 8)
    table = torch.randn(4, 8)
    with pytest.raises(IndexError):
        fl.apply_rotary_pos_emb(q, q, table, table, torch.tensor([[0, 1, 4]]))


# --- layouts --------------------------------------------------------------------------------


def test_hugging_face_layout_and_output_strides(device, seed):
    """q and k as Hugging Face makes them (a projection viewed [b, s, h, d] and transposed) are read
    in place; the outputs are laid out as torch.empty_like lays out q and k (the dims in the
    same memory order, dense), as the eager formula's outputs are."""
    gen = generator(seed)
    proj = randn((2, 7, 4 * 64 + 2 * 64), dtype=torch.bfloat16, device=device, gen=gen)
    q = proj[..., : 4 * 64].view(2, 7, 4, 64).transpose(1, 2)  # not dense: a slice of the projection
    k = randn((2, 7, 2 * 64), dtype=torch.bfloat16, device=device, gen=gen).view(2, 7, 2, 64).transpose(1, 2)
    _, _, cos, sin, gq, gk = make(2, 4, 2, 7, 64, torch.bfloat16, device, seed)
    qo, ko = run_and_check(q, k, cos, sin, gq.contiguous(), gk, 1, False, torch.bfloat16)
    assert ko.stride() == k.stride(), "a dense input's layout is kept"
    assert qo.stride() == torch.empty_like(q).stride() == (7 * 4 * 64, 64, 4 * 64, 1)


def test_non_unit_last_stride_and_strided_cos(device, seed):
    """A last dim with a stride (copied once) and cos/sin sliced from a wider table."""
    q, k, cos, sin, gq, gk = make(2, 3, 3, 5, 16, torch.float32, device, seed, rot=16)
    q_odd = torch.empty(2, 3, 5, 32, device=device)[..., ::2]
    q_odd.copy_(q)
    wide_c = torch.zeros(2, 5, 48, device=device)
    wide_s = torch.zeros(2, 5, 48, device=device)
    wide_c[..., 8:24] = cos
    wide_s[..., 8:24] = sin
    run_and_check(q_odd, k, wide_c[..., 8:24], wide_s[..., 8:24], gq, gk, 1, True, torch.float32)


def test_unaligned_vector_fallback(device, seed):
    """A storage offset of one element: no 16-byte accesses; still exact."""
    q, k, cos, sin, gq, gk = make(2, 2, 2, 3, 64, torch.bfloat16, device, seed)
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=device)
    q1 = buf[1:].view(q.shape)
    q1.copy_(q)
    run_and_check(q1, k, cos, sin, gq, gk, 1, False, torch.bfloat16)


# --- contract -----------------------------------------------------------------------------


def test_inputs_not_modified(device, seed):
    q, k, cos, sin, gq, gk = make(2, 4, 2, 5, 32, torch.float32, device, seed)
    copies = [t.clone() for t in (q, k, cos, sin, gq, gk)]
    ql, kl = leaves(q, k)
    qo, ko = fl.apply_rotary_pos_emb(ql, kl, cos, sin)
    torch.autograd.backward([qo, ko], [gq, gk])
    assert all(torch.equal(a, b) for a, b in zip((ql.detach(), kl.detach(), cos, sin, gq, gk), copies))


def test_empty(device):
    """No batch, no positions, or no k heads: empty outputs and gradients."""
    for qs, ks in [((0, 2, 3, 8), (0, 1, 3, 8)), ((2, 2, 0, 8), (2, 1, 0, 8)), ((2, 2, 3, 8), (2, 0, 3, 8))]:
        q = torch.randn(qs, device=device, requires_grad=True)
        k = torch.randn(ks, device=device, requires_grad=True)
        cos = torch.randn(qs[0], qs[2], 8, device=device)
        qo, ko = fl.apply_rotary_pos_emb(q, k, cos, cos)
        assert qo.shape == qs and ko.shape == ks
        (qo.sum() + ko.sum()).backward()
        assert q.grad.shape == qs and k.grad.shape == ks


def test_only_one_output_used(device, seed):
    """A gradient into q_embed alone: k gets none, q's is right."""
    q, k, cos, sin, gq, _ = make(1, 2, 2, 4, 16, torch.float64, device, seed)
    ql, kl = leaves(q, k)
    qo, _ = fl.apply_rotary_pos_emb(ql, kl, cos, sin)
    qo.backward(gq)
    assert kl.grad is None
    qr = q.detach().requires_grad_()
    reference(qr, k, cos, sin)[0].backward(gq)
    torch.testing.assert_close(ql.grad, qr.grad)


def test_gradient_through_the_other_output_only(device, seed):
    """Regression: k requires grad, q does not, and only q_embed is used, so the backward has no
    gradient to compute for q or k (it once called rope_bwd with neither and raised); with cos
    requiring grad too, cos still gets its gradient."""
    q, k, cos, sin, gq, _ = make(1, 2, 2, 4, 16, torch.float64, device, seed)
    kl, cl = k.clone().requires_grad_(), cos.clone().requires_grad_()
    qo, _ = fl.apply_rotary_pos_emb(q, kl, cos, sin)
    qo.backward(gq)
    assert kl.grad is None
    qo, _ = fl.apply_rotary_pos_emb(q, kl, cl, sin)
    qo.backward(gq)
    cr = cos.clone().requires_grad_()
    reference(q, k, cr, sin)[0].backward(gq)
    assert kl.grad is None
    torch.testing.assert_close(cl.grad, cr.grad)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gradcheck(interleaved, layout, device, seed):
    """float64 gradcheck in q, k, cos and sin (partial rotary, GQA)."""
    q, k, cos, sin, _, _ = make(2, 2, 1, 3, 8, torch.float64, device, seed, rot=4, layout=layout)
    args = [t.requires_grad_() for t in (q, k, cos, sin)]
    assert torch.autograd.gradcheck(
        lambda q, k, c, s: fl.apply_rotary_pos_emb(q, k, c, s, unsqueeze_dim=UD[layout], interleaved=interleaved), args)


def test_opcheck(device, seed):
    q, k, cos, sin, gq, gk = make(2, 4, 2, 5, 32, torch.float32, device, seed, rot=16)
    ql, kl = leaves(q, k)
    torch.library.opcheck(ops.rope.default, (ql, kl, cos, sin, None, 1, False))
    torch.library.opcheck(ops.rope.default, (ql.transpose(1, 2), kl.transpose(1, 2), cos[:1], sin[:1], None, 2, True))
    table = torch.randn(9, 16, device=device)
    torch.library.opcheck(ops.rope.default, (ql, kl, table, table, torch.randint(0, 9, (2, 5), device=device), 1, False))
    torch.library.opcheck(ops.rope_fwd.default, (q.bfloat16(), k.bfloat16(), cos, sin, 1, False))
    torch.library.opcheck(ops.rope_bwd.default, (gq, gk, cos, sin, 1, True))


def test_compile_fullgraph(device, seed):
    torch._dynamo.reset()
    q, k, cos, sin, gq, gk = make(2, 4, 2, 8, 64, torch.float32, device, seed, layout="bshd")

    def f(q, k, cos, sin):
        qo, ko = fl.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        return qo * 2, ko

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        ql, kl = leaves(q, k)
        qo, ko = fn(ql, kl, cos, sin)
        torch.autograd.backward([qo, ko], [gq, gk])
        outs.append([qo.detach(), ko.detach(), ql.grad, kl.grad])
    for a, e in zip(*outs):
        torch.testing.assert_close(a, e)
    torch._dynamo.reset()


def test_module(device, seed):
    """FusedRotaryEmbedding: its tables (Llama's or GPT-J's layout) gathered at position_ids."""
    for interleaved in (False, True):
        m = fl.FusedRotaryEmbedding(64, 32, rotary_dim=48, interleaved=interleaved, device=device)
        q, k, _, _, _, _ = make(2, 4, 2, 6, 64, torch.float32, device, seed)
        pos = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]], device=device)
        qo, ko = m(q, k, pos)
        inv = 10000.0 ** (-torch.arange(0, 48, 2, dtype=torch.float64) / 48)
        ang = pos.cpu().double()[..., None] * inv
        ang = ang.repeat_interleave(2, -1) if interleaved else torch.cat((ang, ang), -1)
        qe, ke = reference(q, k, ang.cos().to(device), ang.sin().to(device), 1, interleaved)
        torch.testing.assert_close(qo, qe.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ko, ke.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m(q, k)[0], m(q, k, torch.arange(6, device=device))[0])


# --- errors ---------------------------------------------------------------------------------


def test_errors(device):
    q = torch.randn(2, 4, 5, 16, device=device)
    k = torch.randn(2, 2, 5, 16, device=device)
    cos = torch.randn(2, 5, 16, device=device)
    f = fl.apply_rotary_pos_emb
    cases = [
        (dict(cos=torch.randn(2, 6, 16, device=device)), "cos and sin must have shape"),
        (dict(cos=torch.randn(3, 5, 16, device=device)), "cos and sin must have shape"),
        (dict(cos=torch.randn(2, 1, 5, 16, device=device)), "cos and sin must have shape"),
        (dict(sin=torch.randn(2, 5, 8, device=device)), "sin must have cos's shape"),
        (dict(cos=torch.randn(2, 5, 18, device=device)), "rotary_dim"),
        (dict(cos=torch.randn(2, 5, 3, device=device)), "rotary_dim"),
        (dict(q=torch.randn(2, 4, 5, 15, device=device), k=torch.randn(2, 2, 5, 15, device=device)), "head_dim .* must be even"),
        (dict(q=torch.randint(0, 3, (2, 4, 5, 16), device=device)), "q must be float64, float32, float16 or bfloat16"),
        (dict(k=k.half()), "k must have q's dtype"),
        (dict(k=torch.randn(2, 2, 5, 8, device=device)), "k must have q's batch, seq_len and head_dim"),
        (dict(q=torch.randn(4, 5, 16, device=device)), "q must have 4 dims"),
        (dict(cos=cos.double()), "cos must have q's dtype"),
        (dict(unsqueeze_dim=3), "unsqueeze_dim must be 1"),
        (dict(cos=torch.randn(7, 16, device=device), position_ids=torch.zeros(2, 5, device=device)),
         "position_ids must be int64 or int32"),
    ]
    for kw, match in cases:
        args = dict(q=q, k=k, cos=cos, sin=kw.get("cos", cos))  # sin follows cos unless given
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            f(args.pop("q"), args.pop("k"), args.pop("cos"), args.pop("sin"), **args)


@requires_cuda
def test_device_mismatch_is_an_error():
    q = torch.randn(1, 2, 3, 8, device="cuda")
    with pytest.raises(RuntimeError, match="cos is on cpu"):
        fl.apply_rotary_pos_emb(q, q, torch.randn(1, 3, 8), torch.randn(1, 3, 8))


# --- CUDA --------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.sanitize
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_sanitize_small_cuda(dtype, interleaved, seed):
    """Small cases for compute-sanitizer memcheck: 16-byte and one-element accesses, partial rotary,
    both layouts, GQA, a strided q; forward and backward."""
    for dim, rot, layout in [(64, 64, "bhsd"), (80, 48, "bshd"), (6, 4, "bhsd")]:
        q, k, cos, sin, gq, gk = make(2, 3, 1, 5, dim, dtype, "cuda", seed, rot=rot, layout=layout)
        run_and_check(q, k, cos, sin, gq, gk, UD[layout], interleaved, dtype)


@requires_cuda
def test_cuda_matches_cpu(seed):
    """The CUDA kernel and the CPU backend agree (both round once from fp32)."""
    q, k, cos, sin, _, _ = make(3, 8, 2, 33, 128, torch.bfloat16, "cpu", seed, rot=96)
    a = fl.apply_rotary_pos_emb(q, k, cos, sin)
    b = fl.apply_rotary_pos_emb(q.cuda(), k.cuda(), cos.cuda(), sin.cuda())
    for x, y in zip(a, b):
        torch.testing.assert_close(y.cpu(), x, rtol=2**-7, atol=1e-6)


@requires_cuda
@pytest.mark.parametrize("dim", [64, 6])
def test_every_token_of_a_long_sequence(dim, seed):
    """More tokens than half a round of resident CTAs takes, so threads prefetch the rows of
    tokens ahead, and those near the end find no token to prefetch: 2 x 20011 positions,
    every output checked."""
    q, k, cos, sin, gq, gk = make(2, 4, 2, 20011, dim, torch.bfloat16, "cuda", seed, layout="bshd")
    run_and_check(q, k, cos, sin, gq, gk, UD["bshd"], False, torch.bfloat16)


@requires_cuda
def test_cuda_graph_capture(seed):
    """Forward and backward captured in a CUDA graph and replayed on new inputs."""
    q, k, cos, sin, gq, gk = make(2, 8, 2, 16, 128, torch.bfloat16, "cuda", seed)
    sq, sk = q.clone().requires_grad_(), k.clone().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up
            qo, ko = fl.apply_rotary_pos_emb(sq, sk, cos, sin)
            torch.autograd.backward([qo, ko], [gq, gk])
            sq.grad = sk.grad = None
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qo, ko = fl.apply_rotary_pos_emb(sq, sk, cos, sin)
        torch.autograd.backward([qo, ko], [gq, gk])
    q2, k2, _, _, _, _ = make(2, 8, 2, 16, 128, torch.bfloat16, "cuda", seed + 1)
    with torch.no_grad():
        sq.copy_(q2)
        sk.copy_(k2)
    g.replay()
    torch.cuda.synchronize()
    qe, ke = reference(q2, k2, cos, sin)
    check(qo, qe, torch.bfloat16, 4 * float(q2.abs().max()), "replayed q_embed")
    check(ko, ke, torch.bfloat16, 4 * float(k2.abs().max()), "replayed k_embed")
    qr, kr = leaves(q2, k2)
    torch.autograd.backward(list(reference(qr, kr, cos, sin)), [gq.double(), gk.double()])
    check(sq.grad, qr.grad, torch.bfloat16, 4 * float(gq.abs().max()), "replayed dq")


@requires_cuda
@pytest.mark.slow
def test_64bit_offsets():
    """q of more than 2^31 elements (bf16, 4.3 GB): the last heads are rotated right."""
    b, h, s, d = 1, 32, 1 << 16, 1040  # 2.18e9 elements
    q = torch.empty(b, h, s, d, dtype=torch.bfloat16, device="cuda").normal_()
    k = torch.randn(b, 1, s, d, dtype=torch.bfloat16, device="cuda")
    cos = torch.rand(1, s, d, dtype=torch.bfloat16, device="cuda")
    sin = torch.rand(1, s, d, dtype=torch.bfloat16, device="cuda")
    qo, ko = fl.apply_rotary_pos_emb(q, k, cos, sin)
    tail = slice(s - 64, s)
    qe, _ = reference(q[:, -2:, tail], k[:, :, tail], cos[:, tail], sin[:, tail])
    check(qo[:, -2:, tail], qe, torch.bfloat16, 4.0 * float(q[:, -2:, tail].abs().max()), "q_embed tail")
