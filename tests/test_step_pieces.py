"""On a CPU a probe meets a batch, or a scored chunk, of wide rows in pieces (`piece_rows`): scored in
pieces, every row gets its bits to the last bit; a step in pieces takes the whole batch's mean loss,
up to its rounding."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bench.core.dataset import Dataset
from evaluators.fitting import TrainConfig
from evaluators.fitting import data as fitting_data
from evaluators.fitting.data import LEAST_ROWS, PIECE_BYTES, piece_rows
from evaluators.tasks.binding.columns import evaluate_binding
from evaluators.tasks.binding.task import binding_task
from tests.helpers import make_dataset, spatial_rows

CONFIG = TrainConfig(epochs=3, l2_path=(1e-1, 1e-2), l1_path=(1e-2,))
#: A row of `spatial_rows`'s, as float32: 4 tokens of 8 values.
ROW_BYTES = 4 * 8 * 4


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """64 training scenes (one batch of 64 rows: two pieces of 32) and 48 to score (two of 24)."""
    return binding_task(Dataset(make_dataset(tmp_path_factory.mktemp("data") / "pieces", preset="balanced",
                                             n_train=64, n_val=48, n_test=48, shard_size=64)))


def _fit(task, monkeypatch, piece_bytes: int, batch: int) -> tuple[dict, list[int]]:
    """The attention family's result on `spatial_rows` with pieces of `piece_bytes`, and the rows of
    every read of the validation and test splits."""
    monkeypatch.setattr(fitting_data, "PIECE_BYTES", piece_bytes)
    inputs = spatial_rows(task)
    reads: list[int] = []
    for s in ("val", "test"):
        reader, take = inputs[s], inputs[s].take
        monkeypatch.setattr(reader, "take", lambda idx, dtype=np.float32, take=take: reads.append(len(idx))
                            or take(idx, dtype))
    result = evaluate_binding(inputs, task, ["attention"], train=replace(CONFIG, batch_size=batch), n_boot=20)
    return result["attention"], reads


def test_piece_rows_hold_a_cpus_bytes_and_never_fewer_than_32_rows():
    assert piece_rows(257 * 384 * 4, "cpu") == 32  # dinov2-small's tokens: 12 MiB / 394,752 bytes
    assert piece_rows(64 * 768 * 4, "cpu") == PIECE_BYTES // (64 * 768 * 4) == 64
    assert piece_rows(257 * 1024 * 4, "cpu") == 2 * LEAST_ROWS  # a ViT-L's: 12 rows would take another kernel
    assert piece_rows(384 * 4, "cpu") == 8192  # a pooled row: its batches and splits go through whole
    assert piece_rows(257 * 384 * 4, "cuda:0") is None


def test_scoring_in_pieces_gives_every_row_the_bits_it_gets_whole(task, monkeypatch, one_torch_thread):
    whole, whole_reads = _fit(task, monkeypatch, 2**40, batch=16)
    pieced, pieced_reads = _fit(task, monkeypatch, 32 * ROW_BYTES, batch=16)
    assert set(whole_reads) == {48} and set(pieced_reads) == {24}  # each split scored in two pieces
    for t in whole.fits:
        assert pieced.fits[t].history == whole.fits[t].history
        assert pieced.fits[t].scene_bits.tobytes() == whole.fits[t].scene_bits.tobytes()  # test, per scene
    assert pieced.metrics["beta_star"] == whole.metrics["beta_star"]


def test_a_step_in_pieces_takes_the_mean_loss_of_its_whole_batch(task, monkeypatch, one_torch_thread):
    whole, _ = _fit(task, monkeypatch, 2**40, batch=64)
    pieced, _ = _fit(task, monkeypatch, 32 * ROW_BYTES, batch=64)
    trained = [t for t in whole.fits if len(whole.fits[t].history) > 1]
    assert trained
    for t in trained:
        want, got = np.array(whole.fits[t].history), np.array(pieced.fits[t].history)
        assert want.shape == got.shape and math.isnan(want[0, 0]) and math.isnan(got[0, 0])
        # epoch 1's training bits are the whole split's mean loss at the start (one step an epoch):
        # each piece's share counted once, at the batch's weight
        assert np.allclose(got[1:], want[1:], rtol=1e-5, atol=0), t
        assert pieced.fits[t].best_epoch == whole.fits[t].best_epoch
    assert pieced.metrics["beta_star"] == pytest.approx(whole.metrics["beta_star"], rel=1e-4, abs=1e-6)
