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
from bench.core.dataset import Dataset
from bench.core.results import write_run
from evaluators.zoo import RECIPES, ZOO_ENV
from test_leaderboard import result_row
from test_zoo import tiny

SMALL = ["--n-train", "48", "--n-val", "16", "--n-test", "16"]
#: What the shipped demo study (bench/studies/demo.toml) evaluates.
ZOO_MODELS = ["zoo:conjunctions", "zoo:masked", "zoo:features", "zoo:untrained"]
DEMO_MODELS = ["oracle:objects", "oracle:mix-0.5", "oracle:features", "pixels", *ZOO_MODELS]
DEMO_PROBES = ["linear", "quadratic", "dnn"]
CONTROL, CONTROL_MODEL = "resampled-o", "zoo:conjunctions"
CONTROL_ROW = f"{CONTROL_MODEL} (control: {CONTROL})"


@pytest.fixture(autouse=True)
def tiny_zoo(tmp_path_factory, monkeypatch):
    """The zoo's recipes shrunk to seconds (the full ones run in `bench demo` itself, timed in
    benchmarks/RESULTS.md), trained outside the demo dir."""
    monkeypatch.setenv(ZOO_ENV, str(tmp_path_factory.mktemp("zoo")))
    for name in RECIPES:
        monkeypatch.setitem(RECIPES, name, tiny(name))


@pytest.mark.slow
def test_demo_wiring_with_a_stand_in_evaluator(tmp_path, capsys, monkeypatch):
    """Generates the zoo's kind of scenes, hands them to run_evaluation as the contract says (the
    backbones, then the control), ranks the backbones and shows the control apart, unranked (here a
    stand-in control reads 0.9: merged into zoo:conjunctions' cells it would change them)."""
    calls = []

    def run_evaluation(plan, **kw):
        models, control = [m.spec for m in plan.models], plan.control
        calls.append(dict(models=models, probes=plan.families, layers=plan.layers, tokens=list(plan.tokens),
                          control=control))
        ds = Dataset(plan.dataset)
        rows = [dict(result_row(m, p, 0.9 if control else 1.0 if m == "oracle:objects" else 0.0, dataset=ds.name,
                                fingerprint=ds.fingerprint("test")), control=control) for m in models for p in plan.families]
        return write_run(rows, plan.results_dir, f"stand-in-{len(calls)}")

    monkeypatch.setitem(sys.modules, "evaluators.runner.run", types.SimpleNamespace(run_evaluation=run_evaluation))
    code = main(["demo", "--out", str(tmp_path / "demo"), *SMALL])
    out = capsys.readouterr()
    assert code == 0, out.err
    others = [m for m in DEMO_MODELS if m not in ZOO_MODELS]  # evaluated while the zoo trains
    assert calls == [dict(models=models, probes=list(DEMO_PROBES), layers="last", tokens=["cls"], control=control)
                     for models, control in ((others, None), (list(ZOO_MODELS), None), ([CONTROL_MODEL], CONTROL))]
    ds = Dataset(tmp_path / "demo" / "colorshape-demo")  # the zoo's scenes: 64 px, two 24-px objects, seed 1
    assert ds.num_rows("train") == 48 and ds.card["config"]["image_size"] == 64
    assert (ds.card["config"]["object_size"], ds.card["config"]["n_objects"], ds.card["seed"]) == (24, 2, 1)
    assert "oracle:objects" in out.out and "bench evaluate --model facebook/dinov2-small" in out.out
    assert max(map(len, out.out.splitlines())) <= 100  # the tables and their explanation fit 100 columns
    assert CONTROL_ROW in out.out
    for stage in ("1/3", "2/3", "3/3", "zoo:conjunctions → ", "generate", "demo finished in"):
        assert stage in out.err
    assert "demo finished in" in out.err and f"in {tmp_path / 'demo'}/ (kept" in out.err
    assert f"bench report {tmp_path / 'demo'}/results -o {tmp_path / 'demo'}/report.html" in out.err

    # without --out: ./bench-demo, kept; the same sizes again reuse it (scenes and rows), other
    # sizes take bench-demo-2, and a folder the demo did not make is never written into
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code = main(["demo", *SMALL, "--format", "json"])
    out = capsys.readouterr()
    records = json.loads(out.out)
    assert code == 0 and len(records) == (len(DEMO_MODELS) + 1) * len(DEMO_PROBES)
    assert {r["backbone"] for r in records if r["rank"] == 1} == {"oracle:objects"}
    assert {(r["value"], r["rank"]) for r in records if r["control"] == CONTROL} == {(0.9, None)}
    assert {r["value"] for r in records if r["backbone"] == CONTROL_MODEL and r["control"] is None} == {0.0}
    kept = sorted(p.name for p in (cwd / "bench-demo").iterdir())
    # .bench-site.json: what the site was built from, so that a rerun with the same results keeps it
    assert kept == [".bench-site.json", "bench-study.json", "cache", "colorshape-demo", "results", "site"] or kept == [
        ".bench-site.json", "bench-study.json", "colorshape-demo", "results", "site"], kept
    assert (cwd / "bench-demo" / "site" / "index.html").exists() and "site: bench-demo/site/index.html" in out.err
    # the zoo trained by the run above: the eight backbones in one evaluation, then the control
    assert len(list((cwd / "bench-demo" / "results").glob("*.parquet"))) == 2
    assert "in bench-demo/ (kept" in out.err and "bench leaderboard bench-demo/results" in out.err
    assert len([line for line in out.err.splitlines() if line.startswith("  bench ")]) == 3
    card = (cwd / "bench-demo" / "colorshape-demo" / "dataset.json").read_bytes()

    assert main(["demo", *SMALL, "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "reusing the scenes in bench-demo/colorshape-demo" in err.replace("\n", "")
    assert (cwd / "bench-demo" / "colorshape-demo" / "dataset.json").read_bytes() == card
    assert sorted(p.name for p in cwd.iterdir()) == ["bench-demo"]

    (cwd / "bench-demo-2").mkdir()
    (cwd / "bench-demo-2" / "notes.txt").write_text("mine")  # not a demo's: skipped, untouched
    assert main(["demo", "--n-train", "40", "--n-val", "16", "--n-test", "16", "--format", "json"]) == 0
    assert "in bench-demo-3/ (kept" in capsys.readouterr().err
    assert sorted(p.name for p in (cwd / "bench-demo-2").iterdir()) == ["notes.txt"]
    assert Dataset(cwd / "bench-demo-3" / "colorshape-demo").num_rows("train") == 40
    assert Dataset(cwd / "bench-demo" / "colorshape-demo").num_rows("train") == 48


@pytest.mark.parametrize("bad, message", [
    (["--n-train", "0"], "n_train: must be ≥ 1, got 0"),
    (["--n-test", "-1"], "n_test: must be ≥ 1, got -1"),
    (["--image-size", "0"], "image_size"),
])
def test_bad_sizes_exit_2_before_any_training(tmp_path, capsys, bad, message):
    assert main(["demo", "--out", str(tmp_path / "demo"), *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("bench: error: ") and "Traceback" not in "".join(err)
    zoo = Path(os.environ[ZOO_ENV])
    assert not any(zoo.iterdir()) and not (tmp_path / "demo" / "results").exists()


@pytest.mark.slow
def test_a_zoo_training_error_in_the_second_process_exits_2(tmp_path, capsys, monkeypatch):
    """The zoo trains in a spawned process: its error comes back as the demo's one line (exit 2), after
    the backbones it did not hold up were evaluated, and the models it did train stay trained."""
    calls = []

    def run_evaluation(plan, **kw):
        calls.append([m.spec for m in plan.models])

    monkeypatch.setitem(sys.modules, "evaluators.runner.run", types.SimpleNamespace(run_evaluation=run_evaluation))
    bad = tiny("masked").with_(data=dict(tiny("masked").data, object_size=80))  # cannot fit a 64-px image
    monkeypatch.setitem(RECIPES, "masked", bad)
    assert main(["demo", "--out", str(tmp_path / "demo"), *SMALL]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "object_size" in line]
    assert len(lines) == 1 and "80" in lines[0] and "Traceback" not in err, err
    assert calls == [[m for m in DEMO_MODELS if m not in ZOO_MODELS]]
    from evaluators.zoo import status

    assert status("conjunctions")["status"] == "trained" and status("masked")["status"] == "not trained"


@pytest.mark.slow
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
    assert {r["backbone"] for r in records if r["control"] == CONTROL} == {CONTROL_MODEL}
    assert {r["probe"] for r in records} == set(DEMO_PROBES)
    assert all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"]
    zoo = [r for r in records if r["backbone"] in ZOO_MODELS and r["control"] is None]  # learned rows, with intervals (no ranking assumed)
    assert len(zoo) == len(ZOO_MODELS) * len(DEMO_PROBES)
    assert all(math.isfinite(r["value"]) and r["lo"] <= r["value"] <= r["hi"] for r in zoo), zoo
    # the control null reads exactly 0 and is never ranked; the oracles bracket the scale even at 48 scenes
    assert {(r["value"], r["rank"]) for r in records if r["control"] == CONTROL} == {(0.0, None)}
    assert {r["value"] for r in records if r["backbone"] == "oracle:features"} == {0.0}
    assert all(r["value"] > 0.1 for r in records if r["backbone"] == "oracle:objects")
    assert "demo finished in" in out.err
    files = sorted(Path(tmp_path, "results").glob("*.parquet"))
    assert files

    # `bench run demo` with the same variables finds every row of `bench demo` there (the key holds
    # the dataset, weights and probe fingerprints): nothing to fit, nothing written
    sizes = ["--set", "N_TRAIN=48", "--set", "N_VAL=16", "--set", "N_TEST=16", "--set", "EPOCHS=3"]
    code = main(["run", "demo", "--out", str(tmp_path), *sizes, "--format", "json"])
    err = capsys.readouterr().err
    assert code == 0 and "nothing to fit" in err and "0/3 rows held" not in err, err
    assert sorted(Path(tmp_path, "results").glob("*.parquet")) == files

    # the rows are those the demo's evaluations give when asked directly, as `bench demo` asked
    # before it became a study: a backbone and the control, every key and number
    from evaluators.runner.request import EvaluationRequest
    from evaluators.runner.run import run_evaluation
    from tests.test_studies import rows_of

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    for models, control in ((["oracle:objects"], None), ([CONTROL_MODEL], CONTROL)):
        run_evaluation(EvaluationRequest(models, tmp_path / "colorshape-demo", task="binding", layers="last",
                                         tokens=("cls",), probes=DEMO_PROBES, results_dir=tmp_path / "reference",
                                         epochs=3, control=control, threads=1), progress=False)
    reference, demo = rows_of(tmp_path / "reference"), rows_of(tmp_path / "results")
    assert len(reference) == 6 and reference.keys() <= demo.keys()
    assert [k for k in reference if reference[k] != demo[k]] == []

