"""Timers: CUDA events with an L2 flush between calls, host timers, copy bandwidth."""
import ctypes
import re
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch


class L2Flush:
    """Writes a buffer of twice the L2 size, so that no input of the next call
    is still cached.  Runs outside the timed region."""

    def __init__(self, device="cuda"):
        props = torch.cuda.get_device_properties(device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 64 << 20)
        self.buf = torch.empty(2 * self.l2_bytes, dtype=torch.uint8, device=device)

    def __call__(self):
        self.buf.zero_()


def _let_host_run_ahead(reps: int, host_us: float = 0.0):
    # Queue a GPU sleep first, so that the host enqueues all reps before the
    # first one starts and host overhead between kernels is never timed: twice
    # a rep's host time (flush and fn, the fastest warm-up), at least 0.1 ms a
    # rep, so that a call whose Python and launches outlast its kernels is
    # still timed by its GPU work, not by its launch gaps.
    try:
        torch.cuda._sleep(int(2000 * reps * max(100.0, 2.0 * host_us)))  # 2000 cycles a microsecond, ~2 GHz
    except Exception:
        pass


def cuda_time_us(fn: Callable, reps: int, warmup: int, flush: L2Flush) -> Tuple[float, List[float]]:
    """Median over `reps` of the GPU time of one fn(), in microseconds."""
    host_us = float("inf")
    for _ in range(max(warmup, 2)):  # the fastest warm-up's host time (the first may compile)
        t0 = time.perf_counter()
        flush()
        fn()
        host_us = min(host_us, (time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    _let_host_run_ahead(reps, host_us)
    for i in range(reps):
        flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return statistics.median(times), times


def short_kernel_name(name: str) -> str:
    """A profiler's kernel name without `void`, its parameter list and namespaces:
    softmax_fwd_kernel<BFloat16, 8, 4, (Mode)1, false, false>."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    if name.endswith(")"):  # drop the parameter list: the last top-level parentheses
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return re.sub(r"\b\w+::", "", name)


def kernels_run(fn: Callable) -> List[str]:
    """The CUDA kernels one fn() launches, in order, repeats kept once: which
    strategy served a cell (a cluster, or the fallback where the device
    refused one) is in the results, not inferred from the plan."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names: List[str] = []
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            short = short_kernel_name(e.name)
            if short not in names and not short.startswith("Memcpy") and not short.startswith("Memset"):
                names.append(short)
    return names


def steady_host_allocator() -> str:
    """Makes glibc keep and reuse freed memory: mmap threshold 32 MB (its
    largest), trim threshold 1 GB.  With glibc's defaults a call's output lands
    on fresh pages or reused ones by the heap's history, and the fresh ones'
    first-touch faults (about 0.7 us each for 4 KB pages here) decided cells of
    ours against torch either way (LN fp32 hidden 1024: ours 345-974 us, torch
    517-1075, by run).  Reused memory times the kernels, as torch's caching
    allocator does on the GPU; both peers run under it.  Returns a note."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, 32 << 20) == 1 and libc.mallopt(-1, 1 << 30) == 1  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        ok = False
    return ("host allocator: glibc keeps freed memory (mmap threshold 32 MB, trim threshold 1 GB)" if ok
            else "host allocator: default (not glibc)")


def host_time_us(fn: Callable, warmup: int = 2, min_reps: int = 3, max_reps: int = 20,
                 budget_s: float = 0.3) -> Tuple[float, List[float]]:
    """Fastest wall time of one fn() on the host (CPU backend), in microseconds:
    other load on a shared host only slows a call down, so the fastest call is
    the steadiest figure (the median moved up to 2x between runs on 2 cores).
    Takes as many reps as fit in budget_s, within [min_reps, max_reps]."""
    for _ in range(warmup):
        fn()
    times: List[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return min(times), times


def per_call_us_interleaved(fns: Dict[str, Callable], sync: Callable, calls: int = 200,
                            loops: int = 7, warmup: int = 50) -> Dict[str, object]:
    """Wall time per call of `calls` back-to-back calls followed by one sync, the
    median over `loops` such loops: what an eager Python caller pays.  The fns
    take turns loop by loop.  Returns {name: microseconds or the exception}."""
    res: Dict[str, object] = {}
    samples: Dict[str, List[float]] = {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            sync()
            samples[name] = []
        except Exception as e:
            res[name] = e
    for _ in range(loops):
        for name in list(samples):
            fn = fns[name]
            try:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                samples[name].append((time.perf_counter() - t0) * 1e6 / calls)
            except Exception as e:
                res[name] = e
                del samples[name]
    res.update({name: statistics.median(s) for name, s in samples.items()})
    return res


def copy_bandwidth(device: str, nbytes: int = 1 << 30, reps: int = 20) -> dict:
    """Device copy src -> dst of nbytes; bandwidth counts bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    if device == "cuda":
        t_us, _ = cuda_time_us(lambda: dst.copy_(src), reps=reps, warmup=3, flush=L2Flush(device))
    else:
        t_us, _ = host_time_us(lambda: dst.copy_(src), warmup=2, min_reps=5, max_reps=reps, budget_s=1.0)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"gbps": 2 * nbytes / (t_us * 1e-6) / 1e9, "bytes": 2 * nbytes, "time_us": t_us}
