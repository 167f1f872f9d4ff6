"""Output: the streamed table, the summary, CSV, JSON, PNG, and the run's environment."""
import csv
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

import torch

_HEAD = (f"{'op':<9} {'dtype':<5} {'dir':<6} {'hidden':>7} {'rows':>7} {'peer':<8} "
         f"{'time_us':>10} {'GB/s':>8} {'%copy':>6}  status")


class Table:
    """Prints rows as they are measured, so the run shows its progress."""

    def __init__(self):
        self.kind = None

    def __call__(self, row: dict):
        kind = "small" if "us_per_call" in row else "large"
        if kind != self.kind:
            self.kind = kind
            head = _HEAD.replace("time_us", "us/call") if kind == "small" else _HEAD
            print(f"\n{head}\n{'-' * len(head)}", flush=True)
        t = row.get("time_us", row.get("us_per_call"))
        status = row["status"]
        if status != "ok":
            status += " " + (row["note"] or " ".join(f"{k}={v}" for k, v in row["errors"].items()))
        print(f"{row['op']:<9} {row['dtype']:<5} {row['direction']:<6} {row['hidden']:>7} {row['rows']:>7} "
              f"{row['peer']:<8} {_f(t, 10, 1)} {_f(row.get('gbps'), 8, 0)} {_f(row.get('pct_copy'), 6, 1)}"
              f"  {status}", flush=True)


def _f(v: Optional[float], width: int, prec: int) -> str:
    return f"{v:>{width}.{prec}f}" if v is not None else f"{'-':>{width}}"


# ---- summary: ours against the best peer -------------------------------------

def summarize(rows: List[dict]) -> List[dict]:
    """One entry per (dtype, op, direction, hidden): ours %copy and the best other peer's."""
    best: Dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok" or r["pct_copy"] is None:
            continue
        key = (r["dtype"], r["op"], r["direction"], r["hidden"])
        e = best.setdefault(key, dict(zip(("dtype", "op", "direction", "hidden"), key),
                                      ours=None, best_peer=None, best_pct=None))
        if r["peer"] == "ours":
            e["ours"] = r["pct_copy"]
        elif r["peer"].startswith("ours_"):
            continue  # ours by another path: not a peer
        elif e["best_pct"] is None or r["pct_copy"] > e["best_pct"]:
            e["best_peer"], e["best_pct"] = r["peer"], r["pct_copy"]
    return [best[k] for k in sorted(best)]


LEGEND = """legend:
  time_us  median GPU time of one call (CUDA events, L2 flushed between calls; CPU: the
           fastest wall time of its calls, since other load only slows a call down)
  GB/s     the fewest bytes the call must move (every tensor read or written once) over that time
  %copy    GB/s as % of a device-to-device copy measured in the same run
  status   ok: verified against torch in float32 on the upcast inputs, then timed
           WRONG: failed that check (timed all the same, left out of the summary and
             the plot); the measured errors follow, each
             max |a - ref| / (rms(ref) + |ref|) for y and dx, ||a - ref|| / ||ref|| for dw and db,
             against the limits {limits}
             (torch's own CPU bf16 backward fails it: its dweight is about 5% off)
           ERROR: the call raised; its message follows
  summary  ours vs the fastest other peer that verified; * marks ours under 95% of it"""


def print_legend():
    from .verify import ELEM_TOL, NORM_TOL
    limits = ", ".join(f"{t} {ELEM_TOL[t]:g} / {NORM_TOL[t]:g}" for t in ELEM_TOL)
    print("\n" + LEGEND.format(limits=limits))


def print_summary(summary: List[dict]):
    """Per dtype (bf16 and fp32, or whatever ran) a block: rows are hidden sizes,
    columns (op, direction), cells 'ours vs best peer'."""
    present = [t for t in ("bf16", "fp16", "fp32") if any(e["dtype"] == t for e in summary)]
    for dtype in [t for t in present if t != "fp16"] or present:
        entries = [e for e in summary if e["dtype"] == dtype]
        if not entries:
            continue
        cols = sorted({(e["op"], e["direction"]) for e in entries},
                      key=lambda c: (c[0], ("fwd", "bwd", "fwdbwd").index(c[1])))
        cell = {(e["op"], e["direction"], e["hidden"]): e for e in entries}
        print(f"\nsummary {dtype}: % of copy bandwidth, ours vs best peer  (* = ours below 95% of it)")
        names = [("LN " if o == "layernorm" else "RMS ") + d for o, d in cols]
        print(f"{'hidden':>7} " + " ".join(f"{n:>19}" for n in names))
        for h in sorted({e["hidden"] for e in entries}):
            out = []
            for o, d in cols:
                e = cell.get((o, d, h))
                if e is None:
                    out.append(f"{'':>19}")
                    continue
                ours = "-" if e["ours"] is None else f"{e['ours']:.0f}"
                peer = "-" if e["best_pct"] is None else f"{e['best_pct']:.0f} {e['best_peer'][:7]}"
                lag = e["ours"] is not None and e["best_pct"] is not None and e["ours"] < 0.95 * e["best_pct"]
                out.append(f"{ours:>4}{'*' if lag else ' '}vs {peer:<10}")
            print(f"{h:>7} " + " ".join(out))


# ---- files ---------------------------------------------------------------------

_CSV_COLS = ("kind", "op", "dtype", "direction", "hidden", "rows", "peer", "time_us", "gbps",
             "pct_copy", "bytes", "status", "errors", "note")


def write_csv(path: Path, rows: List[dict], small_rows: List[dict]):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_CSV_COLS, extrasaction="ignore")
        w.writeheader()
        for kind, rs in (("large", rows), ("small", small_rows)):
            for r in rs:
                r = dict(r, kind=kind, errors=" ".join(f"{k}={v}" for k, v in r["errors"].items()))
                if kind == "small":
                    r["time_us"] = r["us_per_call"]
                w.writerow(r)


def _row_key(r: dict) -> tuple:
    return tuple(r.get(k) for k in ("op", "dtype", "hidden", "rows", "direction", "peer"))


def merge_results(old: dict, new: dict) -> dict:
    """A benchmark split over several runs (a machine that holds a call to ten
    minutes) as one results file: same commit and GPU required; rows of the new
    run replace the old ones of the same case, each part's copy bandwidth and
    config are kept under `parts`."""
    for k in ("schema", "commit", "dirty", "gpu_name"):
        if old.get(k) != new.get(k):
            raise ValueError(f"--merge: the existing results have {k}={old.get(k)!r}, this run {new.get(k)!r}")

    def merged_rows(key):
        keep = {_row_key(r): r for r in old.get(key) or []}
        keep.update({_row_key(r): r for r in new.get(key) or []})
        return list(keep.values())

    def part(d):
        return [dict(date=d["date"], copy_bandwidth_gbps=d["copy_bandwidth_gbps"], config=d["config"],
                     elapsed_s=d["elapsed_s"])]

    doc = dict(new)
    doc["parts"] = (old.get("parts") or part(old)) + part(new)
    doc["rows"], doc["small_rows"] = merged_rows("rows"), merged_rows("small_rows")
    doc["e2e_rows"] = new.get("e2e_rows") or old.get("e2e_rows") or []
    doc["e2e_note"] = new.get("e2e_note") if new.get("e2e_rows") else old.get("e2e_note")
    for k in ("peers_requested", "peers_available", "notes"):
        doc[k] = list(dict.fromkeys((old.get(k) or []) + (new.get(k) or [])))
    for k in ("peers_unavailable", "peers_skipped"):
        doc[k] = {n: v for n, v in {**(old.get(k) or {}), **(new.get(k) or {})}.items()
                  if n not in doc["peers_available"]}
    doc["config"] = dict(new["config"], **{k: list(dict.fromkeys(old["config"][k] + new["config"][k]))
                                           for k in ("ops", "dtypes", "hidden", "directions")})
    doc["summary"] = summarize(doc["rows"])
    doc["ours_failures"] = (old.get("ours_failures") or []) + (new.get("ours_failures") or [])
    doc["ok"] = not doc["ours_failures"]
    doc["complete"] = old.get("complete", True) and new.get("complete", True)
    doc["tests"] = new.get("tests") or old.get("tests")
    for k in ("elapsed_s", "elapsed_excluding_compile_s"):
        doc[k] = round(old.get(k, 0) + new.get(k, 0), 1)
    doc["verify_s_by_peer"] = {n: round((old.get("verify_s_by_peer") or {}).get(n, 0)
                                        + (new.get("verify_s_by_peer") or {}).get(n, 0), 1)
                               for n in {**(old.get("verify_s_by_peer") or {}), **(new.get("verify_s_by_peer") or {})}}
    return doc


def write_text_whole(path: Path, text: str):
    """Writes a temporary file, then renames it: a reader, or a run cut short, never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(paths: List[Path], doc: dict):
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    for p in paths:
        write_text_whole(p, text)


def _peer_color(peer: str) -> str:
    """A peer keeps its colour in every panel: matplotlib's cycle indexed by the peer list."""
    from .peers import ALL_PEERS, OPT_IN_PEERS
    names = list(ALL_PEERS) + list(OPT_IN_PEERS)
    return f"C{names.index(peer) % 10}" if peer in names else "black"


def plot(out_dir: Path, rows: List[dict], copy_gbps: float) -> List[Path]:
    """One PNG: a subplot per (dtype, op) row and direction column, a line per peer,
    % of copy bandwidth against the hidden size."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"no plot: matplotlib not importable ({type(e).__name__}: {e})")
        return []
    ok = [r for r in rows if r["status"] == "ok" and r["pct_copy"] is not None]
    panels = [(t, o) for t in ("bf16", "fp16", "fp32") for o in ("layernorm", "rmsnorm")
              if any(r["dtype"] == t and r["op"] == o for r in ok)]
    dirs = [d for d in ("fwd", "bwd", "fwdbwd") if any(r["direction"] == d for r in ok)]
    if not panels:
        return []
    ymax = max(110.0, max(r["pct_copy"] for r in ok) + 5)
    fig, axes = plt.subplots(len(panels), len(dirs), figsize=(5 * len(dirs), 3.6 * len(panels)),
                             squeeze=False, sharex=True)
    for i, (dtype, op) in enumerate(panels):
        for j, d in enumerate(dirs):
            ax = axes[i][j]
            sel = [r for r in ok if r["dtype"] == dtype and r["op"] == op and r["direction"] == d]
            for peer in dict.fromkeys(r["peer"] for r in sel):
                pts = sorted((r["hidden"], r["pct_copy"]) for r in sel if r["peer"] == peer)
                ax.plot(*zip(*pts), marker="o", ms=3, label=peer, color=_peer_color(peer),
                        lw=2.5 if peer == "ours" else 1.2, zorder=3 if peer == "ours" else 2)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, ymax)
            ax.axhline(100, color="gray", ls=":", lw=1)
            ax.set_title(f"{op} {d} ({dtype})")
            ax.grid(True, alpha=0.3)
            if i == len(panels) - 1:
                ax.set_xlabel("hidden size")
            if j == 0:
                ax.set_ylabel("% of copy bandwidth")
            if sel:
                ax.legend(fontsize=7)
    fig.suptitle(f"fused_layernorm vs peers, 100% = device copy {copy_gbps:.0f} GB/s")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.6 * len(panels))))
    path = out_dir / "pct_copy.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


# ---- environment -----------------------------------------------------------------

def _git(args: List[str], cwd: Path) -> Optional[str]:
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except Exception:
        return None
    return p.stdout if p.returncode == 0 else None


def is_full_commit(commit) -> bool:
    """A whole git object name (40 hex digits): a prefix may stop being unique."""
    return bool(commit) and len(commit) == 40 and all(ch in "0123456789abcdef" for ch in commit.lower())


def environment(device: str) -> dict:
    repo = Path(__file__).resolve().parents[2]
    commit = _git(["rev-parse", "HEAD"], repo)
    status = _git(["status", "--porcelain"], repo)
    # A copy of the tree without its history (the GPU machine gets one) cannot
    # name its commit: the sender passes FLN_GIT_COMMIT / FLN_GIT_DIRTY=0|1.
    if os.environ.get("FLN_GIT_COMMIT"):
        commit = os.environ["FLN_GIT_COMMIT"]
        status = "dirty" if os.environ.get("FLN_GIT_DIRTY", "1") != "0" else ""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "commit": commit.strip() if commit else None,
        "dirty": None if status is None else bool(status.strip()),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cpu": platform.processor() or platform.machine(),
        # the host kernel: the GPU machines run under gVisor (4.4.0) or Firecracker (6.x)
        "os_release": platform.release(),
        "cpu_threads": torch.get_num_threads(),
        "gpu_name": None, "sm_count": None, "compute_capability": None,
        "l2_cache_bytes": None, "gpu_memory_bytes": None,
    }
    try:
        import triton
        env["triton_version"] = triton.__version__
    except Exception:
        env["triton_version"] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu_name=p.name, sm_count=p.multi_processor_count,
                   compute_capability=f"{p.major}.{p.minor}",
                   l2_cache_bytes=getattr(p, "L2_cache_size", None), gpu_memory_bytes=p.total_memory)
    return env


def load_test_summary(path: Optional[str]):
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:
        return {"error": f"could not read {os.fspath(path)}: {type(e).__name__}: {e}"}
