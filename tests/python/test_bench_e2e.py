"""Smoke test of the end-to-end training benchmark (python -m fused_layernorm.bench.e2e)
on tiny CPU configs: it runs, times both models, reports the ratio, profiles and
writes JSON."""
import importlib.util
import json

import pytest

from fused_layernorm.bench import e2e

requires_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                           reason="transformers not installed")


@requires_transformers
def test_e2e_quick_cpu_run(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    argv = ["--cpu", "--quick", "--rounds", "2", "--steps", "1", "--warmup", "1", "--profile", "--top", "3",
            "--json", str(out)]
    from fused_layernorm.patch import restore_rope

    try:
        assert e2e.main(argv) == 0
    finally:
        restore_rope()  # patch swapped Llama's apply_rotary_pos_emb process-wide
    text = capsys.readouterr().out
    assert "gpt2" in text and "llama" in text and "patched/stock" in text
    assert "largest differences" in text
    rows = json.loads(out.read_text())
    assert [r["model"] for r in rows] == ["gpt2", "llama"]
    for r in rows:
        assert r["stock"]["n"] == r["patched"]["n"] == 2
        norms = {k: v for k, v in r["replaced"].items() if k != "apply_rotary_pos_emb"}
        assert r["ratio"] > 0 and sum(norms.values()) == 5
        assert r["replaced"].get("apply_rotary_pos_emb", 0) == (1 if r["model"] == "llama" else 0)
        assert abs(r["loss"]["stock"] - r["loss"]["patched"]) < 5e-2
        assert r["profile"]["stock"]["ops"] and r["profile"]["patched"]["ops"]


@pytest.mark.parametrize("argv,what", [(["--models", "bert"], "--models"), (["--steps", "0"], "--steps"),
                                       (["--warmup", "-1"], "--warmup")])
def test_e2e_argument_errors(argv, what, capsys):
    with pytest.raises(SystemExit):
        e2e.parse_args(argv)
    assert what in capsys.readouterr().err
