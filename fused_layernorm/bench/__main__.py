"""python -m fused_layernorm.bench [--quick] [--hidden 1024,4096] [--dtypes bf16,fp32]
[--ops layernorm,rmsnorm] [--peers ours,torch,...] [--results PATH] ...

GPU mode (CUDA available): LayerNorm / RMSNorm, fwd / bwd / fwdbwd, bf16 / fp16 /
fp32, against every peer that imports, as % of the device copy bandwidth, plus
per-call costs of tiny batches.  CPU mode: our CPU backend against torch on a few
shapes.  Exits 1 when our op fails verification (the results are written anyway).
"""
import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from . import cases, peers as peers_mod, report, runner, timing


def _csv(kind):
    def parse(s):
        items = [i.strip() for i in s.split(",") if i.strip()]
        return [kind(i) for i in items]
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m fused_layernorm.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"hidden {','.join(map(str, cases.QUICK_HIDDEN))}, dtypes bf16,fp32")
    p.add_argument("--hidden", type=_csv(int), help="hidden sizes, e.g. 1024,4096")
    p.add_argument("--dtypes", type=_csv(str), help="of bf16,fp16,fp32")
    p.add_argument("--ops", type=_csv(str), help="of layernorm,rmsnorm")
    p.add_argument("--directions", type=_csv(str), help="of fwd,bwd,fwdbwd")
    p.add_argument("--peers", type=_csv(str), help=f"of {','.join(peers_mod.ALL_PEERS)} (default: all); also "
                   f"{','.join(peers_mod.OPT_IN_PEERS)}: ours through the fused kernel family")
    p.add_argument("--compile-dtypes", type=_csv(str), default=["bf16"],
                   help="dtypes torch.compile is run for (default bf16; 'none' for no compile)")
    p.add_argument("--reps", type=int, help="timed reps per measurement (default 25 GPU, 10 CPU)")
    p.add_argument("--rounds", type=int,
                   help="turns of a case's peers, the order reversed each round; the reps split over them "
                        "(default 2 GPU; CPU: one call a peer a turn, so that a shared host's load hits all alike)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--log2-numel", type=int, default=cases.LOG2_NUMEL,
                   help="GPU cases hold 2**N elements, rows = 2**N // hidden (default 27)")
    p.add_argument("--no-small", action="store_true", help="skip the small-shape per-call timings")
    p.add_argument("--no-e2e", action="store_true",
                   help="skip the end-to-end rows (training steps of small GPT-2 and Llama, stock against patch())")
    p.add_argument("--cpu", action="store_true", help="CPU mode even when CUDA is available")
    p.add_argument("--out-dir", "--out", default="bench/out",
                   help="CSV, PNG and JSON go here (default bench/out)")
    p.add_argument("--results", help="also write the JSON results to this path")
    p.add_argument("--test-summary", help="JSON file of test counts to embed in the results")
    p.add_argument("--merge", action="store_true",
                   help="merge into the --results file of an earlier run on the same commit and GPU "
                        "(a benchmark split over several calls); its cases re-measured here are replaced")
    a = p.parse_args(argv)
    if a.compile_dtypes and [d.lower() for d in a.compile_dtypes] == ["none"]:
        a.compile_dtypes = []
    for name, allowed in (("dtypes", cases.DTYPES), ("compile_dtypes", cases.DTYPES),
                          ("ops", cases.OPS), ("directions", cases.DIRECTIONS)):
        bad = [v for v in getattr(a, name) or [] if v not in allowed]
        if bad:
            p.error(f"--{name.replace('_', '-')}: unknown {bad}; choose from {', '.join(allowed)}")
    for name in ("reps", "rounds"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(a, name)}")
    try:
        a.peers = peers_mod.normalize_names(a.peers or peers_mod.ALL_PEERS)
    except ValueError as e:
        p.error(str(e))
    return a


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    a = parse_args(argv)
    # `timeout` and a machine's time limit send SIGTERM: keep the finished cases, as for Ctrl-C.
    if threading.current_thread() is not threading.main_thread():
        return _run(a)
    previous = signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        return _run(a)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(a) -> int:
    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() and not a.cpu else "cpu"
    gpu = device == "cuda"
    env = report.environment(device)
    if a.merge and not a.results:
        print("--merge needs --results PATH (the file to merge into)", file=sys.stderr)
        return 2
    if a.results and not report.is_full_commit(env["commit"]):
        print("--results needs the full 40-digit commit being measured: run from a git checkout, or set "
              "FLN_GIT_COMMIT=$(git rev-parse HEAD) (and FLN_GIT_DIRTY=0|1); "
              f"got {env['commit']!r}", file=sys.stderr)
        return 2
    print(f"fused_layernorm bench: {device}" + (f" ({env['gpu_name']}, {env['sm_count']} SMs)" if gpu else
          f" ({env['cpu_threads']} threads)") + f", torch {env['torch_version']}, git {env['commit']}"
          + (" (dirty)" if env["dirty"] else ""))

    peers, unavailable, skipped = peers_mod.load_peers(a.peers, device, a.compile_dtypes)
    notes = [] if gpu else [timing.steady_host_allocator()]
    if unavailable:
        notes.append("not installed: " + "; ".join(f"{k} ({v})" for k, v in unavailable.items()))
    if skipped:
        notes.append("skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()))
    notes += [f"{p.name}: {p.limit_note}" for p in peers if p.limit_note]
    if notes:
        print("\n".join(notes))
    print("peers: " + ", ".join(p.name for p in peers))

    copy = timing.copy_bandwidth(device, nbytes=(1 << 30) if gpu else (256 << 20))
    print(f"copy bandwidth ({copy['bytes'] / 2**30:.2f} GiB read+written): {copy['gbps']:.0f} GB/s")

    if gpu:
        hidden = a.hidden or (cases.QUICK_HIDDEN if a.quick else cases.HIDDEN)
        dtypes = a.dtypes or (cases.QUICK_DTYPES if a.quick else cases.GPU_DTYPES)
        directions = a.directions or cases.DIRECTIONS
        rows_for = lambda h: max(1, (1 << a.log2_numel) // h)  # noqa: E731
    else:
        hidden = a.hidden or cases.CPU_HIDDEN
        dtypes = a.dtypes or cases.CPU_DTYPES
        directions = a.directions or cases.CPU_DIRECTIONS
        rows_for = lambda h: cases.CPU_ROWS  # noqa: E731
    table = report.Table()
    reps = a.reps or (25 if gpu else 10)
    plan = runner.Plan(device=device, ops=a.ops or cases.OPS, dtypes=dtypes, hidden=hidden,
                       directions=directions, rows_for=rows_for, reps=reps,
                       rounds=a.rounds or (2 if gpu else reps), case_budget_s=0.0 if gpu else 1.0,
                       warmup=a.warmup, copy_gbps=copy["gbps"], emit=table)
    rows = runner.run_large(plan, peers)

    if plan.interrupted:
        notes.append(f"interrupted: only the {len(rows)} rows of the cases finished before it")
    small_rows = []
    e2e_rows, e2e_note = [], None
    try:  # interrupted here, the large rows above are still written
        if gpu and not a.no_small and not plan.interrupted:
            small_plan = runner.Plan(**{**plan.__dict__, "directions": cases.SMALL_DIRECTIONS,
                                        "verify_s": {}})
            small_rows = runner.run_small(small_plan, peers, cases.SMALL_ROWS, cases.SMALL_HIDDEN,
                                          cases.SMALL_DTYPE)
            for k, v in small_plan.verify_s.items():
                plan.verify_s[k] = plan.verify_s.get(k, 0.0) + v
        if gpu and not a.no_e2e and not plan.interrupted:
            try:
                import transformers  # noqa: F401
                from . import e2e
                print("\nend-to-end: training steps, stock against fused_layernorm.patch(model)")
                e2e_rows = e2e.run(e2e.parse_args([]))
            except ImportError as e:
                e2e_note = f"skipped: {e}"
                print(f"end-to-end rows {e2e_note}")
            except Exception as e:  # the kernel rows above are already measured: report, do not lose them
                e2e_note = f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
                print(f"end-to-end rows {e2e_note}")
    except KeyboardInterrupt:
        plan.interrupted = True
        notes.append("interrupted after the large cases: small-shape or end-to-end rows missing")
        print("\ninterrupted: the large cases are kept")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what is measured gets written whole

    summary = report.summarize(rows)
    report.print_summary(summary)
    report.print_legend()

    failures = [r for r in rows + small_rows if r["peer"].split("_")[0] == "ours" and r["status"] != "ok"]
    failures += [{"peer": name, "status": "ERROR", "note": why} for name, why in unavailable.items()
                 if name.split("_")[0] == "ours"]
    elapsed = time.perf_counter() - t_start
    compile_s = plan.verify_s.get("compile", 0.0)
    doc = dict(
        schema="fused_layernorm.bench/2", **env,
        copy_bandwidth_gbps=copy["gbps"], copy_bandwidth=copy,
        peers_requested=a.peers, peers_available=[p.name for p in peers],
        peers_unavailable=unavailable, peers_skipped=skipped, notes=notes,
        config=dict(quick=a.quick, ops=list(plan.ops), dtypes=list(dtypes), hidden=list(hidden),
                    directions=list(directions), compile_dtypes=a.compile_dtypes, reps=plan.reps,
                    rounds=plan.rounds, warmup=plan.warmup, log2_numel=a.log2_numel if gpu else None,
                    cpu_rows=None if gpu else cases.CPU_ROWS,
                    small=None if not small_rows else dict(rows=list(cases.SMALL_ROWS),
                                                           hidden=cases.SMALL_HIDDEN,
                                                           dtype=cases.SMALL_DTYPE)),
        rows=rows, small_rows=small_rows, summary=summary, e2e_rows=e2e_rows, e2e_note=e2e_note,
        ours_failures=failures, ok=not failures, complete=not plan.interrupted,
        tests=report.load_test_summary(a.test_summary),
        elapsed_s=round(elapsed, 1), verify_s_by_peer={k: round(v, 1) for k, v in plan.verify_s.items()},
        elapsed_excluding_compile_s=round(elapsed - compile_s, 1),
    )

    if a.merge and a.results and Path(a.results).exists():
        import json
        try:
            doc = report.merge_results(json.loads(Path(a.results).read_text()), doc)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        print(f"merged into {a.results}: {len(doc['rows'])} rows from {len(doc['parts'])} runs")
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_paths = [out_dir / "results.json"] + ([Path(a.results)] if a.results else [])
    report.write_json(json_paths, doc)
    report.write_csv(out_dir / "results.csv", doc["rows"], doc["small_rows"])
    pngs = report.plot(out_dir, doc["rows"], copy["gbps"]) if gpu else []
    print(f"\nwrote {', '.join(str(p) for p in json_paths + [out_dir / 'results.csv'] + pngs)}")
    print(f"elapsed {elapsed:.0f} s (verification incl. torch.compile compile time: {compile_s:.0f} s)")
    if failures:
        print(f"FAIL: our op failed {len(failures)} check(s): "
              + "; ".join(f"{f.get('op', '')} {f.get('dtype', '')} {f.get('direction', '')} "
                          f"{f.get('hidden', '')}x{f.get('rows', '')} {f['status']}" for f in failures[:10]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
