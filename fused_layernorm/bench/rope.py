"""python -m fused_layernorm.bench.rope [--head-dims 64,128,256] [--dtypes bf16,fp32]
[--peers ours,torch,compile,flash,quack,liger] [--heads 32 --kv-heads 8] [--out DIR]

The rotary embedding of q and k (Hugging Face's apply_rotary_pos_emb: Llama's
half-split pairs, cos/sin [1, seq, head_dim] in q's dtype) against the peers:
torch eager (the Hugging Face formula), torch.compile of it, flash-attention's
Triton apply_rotary_emb and quack's apply_rotary_emb (one call for q, one for k,
cos/sin [seq, head_dim / 2]), and Liger's liger_rotary_pos_emb.  q and k are laid
out as Hugging Face makes them: a projection [batch, seq, heads, head_dim] viewed
[batch, heads, seq, head_dim] (2^27 elements of q and k together by default; GQA
with --kv-heads).  Each cell is the median GPU time of one call with an L2 flush
between calls (without a GPU, or with --cpu: the CPU backend against torch, 2^22
elements, the fastest wall time), reported as % of the device copy bandwidth for the bytes the op
must move: q and k read once and written once (cos and sin are small and cached,
so not counted), forward and backward alike.  Every peer is verified first (its
outputs and the gradients of q and k against a float32 reference of the formula);
one that fails is reported WRONG and not timed.  The JSON is written after every case.
"""
import argparse
import sys

import torch

from . import opbench

HEAD_DIMS = (64, 128, 256)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PEERS = ("ours", "torch", "compile", "flash", "quack", "liger")
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}  # max |err| / max |ref|


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def hf_rope(q, k, cos, sin):
    """Hugging Face's apply_rotary_pos_emb (unsqueeze_dim=1)."""
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def load_peers(names):
    """{name: bind(cos, sin) -> fn(qb, kb) -> (q_embed, k_embed) [b, h, s, d]}, {name: why missing}.
    qb and kb are the projections [b, s, h, d]; fn views them as Hugging Face does."""
    peers, missing = {}, {}
    hf = lambda qb, kb: (qb.transpose(1, 2), kb.transpose(1, 2))  # noqa: E731
    for name in names:
        try:
            if name == "ours":
                import fused_layernorm as fl

                def bind(cos, sin, fl=fl):
                    return lambda qb, kb: fl.apply_rotary_pos_emb(*hf(qb, kb), cos, sin)
            elif name == "torch":
                def bind(cos, sin):
                    return lambda qb, kb: hf_rope(*hf(qb, kb), cos, sin)
            elif name == "compile":
                import torch._dynamo as dynamo
                for knob in ("cache_size_limit", "recompile_limit"):
                    if hasattr(dynamo.config, knob):
                        setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), 4096))
                compiled = torch.compile(hf_rope, dynamic=False)

                def bind(cos, sin, compiled=compiled):
                    return lambda qb, kb: compiled(*hf(qb, kb), cos, sin)
            elif name in ("flash", "quack"):
                if name == "flash":
                    from flash_attn.layers.rotary import apply_rotary_emb as f
                else:
                    if torch.cuda.get_device_capability()[0] < 9:
                        raise RuntimeError("quack needs sm_90")
                    from quack.rotary import apply_rotary_emb as f

                def bind(cos, sin, f=f):  # [seq, head_dim / 2] tables, x as [b, s, h, d]
                    h = cos.shape[-1] // 2
                    c, s = cos[0, :, :h].contiguous(), sin[0, :, :h].contiguous()
                    return lambda qb, kb: (f(qb, c, s).transpose(1, 2), f(kb, c, s).transpose(1, 2))
            elif name == "liger":
                from liger_kernel.transformers.rope import liger_rotary_pos_emb as f

                def bind(cos, sin, f=f):
                    return lambda qb, kb: f(*hf(qb, kb), cos, sin)
            else:
                raise ValueError(f"unknown peer {name}")
            peers[name] = bind
        except Exception as e:  # ImportError, a .so that fails to load, ...
            msg = str(e).strip().splitlines()
            missing[name] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:200]
    return peers, missing


def _inputs(batch, seq, heads, kv_heads, dim, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device=device, dtype=dtype)  # noqa: E731
    qb, kb = rnd(batch, seq, heads, dim), rnd(batch, seq, kv_heads, dim)
    inv = 10000.0 ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)
    ang = torch.arange(seq, device=device, dtype=torch.float64)[:, None] * inv
    emb = torch.cat((ang, ang), -1)[None]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    gq, gk = rnd(batch, seq, heads, dim).transpose(1, 2), rnd(batch, seq, kv_heads, dim).transpose(1, 2)
    return qb, kb, cos, sin, gq, gk


def _run(fn, qb, kb, gq, gk):
    ql, kl = qb.detach().requires_grad_(), kb.detach().requires_grad_()
    qo, ko = fn(ql, kl)
    dq, dk = torch.autograd.grad([qo, ko], [ql, kl], [gq, gk])
    return qo.detach(), ko.detach(), dq.transpose(1, 2), dk.transpose(1, 2)


_rel = opbench.rel_err


def verify(fn, qb, kb, gq, gk, ref):
    out = _run(fn, qb, kb, gq, gk)
    return {name: _rel(a, e) for name, a, e in zip(("q_embed", "k_embed", "dq", "dk"), out, ref)}


def plot(rows, path, title=""):
    """% of copy bandwidth against head_dim, one panel per (dtype, direction), a line per peer."""
    return opbench.plot_panels(rows, path, title, ("dtype", "direction"), "head_dim", PEERS)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fused_layernorm.bench.rope", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda kind: (lambda s: [kind(v) for v in s.split(",") if v])  # noqa: E731
    ap.add_argument("--head-dims", type=csv(int), default=list(HEAD_DIMS))
    ap.add_argument("--dtypes", type=csv(str), default=["bf16", "fp32"])
    ap.add_argument("--directions", type=csv(str), default=["fwd", "bwd"])
    ap.add_argument("--peers", type=csv(str), default=list(PEERS))
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    opbench.add_device_args(ap)  # --log2-numel: elements of q and k together
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/out")
    a = ap.parse_args(argv)
    dev = opbench.device_of(a)
    names, not_run = opbench.runnable_peers(a.peers, dev)
    peers, missing = load_peers(names)
    log2 = opbench.log2_numel(a, dev)
    run = opbench.Run("rope", peers, {**not_run, **missing}, a.out, reps=a.reps, device=dev,
                      config=dict(head_dims=a.head_dims, dtypes=a.dtypes, heads=a.heads, kv_heads=a.kv_heads,
                                  batch=a.batch, log2_numel=log2))
    cases = [(dt, d) for dt in a.dtypes for d in a.head_dims]
    for i, (dt, dim) in enumerate(cases):
        dtype = DTYPES[dt]
        seq = max(1, (1 << log2) // ((a.heads + a.kv_heads) * dim * a.batch))
        qb, kb, cos, sin, gq, gk = _inputs(a.batch, seq, a.heads, a.kv_heads, dim, dtype, dev)
        ref = _run(lambda q, k: hf_rope(q.float().transpose(1, 2), k.float().transpose(1, 2), cos.float(), sin.float()),
                   qb, kb, gq.float(), gk.float())
        nbytes = 2 * (qb.numel() + kb.numel()) * qb.element_size()  # q and k read once, written once
        line = []
        for name, bind in peers.items():
            fn = bind(cos, sin)

            def check(fn=fn, name=name):
                errs = verify(fn, qb, kb, gq, gk, ref)
                return errs, max(errs.values()) <= TOL[dtype] * (2 if name == "torch" else 1)

            def time_us(d, fn=fn):
                if d == "fwd":
                    with torch.no_grad():
                        return run.time_us(lambda: fn(qb, kb))
                ql, kl = qb.detach().requires_grad_(), kb.detach().requires_grad_()
                qo, ko = fn(ql, kl)
                return run.time_us(lambda: torch.autograd.grad([qo, ko], [ql, kl], [gq, gk], retain_graph=True))

            base = dict(dtype=dt, head_dim=dim, batch=a.batch, seq=seq, heads=a.heads, kv_heads=a.kv_heads, peer=name)
            line += run.peer_cells(name, base, a.directions, check, time_us, lambda d: nbytes)
        run.case_done(i, len(cases), f"rope {dt} d={dim} {a.batch}x{seq}x({a.heads}+{a.kv_heads})", line)
        del qb, kb, cos, sin, gq, gk, ref
    return run.finish(plot)


if __name__ == "__main__":
    sys.exit(main())
