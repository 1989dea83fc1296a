"""Bad inputs to the batched fit (issue 37): activations holding NaN or inf, a constant or
duplicated column, more inputs than training scenes, a target bit that never varies in training.

Each is fitted to finite numbers or refused in one line, in a stack of three row sets, and the
other row sets of the stack get exactly the numbers they get alone: one bad row set never costs
the others their rows, and never raises."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.results import read_results
from evaluators.tasks.binding.task import binding_task
from evaluators.tasks.binding.columns import evaluate_binding, evaluate_binding_sets
from evaluators.backbones.hf import HFBackbone
from evaluators.tasks.binding.task import SPLITS
from evaluators.fitting import RowReader, linear
from tests.golden import VOLATILE
from tests.test_backbones import tiny_checkpoint
from tests.test_stacking import CONFIG, FAMILIES, _numbers, _row_sets

#: The row set of the stack that is made bad (its neighbours 0 and 2 stay healthy).
BAD = 1
#: Training scenes of `balanced_small`: case "more inputs than scenes" reads 200 inputs.
N_TRAIN = 40


@pytest.fixture(scope="module")
def task(balanced_small):
    return binding_task(Dataset(balanced_small))


def _spoil(sets: list[dict[str, RowReader]], spoil) -> list[dict[str, RowReader]]:
    """The row sets with row set `BAD`'s arrays changed by `spoil(split, z)` (in a copy)."""
    out = list(sets)
    bad = {}
    for s in SPLITS:
        z = np.array(sets[BAD][s].array)
        spoil(s, z)
        bad[s] = RowReader(z)
    out[BAD] = bad
    return out


def _non_finite(split, value):
    def spoil(s, z):
        if s == split:
            z[3, 2] = value
    return spoil


def _constant(s, z):
    z[:, 2] = 1.5  # a dead unit: the same value in every scene of every split


def _duplicate(s, z):
    z[:, 3] = z[:, 2]


def _never_varies(task):
    """The task with O bit 0 (a colour-shape conjunction) absent from every training scene, as a
    conjunction a small training set never shows; validation and test keep theirs."""
    f, o = task.codes["train"]
    o = o.copy()
    o[:, 0] = 0
    assert task.codes["val"][1][:, 0].any()  # it does vary where the probe is scored
    return replace(task, codes={**task.codes, "train": (f, o)})


#: case -> (how row set BAD is spoiled, input width, what its refusal says: None where it is fitted)
CASES = {
    "nan": (_non_finite("train", np.nan), 24, "the activations hold NaN or inf"),
    "inf": (_non_finite("train", np.inf), 24, "the activations hold NaN or inf"),
    "nan in validation": (_non_finite("val", np.nan), 24, "the activations hold NaN or inf"),
    "-inf in test": (_non_finite("test", -np.inf), 24, "the test activations hold NaN or inf (1 of 20 test scenes)"),
    "constant column": (_constant, 24, None),
    "duplicated column": (_duplicate, 24, None),
    "more inputs than scenes": (None, 200, None),  # a backbone's row sets share their width: all three
    "bit never varies in training": (None, 24, None),  # the targets are shared: all three
}

_alone_cache: dict = {}


def _alone(task, inputs, key):
    """A row set's numbers fitted alone (the healthy row sets are the same in several cases)."""
    if key not in _alone_cache:
        _alone_cache[key] = _numbers(evaluate_binding(inputs, task, FAMILIES, train=CONFIG, n_boot=50))
    return _alone_cache[key]


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_row_set_is_fitted_or_refused_in_one_line_and_spares_the_others(task, case, one_torch_thread):
    spoil, width, refused = CASES[case]
    if case == "bit never varies in training":
        task = _never_varies(task)
    sets = _row_sets(task, 3, width=width)
    if spoil is not None:
        sets = _spoil(sets, spoil)
    if width > N_TRAIN:
        assert len(sets[BAD]["train"]) == N_TRAIN < width
    stacked = evaluate_binding_sets(sets, task, FAMILIES, train=CONFIG, n_boot=50)  # nothing raises
    for family, result in stacked[BAD].items():
        if refused:
            assert result.error is not None and "\n" not in result.error, (family, result.error)
            assert result.error.startswith(f"F-probe: FloatingPointError: {refused}"), (family, result.error)
            continue
        assert result.error is None, (family, result.error)
        for column in ("L_F", "L_O_given_F", "L_O_paper", "beta_star", "beta_star_paper"):
            assert math.isfinite(result.metrics[column]), (family, column, result.metrics[column])
        for target, bits in result.scene_bits.items():
            assert bits is None or np.isfinite(bits).all(), (family, target)
        assert all(math.isfinite(fit.val_bits) for fit in result.fits.values())
    healthy = spoil is not None and width == 24  # row sets 0 and 2 are those of the plain task
    for i in range(3):
        if i == BAD and refused:
            continue
        key = ("healthy", i) if healthy and i != BAD else (case, i)
        assert _numbers(stacked[i]) == _alone(task, sets[i], key), (case, i)


def test_a_stacked_solve_that_raises_costs_only_the_row_set_that_fails_alone(task, monkeypatch, one_torch_thread):
    """The linear stage's fallback: a solver that raises on a row set with a dead unit (a column
    that standardises to zeros) fails the stacked solve; each row set is then solved alone, the
    dead unit's row set gets its error in one line and the others their alone numbers."""
    solve = linear.solve_path

    def fragile(x_train, *args):
        if (x_train == 0).all(1).any():
            raise RuntimeError("the solver met a dead unit")
        return solve(x_train, *args)

    monkeypatch.setattr(linear, "solve_path", fragile)
    sets = _spoil(_row_sets(task, 3), _constant)
    stacked = evaluate_binding_sets(sets, task, FAMILIES, train=CONFIG, n_boot=50)
    for family, result in stacked[BAD].items():
        assert result.error.startswith("F-probe: RuntimeError: the solver met a dead unit"), (family, result.error)
        assert "\n" not in result.error
    for i in (0, 2):
        assert _numbers(stacked[i]) == _alone(task, sets[i], ("healthy", i)), i

def test_a_layer_whose_activations_overflow_is_an_error_row_of_that_layer(balanced_small, tmp_path, monkeypatch,
                                                                          capsys):
    """A real run: a tiny ViT whose middle layer holds a value float16 cannot hold (the cache keeps
    it as inf, as a backbone's massive activations would be); its three layers are one stack. The
    layer's rows are error rows that its `layer`/`tokens` columns name, in one line; the other
    layers' rows are ok, and no traceback reaches the user."""
    ckpt = tiny_checkpoint("dinov2", tmp_path / "model")[1]
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    forward = HFBackbone.hidden_states

    def overflowing(self, x, layers):
        out = forward(self, x, layers)
        for i, layer in enumerate(layers):
            if layer == 1:
                bump = torch.zeros_like(out[i])
                bump[0, 0, 0] = 1e6  # the first scene of every batch, class token, unit 0
                out[i] = out[i] + bump
        return out

    monkeypatch.setattr(HFBackbone, "hidden_states", overflowing)
    results = tmp_path / "results"
    code = main(["evaluate", "--dataset", str(balanced_small), "--model", str(ckpt), "--layers", "all",
                 "--probes", "linear,dnn", "--epochs", "2", "--results", str(results), "--format", "json"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err and "Warning" not in err, err
    rows = read_results(results).to_pylist()
    assert sorted((r["layer"], r["tokens"], r["probe"]) for r in rows) == [
        (layer, "cls", probe) for layer in (0, 1, 2) for probe in ("dnn", "linear")]
    for r in rows:
        if r["layer"] == 1:
            assert r["status"] == "error" and "\n" not in r["error"], r["error"]
            assert r["error"].startswith("F-probe: FloatingPointError: the activations hold NaN or inf"), r["error"]
            assert r["beta_star"] is None
        else:
            assert r["status"] == "ok" and math.isfinite(r["beta_star"]), (r["layer"], r["error"])


#: `bench evaluate` in a process of its own, as the user runs it: with "fit", the second stack's fit
#: stalls until the process is killed (so the kill, after the first stack's rows, lands inside it
#: whatever the machine's speed); with "write", the second write of the results is cut off half way
#: by a SIGKILL of its own.
KILLABLE = """
import os, signal, sys, time
import pyarrow.parquet as pq
import evaluators.tasks.binding.rows as rows
from bench.cli import main

during = sys.argv.pop(1)
fit, fits = rows.evaluate_binding_sets, []
def stalled(*args, **kwargs):
    fits.append(1)
    if during == "fit" and len(fits) == 2:
        time.sleep(600)
    return fit(*args, **kwargs)
rows.evaluate_binding_sets = stalled

write, writes = pq.write_table, []
def torn(table, where, **kwargs):
    writes.append(where)
    write(table, where, **kwargs)
    if during == "write" and len(writes) == 2:
        os.truncate(where, os.path.getsize(where) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
pq.write_table = torn
main()
"""
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def killable_run(balanced_small, tmp_path_factory):
    """The arguments of a run of nine stacks (three seeds of a 3-layer tiny ViT; on a CPU a stack is
    one row set), and the rows an uninterrupted run of it writes (one torch thread: the same numbers
    in every process)."""
    ckpt = tiny_checkpoint("dinov2", tmp_path_factory.mktemp("model") / "m")[1]
    args = ["evaluate", "--dataset", str(balanced_small), "--model", str(ckpt), "--layers", "all", "--probes",
            "linear", "--seeds", "0,1,2", "--epochs", "2", "--threads", "1", "--format", "json"]
    results = tmp_path_factory.mktemp("uninterrupted")
    assert main([*args, "--results", str(results)]) == 0
    return args, _keyed(read_results(results).to_pylist())


def _keyed(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["layer"], r["tokens"], r["probe"], r["seed"]): {k: v for k, v in r.items() if k not in VOLATILE}
            for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("during", ["fit", "write"])
def test_a_run_killed_mid_fit_leaves_whole_files_and_resumes_to_the_same_rows(during, killable_run, tmp_path,
                                                                               capsys):
    """SIGKILL while the second stack fits, or half way through writing its rows: the results folder
    holds the first stack's rows in a whole file (the torn write stays a hidden temporary that no
    reader takes for results), and the same command run again completes them to the rows of a run
    that was never killed."""
    args, want = killable_run
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, during, *args, "--results", str(results)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if during == "fit":
            _wait_for_rows(results, proc)
            assert proc.poll() is None, "the run finished before it could be killed"
            proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=300) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    files = sorted(results.glob("*.parquet"))
    assert len(files) == 1
    first = pq.read_table(files[0]).to_pylist()  # whole: it reads
    assert [(r["seed"], r["layer"]) for r in first] == [(0, 0)]  # the first stack's row
    assert all(r["status"] == "ok" for r in first)
    leftovers = sorted(p.name for p in results.iterdir() if p not in files)
    assert leftovers == ([] if during == "fit" else [f".{files[0].name}.tmp-{proc.pid}"])
    assert main([*args, "--results", str(results)]) == 0
    assert _keyed(read_results(results).to_pylist()) == want
    capsys.readouterr()


def _wait_for_rows(results: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until the run has written its first stack's rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run finished before it wrote rows"
        if any(results.glob("*.parquet")):
            return
        time.sleep(0.02)
    raise AssertionError("the run wrote no rows")
