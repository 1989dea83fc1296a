"""Training probes on cached activations: one pass over the data trains many probes.

Activations live on disk (float16 memmaps, docs/ARCHITECTURE.md §2). Batches are read with
positioned reads instead of through the memory map, so resident memory stays at a
few batches whatever the dataset size (pages touched through a map count as RSS).
Every batch read is shared by all probes of a (backbone, layer, view): the F-, O|F- and
paper probes of every family step on it in turn.

Defaults (`TrainConfig`, the settings the calibration suite validates): AdamW with the
probe family's learning rate (`DEFAULTS[family]["lr"]`, scaled down for inputs wider than
64 by `probe_lr`) and weight decay (1e-4; 0.1 for quadratic-shared), batches of `auto_batch_size` (about 64 steps an
epoch, 16 to 128 rows). Training runs until the mean validation
bits plateau, not for a fixed number of epochs: a fixed cosine schedule over 40 epochs
left linear probes still improving at the end (best epoch 35-39 of 40) while a 1024-d dnn
had peaked at epoch 1. `ReduceLROnPlateau` cuts the rate by 0.3 after 3 epochs without a
1e-3-bit improvement, and a probe stops after 10 such epochs; 200 epochs is only a backstop,
and `FitResult.converged` says whether the plateau was reached with the best epoch outside
the budget's last 10 %. The test split is scored once, with the weights of the best
validation epoch. Mixed precision (bf16 autocast) on CUDA only; CPU runs in fp32.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from evaluators.probes import Probe, anchor, scene_bits


def resolve_device(device: str) -> str:
    """`auto` means CUDA when available."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and stopping settings shared by every probe of one `fit_probes` call.

    `lr` / `weight_decay` None mean each probe's own (`Probe.lr`, `Probe.weight_decay`, set
    per family from `DEFAULTS` by `build_probe`); a number overrides it for every probe.
    """

    epochs: int = 200
    #: None: `auto_batch_size(n_train)`, about 64 optimiser steps per epoch, 16 to 128 rows.
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    patience: int = 10
    lr_patience: int = 3
    lr_factor: float = 0.3
    min_delta: float = 1e-3
    seed: int = 0
    device: str = "cpu"


def auto_batch_size(n_train: int) -> int:
    """Rows per optimiser step: about 64 steps an epoch, between 16 and 128 rows.

    Plateau stopping counts epochs, so an epoch must hold enough steps for a probe to move:
    at 2,000 training scenes batches of 128 give 16 steps, and a quadratic-shared probe on
    oracle:objects stalled at β* 0.91 where batches of 32 reached 0.98.
    """
    return max(16, min(128, n_train // 64))


class RowReader:
    """Rows of an N x ... array by index, as float32, without mapping the file into RSS.

    A C-contiguous np.memmap is read with os.pread (runs of consecutive rows coalesced);
    anything else (an in-memory array) is indexed directly. `n` limits the rows used.
    """

    def __init__(self, array: np.ndarray, n: int | None = None) -> None:
        self.array = array
        self.n = len(array) if n is None else min(n, len(array))
        self.row_shape = tuple(array.shape[1:])
        self.dtype = array.dtype
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * array.dtype.itemsize
        filename = getattr(array, "filename", None)
        self._fd = None
        if isinstance(array, np.memmap) and filename and array.flags.c_contiguous:
            self._fd = os.open(filename, os.O_RDONLY)
            self._offset = int(array.offset)

    def __len__(self) -> int:
        return self.n

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` (sorted ascending for speed) as a float32 array."""
        idx = np.asarray(idx, dtype=np.int64)
        if self._fd is None:
            return np.asarray(self.array[idx], dtype=np.float32)
        buf = bytearray(len(idx) * self.row_bytes)
        view = memoryview(buf)
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        pos = 0
        for run in np.split(idx, breaks):
            size = len(run) * self.row_bytes
            got = os.preadv(self._fd, [view[pos : pos + size]], self._offset + int(run[0]) * self.row_bytes)
            if got != size:
                raise OSError(f"short read from {self.array.filename}: {got} of {size} bytes")
            pos += size
        return np.frombuffer(buf, dtype=self.dtype).reshape(len(idx), *self.row_shape).astype(np.float32)

    def chunks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(indices, rows) in order, `size` rows at a time."""
        for start in range(0, self.n, size):
            idx = np.arange(start, min(start + size, self.n))
            yield idx, self.take(idx)


def feature_stats(reader: RowReader, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std over all rows (and tokens), streamed in float64."""
    d = reader.row_shape[-1]
    total, sq, count = np.zeros(d), np.zeros(d), 0
    for _, rows in reader.chunks(chunk):
        flat = rows.reshape(-1, d).astype(np.float64)
        total += flat.sum(0)
        sq += np.square(flat).sum(0)
        count += len(flat)
    mean = total / max(count, 1)
    return mean, np.sqrt(np.maximum(sq / max(count, 1) - mean**2, 0.0))


@dataclass
class ProbeJob:
    """One probe to train: its model, per-split targets (N x K uint8), optional condition,
    and optional exact prior logits (N x K float32, ±inf where the prior fixes the bit)
    that the probe's residual is added to."""

    name: str
    model: Probe
    targets: dict[str, np.ndarray]
    cond: dict[str, np.ndarray] | None = None
    prior: dict[str, np.ndarray] | None = None


@dataclass
class FitResult:
    """A trained probe's test scores at its best validation epoch (0 = untrained: the prior).

    `converged` is False when the fit may have stopped short of its optimum: validation was
    still improving when the epoch budget ran out (no `patience` epochs without improvement),
    or the best epoch lies in the last 10 % of the budget.
    """

    name: str
    best_epoch: int = -1
    val_bits: float = math.inf
    scene_bits: np.ndarray | None = None  # test bits per scene
    bits_correct: np.ndarray | None = None  # teacher-forced correct bits per test scene
    n_bits: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)  # (train, val) mean bits per epoch
    converged: bool = False
    error: str | None = None


def fit_probes(
    jobs: Sequence[ProbeJob],
    inputs: dict[str, RowReader],
    config: TrainConfig = TrainConfig(),
    progress: Callable[[int], None] | None = None,
) -> dict[str, FitResult]:
    """Train every job on shared batches until its val bits plateau, score test at its best epoch.

    Each job has its own AdamW optimiser and `ReduceLROnPlateau` schedule, both driven by
    its mean val bits: the learning rate drops by `lr_factor` after `lr_patience` epochs
    without a `min_delta` improvement, and the job stops after `patience` such epochs
    (patience > lr_patience, so a plateau is only declared after the lower rate had its chance).
    `inputs` maps "train", "val", "test" to row readers aligned with the jobs' targets.
    A job that raises is dropped and reported through `FitResult.error`; the others go on.
    `progress(1)` is called once per epoch; the loop ends before `config.epochs` once every
    job has stopped.
    """
    device = resolve_device(config.device)
    n_train = len(inputs["train"])
    config = replace(config, batch_size=config.batch_size or auto_batch_size(n_train))
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    mean, std = feature_stats(inputs["train"])
    results = {j.name: FitResult(j.name, n_bits=j.targets["train"].shape[1]) for j in jobs}
    states: dict[str, dict] = {}
    optims, schedules = {}, {}
    for j in jobs:
        j.model.set_standardization(mean, std)
        j.model.to(device)
        lr = config.lr if config.lr is not None else getattr(j.model, "lr", Probe.lr)
        decay = config.weight_decay if config.weight_decay is not None else getattr(j.model, "weight_decay",
                                                                                     Probe.weight_decay)
        optims[j.name] = torch.optim.AdamW(j.model.parameters(), lr=lr, weight_decay=decay)
        schedules[j.name] = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optims[j.name], mode="min", factor=config.lr_factor, patience=config.lr_patience,
            threshold=config.min_delta, threshold_mode="abs")
    active = {j.name: j for j in jobs}
    stale = {j.name: 0 for j in jobs}
    # Epoch 0 is the untrained probe: an anchored probe there codes exactly its prior, so a
    # representation that adds nothing selects it and reads exactly zero information.
    for name, scored in _score(jobs, inputs["val"], "val", device, config.batch_size).items():
        r = results[name]
        if isinstance(scored, Exception):
            _fail(r, scored, active, name)
            continue
        r.val_bits, r.best_epoch = float(scored[0].mean()), 0
        r.history.append((math.nan, r.val_bits))
        schedules[name].step(r.val_bits)
        states[name] = copy.deepcopy(active[name].model.state_dict())
    for epoch in range(1, config.epochs + 1):
        if not active:
            break
        train_sum = {name: 0.0 for name in active}
        for j in active.values():
            j.model.train()
        perm = rng.permutation(n_train)
        for start in range(0, n_train, config.batch_size):
            idx = np.sort(perm[start : start + config.batch_size])
            x = torch.from_numpy(inputs["train"].take(idx)).to(device)
            for name, j in list(active.items()):
                try:
                    loss = _batch_bits(j, "train", idx, x, device)[0].mean()
                    optims[name].zero_grad(set_to_none=True)
                    loss.backward()
                    optims[name].step()
                    train_sum[name] += loss.item() * len(idx)
                except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
                    _fail(results[name], e, active, name)
        val = _score(list(active.values()), inputs["val"], "val", device, config.batch_size)
        for name in list(active):
            r = results[name]
            if isinstance(val[name], Exception):
                _fail(r, val[name], active, name)
                continue
            v = float(val[name][0].mean())
            r.history.append((train_sum[name] / n_train, v))
            if not math.isfinite(v):
                _fail(r, FloatingPointError(f"validation loss is {v} at epoch {epoch}"), active, name)
                continue
            schedules[name].step(v)
            if v < r.val_bits - config.min_delta:
                r.val_bits, r.best_epoch, stale[name] = v, epoch, 0
                states[name] = copy.deepcopy(active[name].model.state_dict())
            else:
                stale[name] += 1
                if stale[name] >= config.patience:
                    del active[name]
        if progress:
            progress(1)
    finished = [j for j in jobs if results[j.name].error is None]
    for j in finished:
        r = results[j.name]
        r.converged = stale[j.name] >= config.patience and r.best_epoch <= 0.9 * config.epochs
        j.model.load_state_dict(states[j.name])
    for name, scored in _score(finished, inputs["test"], "test", device, config.batch_size).items():
        if isinstance(scored, Exception):
            _fail(results[name], scored, {}, name)
        else:
            results[name].scene_bits, results[name].bits_correct = scored
    return results


def _fail(result: FitResult, error: Exception, active: dict, name: str) -> None:
    result.error = f"{type(error).__name__}: {error}".splitlines()[0]
    result.converged = False
    active.pop(name, None)


def _batch_bits(job: ProbeJob, split: str, idx: np.ndarray, x: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits per scene, logits) of one job on a batch, teacher-forced."""
    target = torch.from_numpy(job.targets[split][idx]).to(device)
    cond = torch.from_numpy(job.cond[split][idx]).to(device).float() if job.cond is not None else None
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        residual = job.model(x, target, cond)
    prior = torch.from_numpy(job.prior[split][idx]).to(device) if job.prior is not None else None
    logits = anchor(residual.float(), prior)
    return scene_bits(logits, target), logits


@torch.no_grad()
def _score(jobs: Sequence[ProbeJob], reader: RowReader, split: str, device: str,
           batch: int) -> dict[str, tuple[np.ndarray, np.ndarray] | Exception]:
    """Per-scene bits and teacher-forced correct-bit counts of every job on a split, in order;
    a job that raises gets its exception instead, and the others go on."""
    for j in jobs:
        j.model.eval()
    bits: dict[str, list] = {j.name: [] for j in jobs}
    correct: dict[str, list] = {j.name: [] for j in jobs}
    failed: dict[str, Exception] = {}
    for idx, rows in reader.chunks(batch):
        x = torch.from_numpy(rows).to(device)
        for j in jobs:
            if j.name in failed:
                continue
            try:
                b, logits = _batch_bits(j, split, idx, x, device)
            except Exception as e:  # noqa: BLE001 — reported per job
                failed[j.name] = e
                continue
            target = j.targets[split][idx]
            bits[j.name].append(b.float().cpu().numpy())
            correct[j.name].append(((logits.float().cpu().numpy() > 0) == (target > 0)).sum(1))
    return {n: failed.get(n) or (np.concatenate(bits[n]), np.concatenate(correct[n])) for n in bits}
