"""Runs the cases: for each (op, dtype, hidden) build inputs and the float32
reference once, verify every peer, then time what verified, the peers taking
turns."""
import contextlib
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch

from . import timing
from .cases import DTYPES, EPS, bytes_moved, make_inputs
from .verify import check, reference


@dataclass
class Plan:
    device: str
    ops: Sequence[str]
    dtypes: Sequence[str]
    hidden: Sequence[int]
    directions: Sequence[str]
    rows_for: Callable[[int], int]
    reps: int = 25  # timed calls a cell, split over the rounds (rounded up)
    rounds: int = 2  # turns of the case's peers, the order reversed each round
    # more turns, up to 5x rounds, while a case's timing has taken less than this
    # (the CPU: its cheap cells swing with a shared host's load; the fastest of
    # more interleaved calls is steadier)
    case_budget_s: float = 0.0
    warmup: int = 3
    copy_gbps: float = 0.0
    emit: Callable[[dict], None] = print
    verify_s: Dict[str, float] = field(default_factory=dict)  # per peer, includes compile time
    interrupted: bool = False  # run_large stopped early; its rows are the cases it finished


def _cleanup(device: str):
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _errs(errors: dict) -> dict:
    """Three significant digits; inf/nan as strings so the JSON stays standard."""
    return {k: float(f"{v:.3g}") if math.isfinite(v) else str(v) for k, v in errors.items()}


def _round(v: Optional[float], nd: int) -> Optional[float]:
    return None if v is None else round(v, nd)


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _call_for(direction: str, bound, inp, dy):
    """The callable timed for a direction, and the grad mode to time it under."""
    if direction == "fwd":
        x = inp.x
        return (lambda: bound.fn(x)), torch.no_grad
    x = inp.x.detach().requires_grad_()
    leaves = [x] + bound.params
    if direction == "bwd":
        y = bound.fn(x)
        return (lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)), contextlib.nullcontext
    return (lambda: torch.autograd.grad(bound.fn(x), leaves, dy)), contextlib.nullcontext


def _verify(plan: Plan, peer, op, dtype, inp, ref, dirs):
    t0 = time.perf_counter()
    bound = peer.bind(op, inp.w, inp.b, EPS[op])
    chk = check(bound, inp, ref, dtype, fwd=any(d != "bwd" for d in dirs),
                bwd=any(d != "fwd" for d in dirs))
    if plan.device == "cuda":
        torch.cuda.synchronize()
    plan.verify_s[peer.name] = plan.verify_s.get(peer.name, 0.0) + time.perf_counter() - t0
    return bound, chk


def run_large(plan: Plan, peers) -> List[dict]:
    """Per case: every peer verified, then the verified peers timed in turns,
    the order reversed each round, and each cell the median of its rounds'
    reps pooled (on the CPU the fastest of them: timing.host_time_us).  Where
    a peer runs in the case's sequence moves its cells by up to a point either
    way, so every peer takes each place."""
    rows: List[dict] = []
    flush = timing.L2Flush(plan.device) if plan.device == "cuda" else None
    reps = max(1, -(-plan.reps // plan.rounds))  # per round, rounded up: the rounds take at least plan.reps

    def time_it(fn, first_round):
        if flush is not None:
            return timing.cuda_time_us(fn, reps, plan.warmup, flush)
        # the host warms a call once a case: a turn of one call stays one call
        return timing.host_time_us(fn, warmup=min(plan.warmup, 2) if first_round else 0,
                                   min_reps=1, max_reps=reps)

    try:
        for op in plan.ops:
            for dtype in plan.dtypes:
                for hidden in plan.hidden:
                    rows += _run_case(plan, peers, op, dtype, hidden, reps, time_it)
    except KeyboardInterrupt:  # Ctrl-C or `timeout -s INT`: keep the finished cases
        plan.interrupted = True
        print(f"\ninterrupted: {len(rows)} rows of finished cases kept")
    return rows


def _rounds(plan: Plan):
    """A case's round numbers: plan.rounds of them, then more (up to 5x) while
    the case has taken less than plan.case_budget_s."""
    t0, rnd = time.perf_counter(), 0
    while rnd < plan.rounds or (rnd < 5 * plan.rounds and time.perf_counter() - t0 < plan.case_budget_s):
        yield rnd
        rnd += 1


def _run_case(plan: Plan, peers, op, dtype, hidden, reps, time_it) -> List[dict]:
    rows: List[dict] = []
    n_rows = plan.rows_for(hidden)
    inp = make_inputs(op, n_rows, hidden, DTYPES[dtype], plan.device)
    ref = reference(op, inp, EPS[op], grads=any(d != "fwd" for d in plan.directions))
    done: Dict[tuple, dict] = {}  # (peer name, direction) -> its finished cell
    ready = []  # (peer, base, bound, check, dirs) of each peer that verified
    for peer in peers:
        dirs = [d for d in plan.directions if peer.supports(op, dtype, d)]
        if not dirs or not peer.runs_row(hidden, DTYPES[dtype]):
            continue
        base = dict(op=op, dtype=dtype, hidden=hidden, rows=n_rows, peer=peer.name)
        try:
            bound, chk = _verify(plan, peer, op, dtype, inp, ref, dirs)
        except Exception as e:
            for d in dirs:
                done[(peer.name, d)] = _cell(base, d, "ERROR", {}, _first_line(e))
            _cleanup(plan.device)
            continue
        ready.append((peer, base, bound, chk, dirs))
    samples: Dict[tuple, List[float]] = {}
    kernels: Dict[tuple, List[str]] = {}  # our cells': the kernels one call ran
    for rnd in _rounds(plan):
        for peer, base, bound, chk, dirs in (ready if rnd % 2 == 0 else ready[::-1]):
            for d in dirs:
                key = (peer.name, d)
                if key in done:
                    continue
                # a peer may write into its dy; the forward reads none
                dy = inp.dy.clone() if d != "fwd" else None
                try:
                    fn, mode = _call_for(d, bound, inp, dy)
                    with mode():
                        _, ts = time_it(fn, rnd == 0)
                        if rnd == 0 and peer.name == "ours" and plan.device == "cuda":
                            kernels[key] = timing.kernels_run(fn)
                    samples.setdefault(key, []).extend(ts)
                except Exception as e:
                    done[key] = _cell(base, d, "ERROR", chk.errors, _first_line(e))
                    samples.pop(key, None)
                fn = None  # drop the call (and a backward's graph) before the next
                del dy
    for peer, base, bound, chk, dirs in ready:
        for d in dirs:
            key = (peer.name, d)
            if key not in done:
                pooled = statistics.median if plan.device == "cuda" else min
                # a peer that failed verification is timed all the same: its
                # speed is worth knowing, and the summary takes only "ok" cells
                status = "ok" if chk.ok_for(d) else "WRONG"
                done[key] = _cell(base, d, status, chk.errors, "", pooled(samples[key]), kernels.get(key))
    for peer in peers:  # rows in the peers' order
        for d in plan.directions:
            if (peer.name, d) in done:
                rows.append(_row(plan, **done[(peer.name, d)]))
    del inp, ref, ready, samples
    _cleanup(plan.device)
    return rows


def _cell(base: dict, direction: str, status: str, errors: dict, note: str,
          t_us: Optional[float] = None, kernels: Optional[List[str]] = None) -> dict:
    return dict(base=base, direction=direction, t_us=t_us, status=status, errors=errors, note=note,
                kernels=kernels)


def _row(plan: Plan, base: dict, direction: str, t_us: Optional[float], status: str,
         errors: dict, note: str, kernels: Optional[List[str]] = None) -> dict:
    nbytes = bytes_moved(base["op"], direction, base["rows"], base["hidden"], DTYPES[base["dtype"]])
    gbps = nbytes / (t_us * 1e-6) / 1e9 if t_us else None
    pct = 100.0 * gbps / plan.copy_gbps if gbps and plan.copy_gbps else None
    row = dict(base, direction=direction, time_us=_round(t_us, 2), gbps=_round(gbps, 1),
               pct_copy=_round(pct, 2),
               bytes=nbytes, status=status, errors=_errs(errors),
               note=note, **({"kernels": kernels} if kernels else {}))
    plan.emit(row)
    return row


def run_small(plan: Plan, peers, rows_list: Sequence[int], hidden: int, dtype: str,
              calls: int = 300, loops: int = 31) -> List[dict]:
    """Per-call wall time through the Python API for tiny batches.  The peers of
    one case take turns loop by loop, so that drifts of the host hit all alike.
    The median of 31 loops: with 15, host-bound cases swung by several percent
    between reruns on the same machine."""
    out: List[dict] = []
    sync = torch.cuda.synchronize if plan.device == "cuda" else (lambda: None)
    for op in plan.ops:
        for n_rows in rows_list:
            inp = make_inputs(op, n_rows, hidden, DTYPES[dtype], plan.device, seed=1)
            ref = reference(op, inp, EPS[op], grads=True)
            verified = {}  # peer name -> (bound, check) or the exception
            for peer in peers:
                dirs = [d for d in plan.directions if peer.supports(op, dtype, d)]
                if dirs:
                    try:
                        verified[peer.name] = _verify(plan, peer, op, dtype, inp, ref, dirs)
                    except Exception as e:
                        verified[peer.name] = e
            for d in plan.directions:
                fns, pending = {}, []
                for peer in peers:
                    if peer.name not in verified or not peer.supports(op, dtype, d):
                        continue
                    base = dict(op=op, dtype=dtype, hidden=hidden, rows=n_rows, peer=peer.name)
                    v = verified[peer.name]
                    if isinstance(v, Exception):
                        out.append(_small_row(plan, base, d, None, "ERROR", {}, _first_line(v)))
                    elif not v[1].ok_for(d):
                        out.append(_small_row(plan, base, d, None, "WRONG", v[1].errors, ""))
                    else:
                        fns[peer.name] = _fwd_call(v[0], inp) if d == "fwd" else _train_step(v[0], inp)
                        pending.append((base, v[1].errors))
                with torch.no_grad() if d == "fwd" else contextlib.nullcontext():
                    res = timing.per_call_us_interleaved(fns, sync, calls, loops)
                for base, errors in pending:
                    r = res[base["peer"]]
                    if isinstance(r, Exception):
                        out.append(_small_row(plan, base, d, None, "ERROR", errors, _first_line(r)))
                    else:
                        out.append(_small_row(plan, base, d, r, "ok", errors, ""))
            del inp, ref, verified
            _cleanup(plan.device)
    return out


def _fwd_call(bound, inp):
    x = inp.x
    return lambda: bound.fn(x)


def _train_step(bound, inp):
    x = inp.x.detach().requires_grad_()
    leaves = [x] + bound.params
    dy = inp.dy.clone()

    def step():
        bound.fn(x).backward(dy)
        for t in leaves:  # what zero_grad(set_to_none=True) does; keeps .grad from accumulating
            t.grad = None
    return step


def _small_row(plan, base, direction, us, status, errors, note) -> dict:
    row = dict(base, direction=direction, us_per_call=_round(us, 2), status=status,
               errors=_errs(errors), note=note)
    plan.emit(row)
    return row
