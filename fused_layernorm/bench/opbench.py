"""What the per-op benchmarks (bench.fused, bench.rope, bench.softmax) share: the
device (the GPU, or the CPU backends where there is none or with --cpu), the copy
bandwidth measured in the same run, every peer verified before it is timed (one
that fails is WRONG or ERROR and never timed), each cell as % of that copy
bandwidth, the JSON written after every case, a plot at the end."""
import json
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

from . import report, timing


def rel_err(a: torch.Tensor, e: torch.Tensor) -> float:
    """max |a - e| / max |e|, in float32."""
    a, e = a.float(), e.float()
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-6)).item()


# Peers that run on the CPU; the others are GPU kernels (torch.compile is left to the GPU runs).
CPU_PEERS = ("ours", "torch")
# log2 of the elements of a case: the GPU's 2^27 is minutes a cell on a CPU.
LOG2_NUMEL = {"cuda": 27, "cpu": 22}


def add_device_args(ap):
    """--cpu and a --log2-numel whose default depends on the device."""
    ap.add_argument("--cpu", action="store_true", help="the CPU backends, even where a GPU is present")
    ap.add_argument("--log2-numel", type=int, default=None,
                    help=f"log2 of the elements of a case (default {LOG2_NUMEL['cuda']} on a GPU, "
                         f"{LOG2_NUMEL['cpu']} on the CPU)")


def device_of(a) -> str:
    return "cpu" if a.cpu or not torch.cuda.is_available() else "cuda"


def log2_numel(a, device: str) -> int:
    return a.log2_numel if a.log2_numel is not None else LOG2_NUMEL[device]


def runnable_peers(names: Sequence[str], device: str):
    """(the names to load, {name: why not} for the GPU-only ones on the CPU)."""
    if device == "cuda":
        return list(names), {}
    return [n for n in names if n in CPU_PEERS], {n: "GPU only" for n in names if n not in CPU_PEERS}


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return (msg[0] if msg else type(e).__name__)[:200]


class Run:
    """One benchmark run: `name` names its JSON (<out>/<name>.json) and plot."""

    def __init__(self, name: str, peers: Sequence[str], missing: Dict[str, str], out: str, config: dict,
                 reps: int, device: str = "cuda"):
        self.name, self.peers, self.missing, self.config, self.reps = name, list(peers), missing, config, reps
        self.device = device
        self.env = report.environment(device)
        self.allocator = timing.steady_host_allocator() if device == "cpu" else None
        self.where = self.env["gpu_name"] if device == "cuda" else f"cpu ({self.env['cpu_threads']} threads)"
        print(f"{name} bench: {self.where}, git {self.env['commit']}; peers {', '.join(self.peers)}"
              + (f"; not run: {missing}" if missing else "") + (f"; {self.allocator}" if self.allocator else ""),
              flush=True)
        self.copy = timing.copy_bandwidth(device, nbytes=1 << 30 if device == "cuda" else 1 << 28)
        print(f"copy bandwidth {self.copy['gbps']:.0f} GB/s", flush=True)
        self.flush = timing.L2Flush(device) if device == "cuda" else None
        self.rows: List[dict] = []
        self.record_kernels, self.last_kernels = False, None  # set for our cells (peer_cells)
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()

    def time_us(self, fn: Callable[[], object]) -> float:
        """Time of one call of fn: the median GPU time with L2 flushed between calls, or the
        fastest host wall time.  The fastest and slowest calls are kept for the cell's row
        (time_us_range): a median far from the fastest call shows a run disturbed for a while."""
        if self.device == "cuda":
            t, times = timing.cuda_time_us(fn, self.reps, 3, self.flush)
        else:
            t, times = timing.host_time_us(fn, warmup=2, min_reps=5, max_reps=self.reps, budget_s=1.0)
        self.last_range = [round(min(times), 2), round(max(times), 2)] if times else None
        if self.device == "cuda" and self.record_kernels:
            self.last_kernels = timing.kernels_run(fn)
        return t

    def empty_cache(self):
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def peer_cells(self, peer: str, base: dict, directions: Sequence[str], check: Callable[[], tuple],
                   time_us: Callable[[str], float], nbytes: Callable[[str], int]) -> List[str]:
        """check() -> (errors, ok); time_us(direction) -> the time of one call; nbytes(direction)
        -> the bytes that call must move.  Adds the rows; returns the words of the case's log line."""
        try:
            errs, ok = check()
        except Exception as e:
            note = _first_line(e)
            self.rows += [dict(base, direction=d, status="ERROR", note=note) for d in directions]
            self.empty_cache()
            return [f"{peer}=ERR"]
        words = []
        for d in directions:
            cell = dict(base, direction=d, errors={k: float(f"{v:.3g}") for k, v in errs.items()})
            if not ok:
                self.rows.append(dict(cell, status="WRONG"))
                words.append(f"{peer}:{d}=WRONG")
                continue
            try:
                self.last_range, self.last_kernels, self.record_kernels = None, None, peer == "ours"
                t_us = time_us(d)
                pct = 100 * nbytes(d) / (t_us * 1e-6) / 1e9 / self.copy["gbps"]
                extra = {"time_us_range": self.last_range} if self.last_range else {}
                if self.last_kernels:
                    extra["kernels"] = self.last_kernels
                self.rows.append(dict(cell, status="ok", time_us=round(t_us, 2), pct_copy=round(pct, 2), **extra))
                words.append(f"{peer}:{d}={pct:.1f}")
            except Exception as e:
                self.rows.append(dict(cell, status="ERROR", note=_first_line(e)))
                words.append(f"{peer}:{d}=ERR")
        return words

    def case_done(self, i: int, n: int, label: str, words: List[str]):
        print(f"[{i + 1}/{n} {time.perf_counter() - self.t0:.0f}s] {label}: " + " ".join(words), flush=True)
        self.empty_cache()
        self.write()  # after every case, so a run stopped early keeps what it measured

    def write(self):
        doc = dict(schema=f"fused_layernorm.bench.{self.name}/1", **self.env,
                   copy_bandwidth_gbps=self.copy["gbps"], peers_available=self.peers,
                   peers_unavailable=self.missing, rows=self.rows, config=dict(self.config, reps=self.reps),
                   **({"host_allocator": self.allocator} if self.allocator else {}))
        report.write_text_whole(self.out / f"{self.name}.json", json.dumps(doc, indent=1))

    def finish(self, plot: Callable[[List[dict], Path, str], object]) -> int:
        """Writes the JSON and the plot; 1 if one of our cells failed."""
        self.write()
        try:
            plot(self.rows, self.out / f"{self.name}.png", f"{self.where}, git {self.env['commit']}")
        except ImportError:
            pass  # no matplotlib: the JSON has the numbers
        bad = [r for r in self.rows if r["peer"] == "ours" and r["status"] != "ok"]
        print(f"wrote {self.out / (self.name + '.json')}; ours failed {len(bad)} cell(s)")
        return 1 if bad else 0


def plot_panels(rows: List[dict], path: Path, title: str, panel_keys: Sequence[str], x_key: str,
                peers: Sequence[str], cols: int = 4):
    """% of copy bandwidth against rows' x_key, one panel per value of panel_keys, a line per peer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r.get("status") == "ok"]
    panels = sorted({tuple(r[k] for k in panel_keys) for r in ok})
    if not panels:
        return None
    cols = min(cols, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.2 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        for j, peer in enumerate(peers):
            pts = sorted((r[x_key], r["pct_copy"]) for r in ok
                         if tuple(r[k] for k in panel_keys) == key and r["peer"] == peer)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=peer, color=f"C{j}", linewidth=2.5 if peer == "ours" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 105)
        ax.set_title(" ".join(f"{k}={v}" if k == "dropout" else str(v) for k, v in zip(panel_keys, key)), fontsize=9)
        ax.set_xlabel(x_key)
        ax.set_ylabel("% of copy bandwidth")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
