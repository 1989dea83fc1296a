"""Row sets fitted as one batched problem get the numbers each gets alone.

A backbone's layers and token views are stacked into one linear solve (the row set a batch
dimension, `evaluators.fitting.fit_row_sets`); resume, Ray and skipped rows fit subsets of them,
so a row set's rows must not depend on its batch-mates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.core.dataset import Dataset
from evaluators.binding import binding_task, evaluate_binding, evaluate_binding_sets
from evaluators.binding.jobs import binding_jobs
from evaluators.binding.task import SPLITS
from evaluators.fitting import FitResult, feature_stats
from evaluators.fitting.linear import _linear_stage
from evaluators.training import RowReader, TrainConfig
from tests.test_host_syncs import counted_reads

FAMILIES = ["linear", "quadratic", "dnn"]
CONFIG = TrainConfig(epochs=4, l2_path=(1e-1, 1e-2, 1e-3), l1_path=(1e-2,))


def _row_sets(task, n_sets: int, width: int = 24, nan_in: int | None = None) -> list[dict[str, RowReader]]:
    """Synthetic row sets on the task's scenes: set i reads the O code through a noise of its own
    scale, so each set's probes find a different amount of it."""
    out = []
    for i in range(n_sets):
        rng = np.random.default_rng(i)
        sets = {}
        for s in SPLITS:
            o = task.codes[s][1].astype(np.float32)
            mix = rng.normal(size=(o.shape[1], width)).astype(np.float32)
            z = o @ mix + (0.5 + i) * rng.normal(size=(len(o), width)).astype(np.float32)
            if nan_in == i and s == "train":
                z[3, 2] = np.nan
            sets[s] = RowReader(z)
        out.append(sets)
    return out


def _numbers(result) -> dict:
    """Every family's metrics, error, test bits per scene and each probe's validation bits and settings."""
    return {f: ({k: v for k, v in r.metrics.items() if not (isinstance(v, float) and math.isnan(v))}, r.error,
                {t: None if b is None else b.tolist() for t, b in r.scene_bits.items()},
                {t: (fit.val_bits, fit.setting, fit.l2_path, fit.l1_path) for t, fit in (r.fits or {}).items()})
            for f, r in result.items()}


@pytest.fixture(scope="module")
def task(balanced_small):
    return binding_task(Dataset(balanced_small))


def test_a_row_set_in_a_stack_gets_the_numbers_it_gets_alone(task, one_torch_thread):
    """To the last bit on one thread (on several, a batched product may split its sums otherwise:
    the rounding of float32, as between thread counts)."""
    sets = _row_sets(task, 3)
    stacked = evaluate_binding_sets(sets, task, FAMILIES, train=CONFIG, n_boot=50)
    for inputs, together in zip(sets, stacked):
        alone = evaluate_binding(inputs, task, FAMILIES, train=CONFIG, n_boot=50)
        assert _numbers(together) == _numbers(alone)
    # the sets differ (the test would pass on copies otherwise)
    assert stacked[0]["linear"].fits["O_paper"].val_bits != stacked[2]["linear"].fits["O_paper"].val_bits


def test_a_row_set_whose_activations_hold_nan_fails_alone(task, one_torch_thread):
    sets = _row_sets(task, 3, nan_in=1)
    stacked = evaluate_binding_sets(sets, task, ["linear"], train=CONFIG, n_boot=50)
    assert "NaN" in stacked[1]["linear"].error
    for i in (0, 2):
        assert stacked[i]["linear"].error is None
        alone = evaluate_binding(sets[i], task, ["linear"], train=CONFIG, n_boot=50)
        assert _numbers(stacked[i]) == _numbers(alone)


def test_the_linear_stage_reads_the_host_as_often_for_4_row_sets_as_for_1(task):
    """Reads of tensor values (`counted_reads`) while the linear stage fits every target of 1 and
    of 4 row sets: one stack, so the same count."""
    config = TrainConfig(epochs=0, l2_path=(1e-1, 1e-2, 1e-3), l1_path=(1e-2,))
    counts = []
    for n in (1, 4):
        sets = _row_sets(task, n)
        jobs = [binding_jobs("linear", 24, task) for _ in sets]
        for js, inputs in zip(jobs, sets):
            for j in js:
                j.model.set_standardization(*feature_stats(inputs["train"]))
        results = [{j.name: FitResult(j.name, n_bits=j.targets["train"].shape[1]) for j in js} for js in jobs]
        active = [{j.name: j for j in js} for js in jobs]
        with counted_reads() as count:
            _linear_stage(jobs, sets, config, "cpu", results, active)
        assert all(r.error is None and r.l2_path for rs in results for r in rs.values())
        counts.append(count[0])
    assert counts[0] == counts[1], counts
