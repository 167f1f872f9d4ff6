"""python -m fused_layernorm.bench.softmax [--cols 256,...,131072] [--dtypes bf16,fp32]
[--peers ours,torch,compile,quack,liger] [--log2-numel 27] [--out DIR]

Softmax over the last dim of a [rows, cols] matrix (2^27 elements by default, rows =
2^27 / cols) against the peers: torch eager (torch.softmax), torch.compile of it, quack's
softmax (CuTe DSL, sm_90) and Liger's LigerSoftmaxFunction (Triton).  Each cell is the
median GPU time of one call with an L2 flush between calls, reported as % of the device
copy bandwidth measured in the same run, for the bytes the op must move: forward reads x
and writes y (2 x bytes); backward reads y and dy and writes dx (3 x bytes).  Every peer
is verified first (y and dx against a float32 reference); one that fails is reported
WRONG and not timed.  The JSON is written after every case.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

from . import report, timing

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


def _rel(a, e):
    a, e = a.float(), e.float()
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-6)).item()


def plot(rows, path, title=""):
    """% of copy bandwidth against cols, one panel per (dtype, direction), a line per peer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r.get("status") == "ok"]
    panels = sorted({(r["dtype"], r["direction"]) for r in ok})
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        for peer in PEERS:
            pts = sorted((r["cols"], r["pct_copy"]) for r in ok if (r["dtype"], r["direction"]) == key
                         and r["peer"] == peer)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=peer, color=f"C{PEERS.index(peer)}",
                        linewidth=2.5 if peer == "ours" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 105)
        ax.set_title(f"softmax {key[0]} {key[1]}", fontsize=9)
        ax.set_xlabel("row length")
        ax.set_ylabel("% of copy bandwidth")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fused_layernorm.bench.softmax", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda kind: (lambda s: [kind(v) for v in s.split(",") if v])  # noqa: E731
    ap.add_argument("--cols", type=csv(int), default=list(COLS))
    ap.add_argument("--dtypes", type=csv(str), default=["bf16", "fp32"])
    ap.add_argument("--directions", type=csv(str), default=["fwd", "bwd"])
    ap.add_argument("--peers", type=csv(str), default=list(PEERS))
    ap.add_argument("--log2-numel", type=int, default=27)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the softmax benchmark needs a GPU")
        return 0
    env = report.environment("cuda")
    peers, missing = load_peers(a.peers)
    print(f"softmax bench: {env['gpu_name']}, git {env['commit']}; peers {', '.join(peers)}"
          + (f"; not installed: {missing}" if missing else ""), flush=True)
    copy = timing.copy_bandwidth("cuda", nbytes=1 << 30)
    print(f"copy bandwidth {copy['gbps']:.0f} GB/s", flush=True)
    flush = timing.L2Flush("cuda")
    rows_out = []
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def write():  # after every case, so a run stopped early keeps what it measured
        doc = dict(schema="fused_layernorm.bench.softmax/1", **env, copy_bandwidth_gbps=copy["gbps"],
                   peers_available=list(peers), peers_unavailable=missing, rows=rows_out,
                   config=dict(cols=a.cols, dtypes=a.dtypes, log2_numel=a.log2_numel, reps=a.reps))
        (out / "softmax.json").write_text(json.dumps(doc, indent=1))

    cases = [(dt, c) for dt in a.dtypes for c in a.cols]
    for i, (dt, cols) in enumerate(cases):
        dtype = DTYPES[dt]
        rows = max(1, (1 << a.log2_numel) // cols)
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, cols, generator=gen, device="cuda", dtype=dtype) * 3
        g = torch.randn(rows, cols, generator=gen, device="cuda", dtype=dtype)
        ref = _run(lambda t: torch.softmax(t.float(), -1), x, g.float())
        line = []
        for name, fn in peers.items():
            base = dict(dtype=dt, cols=cols, rows=rows, peer=name)
            try:
                out_ = _run(fn, x, g)
                errs = {"y": _rel(out_[0], ref[0]), "dx": _rel(out_[1], ref[1])}
                ok = max(errs.values()) <= TOL[dtype] * (2 if name == "torch" else 1)
                del out_
            except Exception as e:
                msg = str(e).strip().splitlines()
                for d in a.directions:
                    rows_out.append(dict(base, direction=d, status="ERROR", note=(msg[0] if msg else "")[:200]))
                line.append(f"{name}=ERR")
                torch.cuda.empty_cache()
                continue
            for d in a.directions:
                cell = dict(base, direction=d, errors={k: float(f"{v:.3g}") for k, v in errs.items()})
                if not ok:
                    rows_out.append(dict(cell, status="WRONG"))
                    line.append(f"{name}:{d}=WRONG")
                    continue
                try:
                    if d == "fwd":
                        nbytes = 2 * x.numel() * x.element_size()
                        with torch.no_grad():
                            t_us, _ = timing.cuda_time_us(lambda: fn(x), a.reps, 3, flush)
                    else:
                        nbytes = 3 * x.numel() * x.element_size()
                        xl = x.detach().requires_grad_()
                        y = fn(xl)
                        t_us, _ = timing.cuda_time_us(lambda: torch.autograd.grad(y, xl, g, retain_graph=True),
                                                      a.reps, 3, flush)
                        del y, xl
                    pct = 100 * nbytes / (t_us * 1e-6) / 1e9 / copy["gbps"]
                    rows_out.append(dict(cell, status="ok", time_us=round(t_us, 2), pct_copy=round(pct, 2)))
                    line.append(f"{name}:{d}={pct:.1f}")
                except Exception as e:
                    msg = str(e).strip().splitlines()
                    rows_out.append(dict(cell, status="ERROR", note=(msg[0] if msg else "")[:200]))
                    line.append(f"{name}:{d}=ERR")
        print(f"[{i + 1}/{len(cases)} {time.perf_counter() - t0:.0f}s] softmax {dt} {rows}x{cols}: "
              + " ".join(line), flush=True)
        del x, g, ref
        torch.cuda.empty_cache()
        write()
    write()
    try:
        plot(rows_out, out / "softmax.png", f"{env['gpu_name']}, git {env['commit']}")
    except ImportError:
        pass  # no matplotlib: the JSON has the numbers
    bad = [r for r in rows_out if r["peer"] == "ours" and r["status"] != "ok"]
    print(f"wrote {out / 'softmax.json'}; ours failed {len(bad)} cell(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
