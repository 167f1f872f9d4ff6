"""python -m fused_layernorm.bench.fused [--hidden ...] [--dtypes bf16,fp32] [--ops layernorm,rmsnorm]
[--dropout 0,0.1] [--peers ours,torch,compile,flash,quack,liger] [--out DIR]

The fused pre-norm op, h = dropout(x) + residual, y = norm(h) (prenorm: both
returned), against the peers users pick for it: flash-attention's Triton
layer_norm_fn / rms_norm_fn (residual, dropout, prenorm), quack's
rmsnorm(residual=..., prenorm=True), Liger's LigerFusedAddRMSNorm, torch eager
(F.dropout + add + norm) and torch.compile of the same.  Each cell is the
median GPU time of one call with an L2 flush between calls (without a GPU, or
with --cpu: the CPU backend against torch, 2^22 elements, the fastest wall time), reported
as % of the device copy bandwidth for the bytes the op must move:
  fwd: x and residual read, y and h written (4 passes);
  bwd: dy, h and the gradient into h read, dx and dresidual written (5 passes
       with dropout; 4 without, where dx is dresidual).
Every peer is verified first (p = 0: y, h and every gradient against a
float32 reference; p > 0: y against the norm of the peer's own h, and h equal
to residual or residual + x / (1 - p) elementwise); a peer that fails is
reported WRONG with its error and not timed.
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from . import opbench

HIDDEN = (128, 512, 896, 1024, 2304, 3584, 4096, 5120, 7168, 8192, 12288, 16384, 32768, 65536, 131072, 262144)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PEERS = ("ours", "torch", "compile", "flash", "quack", "liger")
EPS = 1e-5
TOL = {torch.bfloat16: 6e-2, torch.float16: 1e-2, torch.float32: 2e-4}  # max |err| / max |ref|


def _torch_fn(op, p):
    def fn(x, r, w, b):
        h = (F.dropout(x, p) if p > 0 else x) + r
        y = F.layer_norm(h, h.shape[-1:], w, b, EPS) if op == "layernorm" else F.rms_norm(h, h.shape[-1:], w, EPS)
        return y, h
    return fn


def load_peers(names, dtype_compile=("bf16",)):
    """{name: bind(op, p) -> fn(x, r, w, b) -> (y, h), or None where unsupported}, {name: why missing}."""
    peers, missing = {}, {}
    for name in names:
        try:
            if name == "ours":
                import fused_layernorm as fl

                def bind(op, p, fl=fl):
                    if op == "layernorm":
                        return lambda x, r, w, b: fl.layer_norm(x, x.shape[-1:], w, b, EPS, residual=r, dropout_p=p,
                                                                return_residual=True)
                    return lambda x, r, w, b: fl.rms_norm(x, x.shape[-1:], w, EPS, residual=r, dropout_p=p,
                                                          return_residual=True)
            elif name == "torch":
                bind = _torch_fn
            elif name == "compile":
                import torch._dynamo as dynamo
                for knob in ("cache_size_limit", "recompile_limit"):
                    if hasattr(dynamo.config, knob):
                        setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), 4096))
                import torch._functorch.config as fc
                if hasattr(fc, "donated_buffer"):
                    fc.donated_buffer = False
                cache = {}

                def bind(op, p, cache=cache):
                    if (op, p) not in cache:
                        cache[(op, p)] = torch.compile(_torch_fn(op, p), dynamic=False)
                    return cache[(op, p)]
            elif name == "flash":
                from flash_attn.ops.triton.layer_norm import layer_norm_fn

                def bind(op, p, f=layer_norm_fn):
                    rms = op == "rmsnorm"
                    return lambda x, r, w, b: f(x, w, b, residual=r, eps=EPS, dropout_p=p, prenorm=True,
                                                is_rms_norm=rms)
            elif name == "quack":
                if torch.cuda.get_device_capability()[0] < 9:
                    raise RuntimeError("quack needs sm_90")
                from quack.rmsnorm import rmsnorm as qr

                def bind(op, p, qr=qr):
                    if op != "rmsnorm" or p > 0:
                        return None
                    return lambda x, r, w, b: qr(x, w, residual=r, eps=EPS, prenorm=True)
            elif name == "liger":
                from liger_kernel.transformers.fused_add_rms_norm import LigerFusedAddRMSNorm  # noqa: F401
                from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as LF

                def bind(op, p, LF=LF):
                    if op != "rmsnorm" or p > 0:
                        return None
                    return lambda x, r, w, b: LF.apply(x, r, w, EPS, 0.0, "llama", False)
            else:
                raise ValueError(f"unknown peer {name}")
            peers[name] = bind
        except Exception as e:  # ImportError, a .so that fails to load, ...
            msg = str(e).strip().splitlines()
            missing[name] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:200]
    return peers, missing


def _inputs(op, rows, hidden, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device=device, dtype=dtype)  # noqa: E731
    x = rnd(rows, hidden).add_(0.5)
    r = rnd(rows, hidden)
    w = rnd(hidden).mul_(0.1).add_(1.0)
    b = rnd(hidden).mul_(0.1) if op == "layernorm" else None
    dy, dh = rnd(rows, hidden), rnd(rows, hidden)
    return x, r, w, b, dy, dh


def _leaves(*ts):
    return [None if t is None else t.detach().requires_grad_() for t in ts]


def _grads(fn, x, r, w, b, dy, dh):
    xl, rl, wl, bl = _leaves(x, r, w, b)
    y, h = fn(xl, rl, wl, bl)
    params = [t for t in (xl, rl, wl, bl) if t is not None]
    gs = torch.autograd.grad([y, h], params, [dy, dh], allow_unused=True)
    return y.detach(), h.detach(), gs


_rel = opbench.rel_err


def verify(op, fn, p, x, r, w, b, dy, dh, ref):
    """Max relative error over y, h and the gradients (p = 0), or of y against the norm
    of the peer's own h and of h against its two possible values (p > 0)."""
    y, h, gs = _grads(fn, x, r, w, b, dy, dh)
    if p == 0:
        ye, he, gse = ref
        errs = {"y": _rel(y, ye), "h": _rel(h, he)}
        for name, a, e in zip(("dx", "dresidual", "dweight", "dbias"), gs, gse):
            if a is not None and e is not None:
                errs[name] = _rel(a, e)
        return errs
    hf = h.float()
    yn = F.layer_norm(hf, hf.shape[-1:], w.float(), None if b is None else b.float(), EPS) if op == "layernorm" \
        else F.rms_norm(hf, hf.shape[-1:], w.float(), EPS)
    kept = (r.float() + x.float() / (1 - p))
    dist = torch.minimum((hf - r.float()).abs(), (hf - kept).abs()) / kept.abs().max()
    return {"y": _rel(y, yn), "h": dist.max().item()}


def bytes_moved(direction, rows, hidden, es, p, n_params):
    big = rows * hidden * es
    if direction == "fwd":
        return 4 * big + n_params * hidden * es
    return (5 if p > 0 else 4) * big + (1 + n_params) * hidden * es


def rows_from_log(text):
    """The cells of a run's printed log (lines '[i/n t] <op> <dtype> p=<p> <hidden>x<rows>: peer:dir=pct ...')."""
    import re
    rows = []
    for line in text.splitlines():
        m = re.search(r"(\w+) (\w+) p=([\d.]+) (\d+)x(\d+): (.*)", line)
        if not m:
            continue
        op, dt, p, hidden, n_rows, cells = m.groups()
        for cell in cells.split():
            c = re.match(r"(\w+):(\w+)=([\d.]+)$", cell)
            if c:
                rows.append(dict(op=op, dtype=dt, dropout=float(p), hidden=int(hidden), rows=int(n_rows),
                                 peer=c.group(1), direction=c.group(2), status="ok", pct_copy=float(c.group(3))))
    return rows


def plot(rows, path, title=""):
    """% of copy bandwidth against hidden size, one panel per (op, dtype, dropout, direction), a line per peer."""
    return opbench.plot_panels(rows, path, title, ("op", "dtype", "dropout", "direction"), "hidden", PEERS)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fused_layernorm.bench.fused", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda kind: (lambda s: [kind(v) for v in s.split(",") if v])  # noqa: E731
    ap.add_argument("--hidden", type=csv(int), default=list(HIDDEN))
    ap.add_argument("--dtypes", type=csv(str), default=["bf16", "fp32"])
    ap.add_argument("--ops", type=csv(str), default=["layernorm", "rmsnorm"])
    ap.add_argument("--dropout", type=csv(float), default=[0.0, 0.1])
    ap.add_argument("--directions", type=csv(str), default=["fwd", "bwd"])
    ap.add_argument("--peers", type=csv(str), default=list(PEERS))
    ap.add_argument("--compile-dtypes", type=csv(str), default=["bf16"])
    opbench.add_device_args(ap)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--plot-log", help="draw the plot of a saved run log (its printed lines) and exit")
    a = ap.parse_args(argv)
    if a.plot_log:
        text = Path(a.plot_log).read_text()
        head = text.splitlines()[0] if text else ""
        out = plot(rows_from_log(text), Path(a.plot_log).with_suffix(".png"), head)
        print(f"wrote {out}")
        return 0
    dev = opbench.device_of(a)
    names, not_run = opbench.runnable_peers(a.peers, dev)
    peers, missing = load_peers(names)
    log2 = opbench.log2_numel(a, dev)
    run = opbench.Run("fused", peers, {**not_run, **missing}, a.out, reps=a.reps, device=dev,
                      config=dict(hidden=a.hidden, dtypes=a.dtypes, ops=a.ops, dropout=a.dropout,
                                  log2_numel=log2))
    cases = [(op, dt, p, hd) for op in a.ops for dt in a.dtypes for p in a.dropout for hd in a.hidden]
    for i, (op, dt, p, hidden) in enumerate(cases):
        dtype = DTYPES[dt]
        rows = max(1, (1 << log2) // hidden)
        x, r, w, b, dy, dh = _inputs(op, rows, hidden, dtype, dev)
        ref = None
        if p == 0:
            ye, he, gse = _grads(_torch_fn(op, 0.0), x.float(), r.float(), w.float(),
                                 None if b is None else b.float(), dy.float(), dh.float())
            ref = (ye, he, gse)
        n_params = 2 if op == "layernorm" else 1
        line = []
        for name, bind in peers.items():
            if name == "compile" and dt not in a.compile_dtypes:
                continue
            fn = bind(op, p)
            if fn is None:
                continue

            def check(fn=fn, name=name):
                errs = verify(op, fn, p, x, r, w, b, dy, dh, ref)
                return errs, max(errs.values()) <= TOL[dtype] * (4 if name == "torch" and dt != "fp32" else 1)

            def time_us(d, fn=fn):
                if d == "fwd":
                    with torch.no_grad():
                        return run.time_us(lambda: fn(x, r, w, b))
                xl, rl, wl, bl = _leaves(x, r, w, b)
                y, h = fn(xl, rl, wl, bl)
                params = [t for t in (xl, rl, wl, bl) if t is not None]
                return run.time_us(lambda: torch.autograd.grad([y, h], params, [dy, dh], retain_graph=True))

            base = dict(op=op, dtype=dt, hidden=hidden, rows=rows, dropout=p, peer=name)
            line += run.peer_cells(name, base, a.directions, check, time_us,
                                   lambda d: bytes_moved(d, rows, hidden, x.element_size(), p, n_params))
        run.case_done(i, len(cases), f"{op} {dt} p={p} {hidden}x{rows}", line)
        del x, r, w, b, dy, dh, ref
    return run.finish(plot)


if __name__ == "__main__":
    sys.exit(main())
