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
