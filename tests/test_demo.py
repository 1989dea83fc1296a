"""`bench demo`: its wiring (with a stand-in evaluator) and the real offline pipeline end to end."""

from __future__ import annotations

import json
import math
import os
import sys
import types
from pathlib import Path

import pytest

from bench.cli import main
from bench.commands.demo import DEMO_MODELS, DEMO_PROBES, ZOO_MODELS
from bench.dataset import Dataset
from bench.results import write_run
from evaluators.zoo import RECIPES, ZOO_ENV
from test_leaderboard import result_row
from test_zoo import tiny

SMALL = ["--n-train", "48", "--n-val", "16", "--n-test", "16", "--image-size", "128"]


@pytest.fixture(autouse=True)
def tiny_zoo(tmp_path_factory, monkeypatch):
    """The zoo's recipes shrunk to seconds (the full ones run in CI's `bench demo`), trained outside the demo dir."""
    monkeypatch.setenv(ZOO_ENV, str(tmp_path_factory.mktemp("zoo")))
    for name in RECIPES:
        monkeypatch.setitem(RECIPES, name, tiny(name))


def test_demo_wiring_with_a_stand_in_evaluator(tmp_path, capsys, monkeypatch):
    """Generates the dataset, hands it to run_evaluation as the contract says, ranks what it wrote."""
    calls = []

    def run_evaluation(models, dataset, *, results_dir, probes, layers, tokens, **kw):
        calls.append(dict(models=list(models), probes=list(probes), layers=layers, tokens=list(tokens)))
        ds = Dataset(dataset)
        rows = [result_row(m, p, 1.0 if m == "oracle:objects" else 0.0, dataset=ds.name,
                           fingerprint=ds.fingerprint("test")) for m in models for p in probes]
        return write_run(rows, results_dir, "stand-in")

    monkeypatch.setitem(sys.modules, "evaluators.run", types.SimpleNamespace(run_evaluation=run_evaluation))
    code = main(["demo", "--out", str(tmp_path / "demo"), *SMALL])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert calls == [dict(models=list(DEMO_MODELS), probes=list(DEMO_PROBES), layers="last", tokens=["cls"])]
    assert Dataset(tmp_path / "demo" / "colorshape-demo").num_rows("train") == 48
    assert "oracle:objects" in out.out and "bench evaluate --model facebook/dinov2-small" in out.out
    for stage in ("1/4", "2/4", "3/4", "4/4", "train zoo:conjunctions", "generate", "demo finished in"):
        assert stage in out.err
    scratch = tmp_path / "scratch"  # without --out: a temporary directory, removed afterwards
    monkeypatch.setattr("tempfile.mkdtemp", lambda prefix: str(scratch.mkdir() or scratch))
    code = main(["demo", *SMALL, "--format", "json"])
    records = json.loads(capsys.readouterr().out)
    assert code == 0 and len(records) == len(DEMO_MODELS) * len(DEMO_PROBES) and not scratch.exists()
    assert {r["backbone"] for r in records if r["rank"] == 1} == {"oracle:objects"}


def test_demo_end_to_end_offline(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.delenv("BINDINGBENCH_CACHE", raising=False)
    threads = torch.get_num_threads()
    code = main(["demo", "--out", str(tmp_path), "--format", "json", "--epochs", "3", *SMALL])
    out = capsys.readouterr()
    assert code == 0, out.err
    # process state restored; activations cached inside the demo directory, not the user's cache
    assert torch.get_num_threads() == threads and "BINDINGBENCH_CACHE" not in os.environ
    assert any((tmp_path / "cache").rglob("*"))
    records = json.loads(out.out)
    assert {r["backbone"] for r in records} == set(DEMO_MODELS)
    assert {r["probe"] for r in records} == set(DEMO_PROBES)
    assert all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"]
    zoo = [r for r in records if r["backbone"] in ZOO_MODELS]  # learned rows, with intervals (no ranking assumed)
    assert len(zoo) == len(ZOO_MODELS) * len(DEMO_PROBES)
    assert all(math.isfinite(r["value"]) and r["half_width"] > 0 for r in zoo), zoo
    assert "demo finished in" in out.err
    assert list(Path(tmp_path, "results").glob("*.parquet"))
