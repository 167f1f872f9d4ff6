"""python -m fused_layernorm.bench.softmax [--cols 256,...,131072] [--dtypes bf16,fp32]
[--peers ours,torch,compile,quack,liger] [--log2-numel 27] [--out DIR]

Softmax over the last dim of a [rows, cols] matrix (2^27 elements by default, rows =
2^27 / cols) against the peers: torch eager (torch.softmax), torch.compile of it, quack's
softmax (CuTe DSL, sm_90) and Liger's LigerSoftmaxFunction (Triton).  Each cell is the
median GPU time of one call with an L2 flush between calls (without a GPU, or with --cpu:
the CPU backends against torch, 2^22 elements, the fastest wall time), reported as % of the device
copy bandwidth measured in the same run, for the bytes the op must move: forward reads x
and writes y (2 x bytes); backward reads y and dy and writes dx (3 x bytes).  Every peer
is verified first (y and dx against a float32 reference); one that fails is reported
WRONG and not timed.  The JSON is written after every case.
"""
import argparse
import sys

import torch

from . import opbench

COLS = (256, 1024, 4096, 16384, 32768, 65536, 131072)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PEERS = ("ours", "torch", "compile", "quack", "liger")
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}  # max |err| / max |ref|


def load_peers(names):
    """{name: fn(x) -> y, differentiable}, {name: why missing}."""
    peers, missing = {}, {}
    for name in names:
        try:
            if name == "ours":
                import fused_layernorm as fl

                fn = fl.softmax
            elif name == "torch":
                def fn(x):
                    return torch.softmax(x, -1)
            elif name == "compile":
                import torch._dynamo as dynamo
                for knob in ("cache_size_limit", "recompile_limit"):
                    if hasattr(dynamo.config, knob):
                        setattr(dynamo.config, knob, max(getattr(dynamo.config, knob), 4096))
                fn = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
            elif name == "quack":
                if torch.cuda.get_device_capability()[0] < 9:
                    raise RuntimeError("quack needs sm_90")
                from quack.softmax import softmax as fn
            elif name == "liger":
                try:
                    from liger_kernel.ops.softmax import LigerSoftmaxFunction
                except ImportError:
                    from liger_kernel.transformers.functional import liger_softmax as fn  # noqa: F401
                else:
                    fn = LigerSoftmaxFunction.apply
            else:
                raise ValueError(f"unknown peer {name}")
            peers[name] = fn
        except Exception as e:  # ImportError, a .so that fails to load, ...
            msg = str(e).strip().splitlines()
            missing[name] = f"{type(e).__name__}: {msg[0] if msg else ''}"[:200]
    return peers, missing


def _run(fn, x, g):
    xl = x.detach().requires_grad_()
    y = fn(xl)
    (dx,) = torch.autograd.grad(y, xl, g)
    return y.detach(), dx


def plot(rows, path, title=""):
    """% of copy bandwidth against cols, one panel per (dtype, direction), a line per peer."""
    return opbench.plot_panels(rows, path, title, ("dtype", "direction"), "cols", PEERS)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fused_layernorm.bench.softmax", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda kind: (lambda s: [kind(v) for v in s.split(",") if v])  # noqa: E731
    ap.add_argument("--cols", type=csv(int), default=list(COLS))
    ap.add_argument("--dtypes", type=csv(str), default=["bf16", "fp32"])
    ap.add_argument("--directions", type=csv(str), default=["fwd", "bwd"])
    ap.add_argument("--peers", type=csv(str), default=list(PEERS))
    opbench.add_device_args(ap)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/out")
    a = ap.parse_args(argv)
    dev = opbench.device_of(a)
    names, not_run = opbench.runnable_peers(a.peers, dev)
    peers, missing = load_peers(names)
    log2 = opbench.log2_numel(a, dev)
    run = opbench.Run("softmax", peers, {**not_run, **missing}, a.out, reps=a.reps, device=dev,
                      config=dict(cols=a.cols, dtypes=a.dtypes, log2_numel=log2))
    cases = [(dt, c) for dt in a.dtypes for c in a.cols]
    for i, (dt, cols) in enumerate(cases):
        dtype = DTYPES[dt]
        rows = max(1, (1 << log2) // cols)
        gen = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(rows, cols, generator=gen, device=dev, dtype=dtype) * 3
        g = torch.randn(rows, cols, generator=gen, device=dev, dtype=dtype)
        ref = _run(lambda t: torch.softmax(t.float(), -1), x, g.float())
        # forward: x read, y written; backward: y and dy read, dx written
        nbytes = {"fwd": 2 * x.numel() * x.element_size(), "bwd": 3 * x.numel() * x.element_size()}
        line = []
        for name, fn in peers.items():

            def check(fn=fn, name=name):
                y, dx = _run(fn, x, g)
                errs = {"y": opbench.rel_err(y, ref[0]), "dx": opbench.rel_err(dx, ref[1])}
                return errs, max(errs.values()) <= TOL[dtype] * (2 if name == "torch" else 1)

            def time_us(d, fn=fn):
                if d == "fwd":
                    with torch.no_grad():
                        return run.time_us(lambda: fn(x))
                xl = x.detach().requires_grad_()
                y = fn(xl)
                return run.time_us(lambda: torch.autograd.grad(y, xl, g, retain_graph=True))

            base = dict(dtype=dt, cols=cols, rows=rows, peer=name)
            line += run.peer_cells(name, base, a.directions, check, time_us, lambda d: nbytes[d])
        run.case_done(i, len(cases), f"softmax {dt} {rows}x{cols}", line)
    return run.finish(plot)


if __name__ == "__main__":
    sys.exit(main())
