"""A fit under a memory budget (`TrainConfig.memory_budget`) reads its rows in pieces the budget
holds, and gets the numbers of a fit under none, to the last bit on a CPU; splits held in memory
for a stage are held as stored (float16) and upcast batch by batch, with the same numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from evaluators.fitting import RowReader, TrainConfig, feature_stats
from evaluators.fitting import stacked as stacked_stage
from evaluators.fitting.data import LEAST_ROWS, STATS_VALUE_BYTES, read_spans
from evaluators.tasks.binding.columns import evaluate_binding, evaluate_binding_sets
from evaluators.tasks.binding.task import SPLITS, binding_task
from tests.helpers import spatial_rows

CONFIG = TrainConfig(epochs=3, batch_size=16, l2_path=(1e-1, 1e-2), l1_path=(1e-2,))


@pytest.fixture(scope="module")
def task(balanced_small):
    return binding_task(Dataset(balanced_small))


def _pooled(task, dtype=np.float32) -> dict[str, RowReader]:
    """24 values a scene reading the O code through noise."""
    rng = np.random.default_rng(0)
    out = {}
    for s in SPLITS:
        o = task.codes[s][1].astype(np.float32)
        z = o @ rng.normal(size=(o.shape[1], 24)) + rng.normal(size=(len(o), 24))
        out[s] = RowReader(z.astype(np.float16).astype(dtype))  # values float16 holds, as the cache's
    return out


def _numbers(result) -> dict:
    """Every family's metrics, test bits per scene and each probe's validation bits and best epoch."""
    return {f: ({k: v for k, v in r.metrics.items() if not (isinstance(v, float) and math.isnan(v))}, r.error,
                {t: None if b is None else b.tolist() for t, b in r.scene_bits.items()},
                {t: (fit.val_bits, fit.best_epoch, fit.setting) for t, fit in (r.fits or {}).items()})
            for f, r in result.items()}


def _least(inputs: dict[str, RowReader]) -> int:
    """The smallest budget a fit of `inputs` takes: a training batch (at least 2 x `LEAST_ROWS` rows)
    read as float32, or a row as `feature_stats` reads it."""
    r = inputs["train"]
    return max(max(CONFIG.batch_size, 2 * LEAST_ROWS) * r.read_row_bytes, STATS_VALUE_BYTES * r.values)


def _taking(monkeypatch) -> list[tuple[int, int]]:
    """(rows, the reader's bytes a row as read) of every `RowReader.take` from now on."""
    takes: list[tuple[int, int]] = []
    original = RowReader.take

    def take(self, idx, dtype=np.float32):  # noqa: ANN001
        takes.append((len(idx), self.read_row_bytes if dtype is not None else self.row_bytes))
        return original(self, idx, dtype)

    monkeypatch.setattr(RowReader, "take", take)
    return takes


@pytest.mark.parametrize("kind", ["pooled", "spatial"])
def test_a_fit_under_the_least_budget_gets_the_numbers_of_an_unbounded_one(task, kind, monkeypatch, one_torch_thread):
    families = ["linear", "quadratic", "dnn"] if kind == "pooled" else ["attention"]
    inputs = _pooled(task) if kind == "pooled" else spatial_rows(task)
    takes = _taking(monkeypatch)
    free = _numbers(evaluate_binding(inputs, task, families, train=replace(CONFIG, memory_budget=2**40), n_boot=20))
    reads = len(takes)
    del takes[:]
    budget = _least(inputs)
    bounded = _numbers(evaluate_binding(inputs, task, families, train=replace(CONFIG, memory_budget=budget), n_boot=20))
    assert bounded == free
    assert any(fit[1] > 0 for one in free.values() for fit in one[3].values())  # the gradient stage trained
    assert len(takes) > reads  # the budget split reads
    if kind == "spatial":  # (the pooled linear stage holds its splits whole: a full-batch solve)
        assert all(n * cost <= budget for n, cost in takes), (budget, sorted(set(takes)))


def test_statistics_read_in_pieces_are_the_statistics_read_whole():
    rng = np.random.default_rng(0)
    rows = (rng.normal(size=(300, 5, 7)) * np.exp(rng.normal(size=(300, 1, 1)) * 2)).astype(np.float16)
    whole = feature_stats(RowReader(rows), chunk=64)
    pieces = RowReader(rows, read_bytes=3 * STATS_VALUE_BYTES * 35)  # 3 rows a read
    for got, want in zip(feature_stats(pieces, chunk=64), whole):
        assert got.tobytes() == want.tobytes()


def test_a_chunk_read_in_pieces_is_split_evenly_and_never_below_16_rows():
    spans = list(read_spans(250, 100, 40))
    assert spans[0] == (0, 33) and spans[-2:] == [(200, 225), (225, 250)]  # the last chunk: 50 rows in two of 25
    assert all(b - a <= 40 for a, b in spans) and [a for a, _ in spans][1:] == [b for _, b in spans][:-1]
    assert all(b - a >= LEAST_ROWS for a, b in spans)
    assert list(read_spans(250, 100, None)) == [(0, 100), (100, 200), (200, 250)]


def test_a_budget_below_one_batch_of_rows_is_refused(task):
    inputs = spatial_rows(task)
    with pytest.raises(BenchError, match=r"^memory budget: .* cannot read one batch of rows \(32 rows of 4 x 8"):
        evaluate_binding(inputs, task, ["attention"], train=replace(CONFIG, memory_budget=_least(inputs) - 1), n_boot=20)


def test_a_stacked_fit_holds_float16_rows_and_gets_the_numbers_of_float32_ones(task, monkeypatch, one_torch_thread):
    """The stacked path (CUDA's, run here on the CPU) keeps its training and validation rows as stored
    and upcasts them per batch: float16 to float32 is exact, so its numbers are float32's."""
    monkeypatch.setattr(stacked_stage, "STACKED_DEVICES", ("cuda", "cpu"))
    held = []
    original = stacked_stage._TrainRows.__init__

    def init(self, arrays, device):  # noqa: ANN001
        original(self, arrays, device)
        held.append(self.block.dtype)

    monkeypatch.setattr(stacked_stage._TrainRows, "__init__", init)
    families = ["linear", "dnn"]
    got = [_numbers(r) for r in evaluate_binding_sets([_pooled(task, np.float16)] * 2, task, families, train=CONFIG,
                                                       n_boot=20)]
    want = [_numbers(r) for r in evaluate_binding_sets([_pooled(task, np.float32)] * 2, task, families, train=CONFIG,
                                                        n_boot=20)]
    assert got == want
    assert [str(t) for t in held] == ["torch.float16", "torch.float32"]
