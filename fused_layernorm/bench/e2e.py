"""End-to-end training-step time of small Hugging Face models, stock against
``fused_layernorm.patch``.

A step is forward + backward + AdamW step on one fixed batch of random tokens.  The
stock and patched models (the same weights) run in turns: each round times
``--steps`` steps of one and then of the other, the order reversed every round, so
that clocks, heat and allocator state treat both alike; each figure is the median
over all timed steps (CUDA events on a GPU, perf_counter on the CPU) after warm-up.

    python -m fused_layernorm.bench.e2e                   # GPU: GPT-2 and Llama configs
    python -m fused_layernorm.bench.e2e --profile         # plus a profile of one step of each
    python -m fused_layernorm.bench.e2e --cpu --quick     # tiny configs, seconds (smoke test)

``--profile`` prints, for one step of each model, the top kernels by device time
and the kernels whose total time differs most between stock and patched.
Needs transformers.
"""
import argparse
import copy
import json
import statistics
import sys
import time
from contextlib import nullcontext
from typing import Callable, Dict, List

import torch

# Model sizes.  GPT-2 as in issue 39's measurement: 4 layers, hidden 1024, GPT-2's vocab.
GPU_MODELS = {
    "gpt2": dict(hidden=1024, layers=4, heads=16, vocab=50257, positions=1024),
    "llama": dict(hidden=1024, layers=4, heads=16, vocab=32000, positions=1024, intermediate=2816),
}
CPU_MODELS = {
    "gpt2": dict(hidden=64, layers=2, heads=4, vocab=128, positions=64),
    "llama": dict(hidden=64, layers=2, heads=4, vocab=128, positions=64, intermediate=128),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _csv(s: str) -> List[str]:
    return [v for v in s.split(",") if v]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m fused_layernorm.bench.e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=_csv, default=["gpt2", "llama"], help="of gpt2,llama (default both)")
    p.add_argument("--dtype", choices=sorted(DTYPES) + ["amp"], default="bf16",
                   help="parameters and activations in this dtype; amp: float32 parameters under "
                        "torch.autocast(bfloat16)")
    p.add_argument("--batch", type=int, help="sequences a step (default 8 GPU, 2 CPU)")
    p.add_argument("--seq", type=int, help="tokens a sequence (default 512 GPU, 32 CPU)")
    p.add_argument("--layers", type=int, help="override the models' layer count")
    p.add_argument("--hidden", type=int, help="override the models' hidden size")
    p.add_argument("--rounds", type=int, help="turns of stock and patched (default 10 GPU, 2 CPU)")
    p.add_argument("--steps", type=int, help="timed steps a model a round (default 10 GPU, 2 CPU)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps a model first (default 5)")
    p.add_argument("--profile", action="store_true", help="profile one step of each model and print the "
                   "top kernels and the largest stock/patched differences")
    p.add_argument("--top", type=int, default=25, help="rows of each profile table (default 25)")
    p.add_argument("--trace-dir", help="with --profile, also write Chrome traces here")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    p.add_argument("--quick", action="store_true", help="tiny configs and few steps, on any device")
    p.add_argument("--json", help="write the results to this JSON file")
    a = p.parse_args(argv)
    for name in ("batch", "seq", "layers", "hidden", "rounds", "steps"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error(f"--{name} must be at least 1, got {v}")
    if a.warmup < 0:
        p.error(f"--warmup must be at least 0, got {a.warmup}")
    unknown = [m for m in a.models if m not in GPU_MODELS]
    if unknown or not a.models:
        p.error(f"--models must name some of {','.join(GPU_MODELS)}, got {','.join(a.models) or 'none'}")
    return a


class Trainer:
    """One model, its AdamW optimizer and a fixed batch; ``step()`` is one training step."""

    def __init__(self, model, batch: dict, amp: bool, device: str, context: Callable = nullcontext):
        self.model = model
        self.context = context  # around the forward: patch's stock_rope() for the stock model
        self.batch = batch
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if amp else nullcontext
        self.loss = float("nan")
        self._loss_t = None

    def step(self):
        with self.autocast(), self.context():
            loss = self.model(**self.batch).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._loss_t = loss.detach()

    def last_loss(self) -> float:
        return float(self._loss_t) if self._loss_t is not None else float("nan")


def _time_steps(step: Callable, n: int, gpu: bool) -> List[float]:
    """Milliseconds of each of n steps."""
    if gpu:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in events]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def _sync(gpu: bool):
    if gpu:
        torch.cuda.synchronize()


def time_pair(trainers: Dict[str, Trainer], rounds: int, steps: int, warmup: int, gpu: bool) -> Dict[str, List[float]]:
    """Per-step times of each trainer, taken in turns (order reversed every round)."""
    names = list(trainers)
    for name in names:
        for _ in range(warmup):
            trainers[name].step()
    _sync(gpu)
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name] += _time_steps(trainers[name].step, steps, gpu)
    _sync(gpu)
    return times


def _summary(ms: List[float]) -> dict:
    q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0]] * 3
    return dict(median_ms=statistics.median(ms), q1_ms=q[0], q3_ms=q[2], n=len(ms))


def _profile_step(trainer: Trainer, gpu: bool, trace_path=None):
    import warnings

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    trainer.step()  # one more untimed step, so the profiled one starts from a steady state
    _sync(gpu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            trainer.step()
            _sync(gpu)
            wall_ms = (time.perf_counter() - t0) * 1e3
    if trace_path:
        prof.export_chrome_trace(trace_path)
    return prof, wall_ms


def _profile_tables(prof, gpu: bool) -> Dict[str, Dict[str, dict]]:
    """{"kernels": name -> {us, calls}, "ops": name -> {us, calls}}.  On a GPU, kernels
    are device events (their device time) and ops are the CPU ops that launched them
    (self device time: the kernels launched by the op itself, not by its children);
    on the CPU, ops by self CPU time and no kernels."""
    from torch.autograd import DeviceType

    kernels, ops = {}, {}
    for e in prof.key_averages():
        if gpu:
            us = float(getattr(e, "self_device_time_total", 0.0))
            table = ops if e.device_type == DeviceType.CPU else kernels
        else:
            us = float(e.self_cpu_time_total)
            table = ops
        if us > 0:
            table[e.key] = dict(us=us, calls=int(e.count))
    return dict(kernels=kernels, ops=ops)


def _short(name: str, width: int = 100) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _print_top(title: str, table: Dict[str, dict], top: int):
    total = sum(v["us"] for v in table.values())
    print(f"\n{title}; total {total / 1e3:.3f} ms")
    print(f"{'us':>10} {'%':>6} {'calls':>6}  name")
    for name, v in sorted(table.items(), key=lambda kv: -kv[1]["us"])[:top]:
        print(f"{v['us']:10.1f} {100 * v['us'] / max(total, 1e-9):6.2f} {v['calls']:6d}  {_short(name)}")


def _print_diff(title: str, stock: Dict[str, dict], patched: Dict[str, dict], top: int):
    diff = {n: patched.get(n, {}).get("us", 0.0) - stock.get(n, {}).get("us", 0.0) for n in set(stock) | set(patched)}
    total = sum(diff.values())
    print(f"\n{title}: largest differences, patched - stock (+: patched spends more); net {total:+.1f} us")
    print(f"{'delta us':>10} {'stock us':>10} {'patched us':>10} {'calls s/p':>10}  name")
    for name, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top]:
        s, p = stock.get(name, {}), patched.get(name, {})
        calls = f"{s.get('calls', 0)}/{p.get('calls', 0)}"
        print(f"{d:+10.1f} {s.get('us', 0.0):10.1f} {p.get('us', 0.0):10.1f} {calls:>10}  {_short(name)}")


def print_profile(model: str, prof: Dict[str, dict], top: int, gpu: bool):
    """Top kernels (GPU) or ops (CPU) of each variant, then the largest differences."""
    for v in ("stock", "patched"):
        p = prof[v]
        print(f"\n{model} {v}: one profiled step took {p['wall_ms']:.3f} ms wall (profiler overhead included)")
        if gpu:
            _print_top(f"{model} {v}: top {top} kernels by device time", p["kernels"], top)
        else:
            _print_top(f"{model} {v}: top {top} ops by self CPU time", p["ops"], top)
    if gpu:
        _print_diff(f"{model} kernels", prof["stock"]["kernels"], prof["patched"]["kernels"], top)
        _print_diff(f"{model} ops (device time of the kernels each op launched itself)",
                    prof["stock"]["ops"], prof["patched"]["ops"], top)
    else:
        _print_diff(f"{model} ops (self CPU time)", prof["stock"]["ops"], prof["patched"]["ops"], top)


def run(a) -> List[dict]:
    from fused_layernorm import patch
    from fused_layernorm.bench import hf_models
    from fused_layernorm.patch import stock_rope

    gpu = torch.cuda.is_available() and not a.cpu
    device = "cuda" if gpu else "cpu"
    small = a.quick or not gpu
    sizes_for = CPU_MODELS if small else GPU_MODELS
    batch = a.batch or (2 if small else 8)
    seq = a.seq or (32 if small else 512)
    rounds = a.rounds or (2 if small else 10)
    steps = a.steps or (2 if small else 10)
    amp = a.dtype == "amp"
    dtype = torch.float32 if amp else DTYPES[a.dtype]
    name = torch.cuda.get_device_name() if gpu else f"CPU, {torch.get_num_threads()} threads"
    print(f"e2e training step (forward + backward + AdamW) on {name}, torch {torch.__version__}; "
          f"{a.dtype}, batch {batch} x {seq}; {rounds} rounds of {steps} steps a model in turns, "
          f"{a.warmup} warm-up steps")
    results = []
    for arch in a.models:
        sizes = dict(sizes_for[arch])
        if a.layers:
            sizes["layers"] = a.layers
        if a.hidden:
            sizes["hidden"] = a.hidden
        sizes["positions"] = max(sizes["positions"], seq)
        stock = hf_models.build(arch, dtype=dtype, device=device, **sizes)
        patched = copy.deepcopy(stock)
        report = patch(patched)
        data = hf_models.batch(stock, seq, batch, torch.Generator().manual_seed(0), device)
        # patch swaps apply_rotary_pos_emb process-wide: the stock model runs with the stock one.
        trainers = {"stock": Trainer(stock, data, amp, device, stock_rope), "patched": Trainer(patched, data, amp, device)}
        times = time_pair(trainers, rounds, steps, a.warmup, gpu)
        row = dict(model=arch, sizes=sizes, dtype=a.dtype, batch=batch, seq=seq, device=name,
                   replaced=dict(report), params=sum(p.numel() for p in stock.parameters()),
                   stock=_summary(times["stock"]), patched=_summary(times["patched"]),
                   loss=dict(stock=trainers["stock"].last_loss(), patched=trainers["patched"].last_loss()))
        row["ratio"] = row["patched"]["median_ms"] / row["stock"]["median_ms"]
        results.append(row)
        s, p = row["stock"], row["patched"]
        print(f"{arch:6s} {row['params'] / 1e6:7.1f}M params, replaced {dict(report)}: "
              f"stock {s['median_ms']:.3f} ms/step [{s['q1_ms']:.3f}, {s['q3_ms']:.3f}], "
              f"patched {p['median_ms']:.3f} ms/step [{p['q1_ms']:.3f}, {p['q3_ms']:.3f}], "
              f"patched/stock {row['ratio']:.3f} (n={s['n']}); final loss stock {row['loss']['stock']:.4f} "
              f"patched {row['loss']['patched']:.4f}")
        if a.profile:
            trace = (lambda v: f"{a.trace_dir}/e2e-{arch}-{v}.json") if a.trace_dir else (lambda v: None)
            prof = {}
            for v in ("stock", "patched"):
                p, wall_ms = _profile_step(trainers[v], gpu, trace(v))
                prof[v] = dict(wall_ms=wall_ms, **_profile_tables(p, gpu))
            print_profile(arch, prof, a.top, gpu)
            row["profile"] = prof
        del trainers, stock, patched
        if gpu:
            torch.cuda.empty_cache()
    return results


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("fused_layernorm.bench.e2e needs transformers (pip install transformers)", file=sys.stderr)
        return 2
    if a.trace_dir:
        import os

        os.makedirs(a.trace_dir, exist_ok=True)
    results = run(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
