"""The benchmark's bookkeeping: results must name the whole commit they measured."""
import pytest

from fused_layernorm.bench import report
from fused_layernorm.bench.__main__ import main


def test_is_full_commit():
    assert report.is_full_commit("a8aedca" + "0" * 33)
    assert report.is_full_commit("A8AEDCA" + "f" * 33)
    assert not report.is_full_commit("a8aedca")      # a prefix
    assert not report.is_full_commit("g" * 40)       # not hex
    assert not report.is_full_commit(None)
    assert not report.is_full_commit("")


def test_results_refuse_abbreviated_commit(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FLN_GIT_COMMIT", "a8aedca")
    monkeypatch.setenv("FLN_GIT_DIRTY", "0")
    assert main(["--cpu", "--results", str(tmp_path / "r.json")]) == 2
    assert "40-digit" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_peers_take_turns_in_reversed_order(monkeypatch):
    """Each round times every verified peer, the order reversed each round; a
    cell is the fastest of its rounds' reps pooled (on the CPU; the GPU takes the
    median); a peer that fails verification is timed too and stays WRONG."""
    import torch.nn.functional as F
    from fused_layernorm.bench import peers as peers_mod, runner

    log = []

    def peer(name, scale):
        def bind(op, w, b, eps):
            def fn(x):
                log.append(name)
                return F.layer_norm(x, (x.shape[-1],), w, b, eps) * scale
            return peers_mod.Bound(fn, [w, b])
        return peers_mod.Peer(name, bind, directions={"layernorm": ("fwd",)})

    timed = []

    def fake_host_time_us(fn, warmup=0, max_reps=0, **kw):
        n = len(log)
        fn()
        timed.append(log[n])
        t = float(len(timed))
        return t, [t] * max_reps

    monkeypatch.setattr(runner.timing, "host_time_us", fake_host_time_us)
    emitted = []
    plan = runner.Plan(device="cpu", ops=["layernorm"], dtypes=["fp32"], hidden=[64],
                       directions=["fwd"], rows_for=lambda h: 8, reps=4, rounds=3, warmup=0,
                       copy_gbps=1.0, emit=emitted.append)
    rows = runner.run_large(plan, [peer("a", 1.0), peer("wrong", 2.0), peer("b", 1.0)])
    assert timed == ["a", "wrong", "b", "b", "wrong", "a", "a", "wrong", "b"]
    by_peer = {r["peer"]: r for r in rows}
    assert [r["peer"] for r in rows] == ["a", "wrong", "b"] == [r["peer"] for r in emitted]
    assert by_peer["wrong"]["status"] == "WRONG" and by_peer["wrong"]["time_us"] == 2.0  # timed, still WRONG
    assert by_peer["a"]["time_us"] == 1.0      # fastest of [1, 1, 6, 6, 7, 7]
    assert by_peer["b"]["time_us"] == 3.0      # fastest of [3, 3, 4, 4, 9, 9]
    assert by_peer["a"]["status"] == by_peer["b"]["status"] == "ok"


@pytest.mark.parametrize("flag", ["--rounds", "--reps"])
def test_rounds_and_reps_must_be_positive(flag, capsys):
    with pytest.raises(SystemExit):
        main(["--cpu", flag, "0"])
    assert f"{flag} must be at least 1" in capsys.readouterr().err


def test_fused_log_parses_and_plots(tmp_path):
    """bench.fused's saved log (its progress lines, with or without their '[i/n t]' prefix) turns
    back into cells, and into a plot where matplotlib is installed."""
    from fused_layernorm.bench import fused

    log = ("fused pre-norm bench: GPU, git abc\n"
           "[1/2 4s] layernorm bf16 p=0.0 1024x131072: ours:fwd=98.5 ours:bwd=95.4 flash:fwd=98.8 flash:bwd=WRONG\n"
           "rmsnorm fp32 p=0.1 4096x32768: ours:fwd=99.0\n")
    rows = fused.rows_from_log(log)
    assert [(r["op"], r["peer"], r["direction"], r["pct_copy"]) for r in rows] == [
        ("layernorm", "ours", "fwd", 98.5), ("layernorm", "ours", "bwd", 95.4), ("layernorm", "flash", "fwd", 98.8),
        ("rmsnorm", "ours", "fwd", 99.0)]
    assert rows[-1]["dropout"] == 0.1 and rows[-1]["hidden"] == 4096
    pytest.importorskip("matplotlib")
    assert fused.plot(rows, tmp_path / "p.png", "t").exists()


def test_results_merge_over_runs(monkeypatch, tmp_path, capsys):
    """--merge: a benchmark split over two runs (one op each) is one results file with
    both runs' rows and parts; a different commit is refused."""
    monkeypatch.setenv("FLN_GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("FLN_GIT_DIRTY", "0")
    res = tmp_path / "r.json"
    common = ["--cpu", "--hidden", "128", "--dtypes", "fp32", "--directions", "fwd", "--reps", "1",
              "--rounds", "1", "--warmup", "0", "--out", str(tmp_path / "o"), "--results", str(res)]
    assert main(common + ["--ops", "layernorm"]) == 0
    assert main(common + ["--ops", "rmsnorm", "--merge"]) == 0
    import json
    doc = json.loads(res.read_text())
    assert {(r["op"], r["peer"]) for r in doc["rows"]} == {
        (o, p) for o in ("layernorm", "rmsnorm") for p in ("ours", "torch")}
    assert len(doc["parts"]) == 2 and doc["config"]["ops"] == ["layernorm", "rmsnorm"]
    assert {e["op"] for e in doc["summary"]} == {"layernorm", "rmsnorm"}
    monkeypatch.setenv("FLN_GIT_COMMIT", "b" * 40)
    assert main(common + ["--ops", "rmsnorm", "--merge"]) == 2
    assert "commit" in capsys.readouterr().err


def test_op_bench_keeps_the_fastest_and_slowest_call(monkeypatch):
    """A cell timed through Run.time_us records its fastest and slowest call beside the median."""
    from fused_layernorm.bench import opbench

    run = object.__new__(opbench.Run)
    run.rows, run.copy, run.device, run.reps, run.flush = [], {"gbps": 1000.0}, "cuda", 5, None
    monkeypatch.setattr(opbench.timing, "cuda_time_us", lambda fn, reps, warmup, flush: (2.0, [2.0, 9.5, 1.9, 2.0, 2.1]))
    monkeypatch.setattr(opbench.timing, "kernels_run", lambda fn: ["softmax_fwd_kernel<float, 4, 4, (Mode)1>"])
    words = run.peer_cells("ours", dict(peer="ours"), ["fwd"], lambda: ({"y": 0.0}, True),
                           lambda d: run.time_us(lambda: None), lambda d: 10**6)
    assert words == ["ours:fwd=50.0"]
    assert run.rows[0]["time_us"] == 2.0 and run.rows[0]["time_us_range"] == [1.9, 9.5]
    assert run.rows[0]["kernels"] == ["softmax_fwd_kernel<float, 4, 4, (Mode)1>"]  # ours only
    run.peer_cells("peer", dict(peer="peer"), ["fwd"], lambda: ({"y": 0.0}, True),
                   lambda d: run.time_us(lambda: None), lambda d: 10**6)
    assert "kernels" not in run.rows[1]


def test_kernel_names_lose_namespaces_and_parameters():
    from fused_layernorm.bench.timing import short_kernel_name

    assert short_kernel_name(
        "void fln::cuda::softmax_kernels::softmax_fwd_kernel<c10::BFloat16, 8, 4, "
        "(fln::cuda::softmax_kernels::Mode)1, false, false>(fln::cuda::SoftmaxParams, "
        "fln::cuda::softmax_kernels::Layout)") == "softmax_fwd_kernel<BFloat16, 8, 4, (Mode)1, false, false>"
    assert short_kernel_name("triton_per_fused_softmax_0") == "triton_per_fused_softmax_0"


def test_op_bench_peer_cells(tmp_path):
    """bench.opbench (shared by bench.fused and bench.rope): a peer that fails its check is WRONG and
    never timed, one that raises is ERROR, the rest get % of the copy bandwidth; the plot draws them."""
    from fused_layernorm.bench import opbench

    run = object.__new__(opbench.Run)  # __init__'s copy bandwidth left out
    run.rows, run.copy, run.device = [], {"gbps": 1000.0}, "cpu"
    timed = []

    def time_us(d):
        timed.append(d)
        if d == "bwd":
            raise RuntimeError("no backward\nmore")
        return 2.0

    base = dict(dtype="bf16", head_dim=64)
    words = run.peer_cells("ours", dict(base, peer="ours"), ["fwd", "bwd"], lambda: ({"y": 1e-3}, True),
                           time_us, lambda d: 10**6)  # 1 MB in 2 us: 500 GB/s, half the copy
    assert words == ["ours:fwd=50.0", "ours:bwd=ERR"] and timed == ["fwd", "bwd"]
    assert run.peer_cells("bad", dict(base, peer="bad"), ["fwd"], lambda: ({"y": 0.5}, False),
                          time_us, lambda d: 1000) == ["bad:fwd=WRONG"]
    assert timed == ["fwd", "bwd"]  # the wrong peer was not timed

    def broken():
        raise ValueError("unsupported")
    assert run.peer_cells("err", dict(base, peer="err"), ["fwd"], broken, time_us, lambda d: 1) == ["err=ERR"]
    status = [(r["peer"], r["direction"], r["status"], r.get("pct_copy"), r.get("note")) for r in run.rows]
    assert status == [("ours", "fwd", "ok", 50.0, None), ("ours", "bwd", "ERROR", None, "no backward"),
                      ("bad", "fwd", "WRONG", None, None), ("err", "fwd", "ERROR", None, "unsupported")]
    pytest.importorskip("matplotlib")
    assert opbench.plot_panels(run.rows, tmp_path / "p.png", "t", ("dtype", "direction"), "head_dim",
                               ["ours"]).exists()


def test_ours_fused_is_opt_in_and_not_a_peer(monkeypatch, tmp_path):
    """--peers ours_fused measures the plain cells through the fused family (add_norm without a
    residual); it verifies like any peer, is not in the default set, and the summary's best
    peer is never ours by another path."""
    from fused_layernorm.bench import peers as peers_mod
    from fused_layernorm.bench.report import summarize

    assert "ours_fused" not in peers_mod.ALL_PEERS
    assert peers_mod.normalize_names(["ours_fused", "ours"]) == ["ours_fused", "ours"]
    monkeypatch.setenv("FLN_GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("FLN_GIT_DIRTY", "0")
    res = tmp_path / "r.json"
    assert main(["--cpu", "--hidden", "96", "--dtypes", "fp32", "--ops", "layernorm,rmsnorm", "--directions", "fwd,bwd",
                 "--peers", "ours,ours_fused,torch", "--reps", "1", "--rounds", "1", "--warmup", "0",
                 "--no-small", "--no-e2e", "--out", str(tmp_path / "o"), "--results", str(res)]) == 0
    import json
    rows = json.loads(res.read_text())["rows"]
    assert {(r["peer"], r["status"]) for r in rows} == {("ours", "ok"), ("ours_fused", "ok"), ("torch", "ok")}
    assert {e["best_peer"] for e in summarize(rows)} == {"torch"}


@pytest.mark.parametrize("bench, args", [
    ("softmax", ["--cols", "256,1000", "--log2-numel", "12"]),
    ("rope", ["--head-dims", "64", "--heads", "4", "--kv-heads", "2", "--batch", "2", "--log2-numel", "13"]),
    ("fused", ["--hidden", "256,1000", "--ops", "layernorm,rmsnorm", "--log2-numel", "12"]),
])
def test_op_bench_on_cpu(bench, args, tmp_path, capsys):
    """The per-op benchmarks run on the CPU backends (--cpu), ours and torch verified and timed;
    the GPU-only peers are listed as not run."""
    import importlib
    import json
    mod = importlib.import_module(f"fused_layernorm.bench.{bench}")
    assert mod.main(args + ["--cpu", "--reps", "3", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / f"{bench}.json").read_text())
    assert doc["device"] == "cpu" and doc["peers_available"] == ["ours", "torch"]
    assert doc["peers_unavailable"].get("liger") == "GPU only"
    ours = [r for r in doc["rows"] if r["peer"] == "ours"]
    assert ours and all(r["status"] == "ok" and r["pct_copy"] > 0 for r in ours)
    assert {r["status"] for r in doc["rows"] if r["peer"] == "torch"} <= {"ok", "WRONG"}
    assert "GPU only" in capsys.readouterr().out


def test_sigterm_keeps_finished_cases(monkeypatch, tmp_path):
    """`timeout` ends a run with SIGTERM: the cases finished before it are written, marked
    incomplete, as after Ctrl-C."""
    import json
    import os
    import signal
    import threading
    from fused_layernorm.bench import runner

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set on the main thread only; off it SIGTERM would end the worker")
    monkeypatch.setenv("FLN_GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("FLN_GIT_DIRTY", "0")
    run_case, calls = runner._run_case, []

    def stop_at_second_case(plan, peers, op, dtype, hidden, *args):
        calls.append(hidden)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return run_case(plan, peers, op, dtype, hidden, *args)

    monkeypatch.setattr(runner, "_run_case", stop_at_second_case)
    res = tmp_path / "r.json"
    before = signal.getsignal(signal.SIGTERM)
    assert main(["--cpu", "--ops", "layernorm", "--hidden", "128,256", "--dtypes", "fp32", "--directions", "fwd",
                 "--reps", "1", "--rounds", "1", "--warmup", "0", "--out", str(tmp_path / "o"),
                 "--results", str(res)]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
    doc = json.loads(res.read_text())
    assert calls == [128, 256] and not doc["complete"]
    assert {r["hidden"] for r in doc["rows"]} == {128}
