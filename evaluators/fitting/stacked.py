"""The gradient stage of many row sets as one: the same job of every row set of a stack (the same
family and target, read from another layer or view) trained as one module with stacked
parameters (`torch.func.vmap` over `functional_call`), one AdamW step for all of them.

On a GPU every step of a probe is a train of small kernels whatever its rows: stepped row set by
row set, the 26 row sets of dinov2-small kept an H200 a third busy. Stacked, a step launches the
kernels of one probe for all of them. A row set's numbers do not depend on its batch-mates: every
one has its own parameters, moments, learning rate, plateau and stop, and the batches are the
same for all (one seed); on one thread a row set stacked with three others equals its fit alone to
the last bit (tests/test_stacking.py).

On CUDA a stack's step is also captured as a CUDA graph and replayed, and each stack steps on
a CUDA stream of its own (`evaluators.fitting.stack` says what that saves).

Where the stage runs stacked: on CUDA (`STACKED_DEVICES`), every family (the attention probe's
moving average of weights stacked too; its encoder hands no product on there, `TokenEncoder`). On
a CPU a stacked step costs what the row sets' steps cost one after another, and vmap's own
overhead made one row set's step two to three times slower (quadratic and dnn, 31 rows of 384
inputs; four stacked row sets' gradient stage took 87 s, the same four one after another 72 s).

The parts: `stack` (a `Stack`: the stacked module, its AdamW step and its CUDA graphs),
`stack_scoring` (every stack's bits on a split, chunk by chunk, in one transfer) and here the stage
itself: which jobs stack together, the epochs, validation and stopping, and the rows held on the
device for the stage."""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import numpy as np
import torch

from evaluators.fitting.cuda_graphs import SideStreams
from evaluators.fitting.data import (FitResult, ProbeJob, RowReader, TrainConfig, held_bytes, stack_budget, stage_label,
                                     to_device)
from evaluators.fitting.gradient import gradient_stage, load_states, optim_settings
from evaluators.fitting.scoring import HeldCodes, HeldSplit, job_codes, record_failure, score_row_sets
from evaluators.fitting.stack import Stack
from evaluators.fitting.stack_scoring import job_shapes, score_stacks, stack_bits

#: The devices whose gradient stage steps a stack's row sets as one (`trains_stacked`).
STACKED_DEVICES = ("cuda",)

#: The devices whose stacks keep a stopped row set at a learning rate of 0 and run their step as a
#: CUDA graph (`StepGraphs`; elsewhere than on CUDA the step stays eager, which tests use).
GRAPHED_DEVICES = ("cuda",)

#: The devices on which each stack steps on a stream of its own (`SideStreams`), so that the
#: steps of a stage's stacks run at once (the numbers are those of one stream).
CONCURRENT_DEVICES = ("cuda",)


def trains_stacked(device: str) -> bool:
    """Whether jobs train stacked with the same job of their stack's other row sets on `device`."""
    return device.split(":")[0] in STACKED_DEVICES


def gradient_stages(jobs_per_set: Sequence[Sequence[ProbeJob]], inputs: Sequence[dict[str, RowReader]],
                    config: TrainConfig, device: str, results: Sequence[dict[str, FitResult]],
                    active: Sequence[dict[str, ProbeJob]], progress: Callable[[int], None] | None) -> None:
    """The gradient stage of every row set of a stack: on a device that trains them stacked
    (`trains_stacked`) the same job of every row set as one, else row set by row set from the
    same seed."""
    if not trains_stacked(device):
        for i, jobs in enumerate(jobs_per_set):
            torch.manual_seed(config.seed)
            gradient_stage(jobs, inputs[i], config, device, results[i], active[i], progress)
        return
    groups: dict[tuple, list[tuple[int, ProbeJob]]] = {}
    for i, jobs in enumerate(jobs_per_set):
        for j in jobs:
            groups.setdefault(_signature(j, config), []).append((i, j))
    if groups:
        failed = _stacked_stage(list(groups.values()), inputs, config, device, results, active, progress)
        for i, jobs in enumerate(failed):  # a stack whose step raised: its jobs again, alone
            torch.manual_seed(config.seed)
            gradient_stage(jobs, inputs[i], config, device, results[i], active[i], progress)


def _signature(job: ProbeJob, config: TrainConfig) -> tuple:
    """What jobs must share to be stacked: what they must share to be scored as one (`job_shapes`),
    what is frozen, the weight decay and the moving average (the learning rate may differ: it is
    one per row set)."""
    return (job_shapes(job), optim_settings(job, config)[1:], frozenset(getattr(job.model, "frozen_names", ())))


@torch.no_grad()
def score_sets(sets: Sequence[tuple[Sequence[ProbeJob], RowReader]], split: str, device: str,
               batch: int) -> list[dict[str, tuple[np.ndarray, np.ndarray] | Exception]]:
    """`score_row_sets` (per row set, each job's bits per scene and correct bits on a split), with the
    same job of every row set scored as one vmap'd forward where the device trains stacked
    (`trains_stacked`): scored job by job, 26 row sets' 15 probes launched ~35,000 small kernels a
    split (1.1 s of a 22 s fit on an H200). A stack whose forward raises is scored job by job, so
    that only the jobs that fail alone fail."""
    if not trains_stacked(device):
        return score_row_sets(sets, split, device, batch)
    groups: dict[tuple, list[tuple[int, ProbeJob]]] = {}
    for i, (jobs, reader) in enumerate(sets):
        for j in jobs:
            j.model.eval()
            groups.setdefault((job_shapes(j), reader.row_shape), []).append((i, j))
    stacks = list(groups.values())  # a job of one row set too: vmap'd, its numbers are those it gets in a stack
    alone: list[list[ProbeJob]] = [[] for _ in sets]
    scored = score_stacks(stacks, [reader for _, reader in sets], split, device, batch)
    for members, got in zip(stacks, scored):
        if isinstance(got, Exception):
            for i, j in members:
                alone[i].append(j)
    singly = score_row_sets([(mine, reader) for mine, (_, reader) in zip(alone, sets)], split, device, batch)
    out: list[dict[str, tuple[np.ndarray, np.ndarray] | Exception]] = [{} for _ in sets]
    for members, got in zip(stacks, scored):
        if not isinstance(got, Exception):
            bits, correct = got
            for k, (i, j) in enumerate(members):
                out[i][j.name] = (bits[k].copy(), correct[k].astype(np.int64))
    return [{j.name: mine.get(j.name, single.get(j.name)) for j in jobs}
            for (jobs, _), mine, single in zip(sets, out, singly)]


def _stacked_stage(groups: list[list[tuple[int, ProbeJob]]], inputs: Sequence[dict[str, RowReader]],
                   config: TrainConfig, device: str, results: Sequence[dict[str, FitResult]],
                   active: Sequence[dict[str, ProbeJob]], progress: Callable[[int], None] | None
                   ) -> list[list[ProbeJob]]:
    """Train each group (one job of several row sets) as a `Stack`; returns, per row set, the jobs
    of stacks whose step raised, reset to where the stage started, to be trained alone."""
    n_train = len(inputs[0]["train"])
    rng = np.random.default_rng(config.seed)
    graphed = device.split(":")[0] in GRAPHED_DEVICES
    stacks = [Stack(members, results, config, graphed) for members in groups]
    streams = SideStreams(len(stacks) if device.split(":")[0] in CONCURRENT_DEVICES else 0, device)
    lane = {id(s): k for k, s in enumerate(stacks)}
    courses = [c for s in stacks for c in s.courses]
    starts = {id(j): state for s in stacks for j, state in zip(s.jobs, s.starting_states())}
    failed: list[list[ProbeJob]] = [[] for _ in inputs]
    rows, held, val = _held_rows(stacks, inputs, device, config)
    chunks: dict[tuple[int, ...], list] = {}  # the held validation split's chunks, stacked once for the stage
    stacks = validate_stacks(stacks, val, config, device, active, 0, n_train, starts, chunks)
    for epoch in range(1, config.epochs + 1):
        if not stacks:
            break
        for s in stacks:
            s.train_sum.zero_()
        perm = rng.permutation(n_train)
        batches = [np.sort(perm[start : start + config.batch_size]) for start in range(0, n_train, config.batch_size)]
        # the epoch's batches in one copy to the device: each copy from the host waits for a GPU
        on_device = to_device(np.concatenate(batches), device).split([len(b) for b in batches]) \
            if rows is not None else batches
        for idx, index in zip(batches, on_device):
            x = None if rows is not None else {i: torch.from_numpy(inputs[i]["train"].take(idx)).to(device)
                                               for i in sorted({i for s in stacks for i in s.sets})}
            stacked: dict[tuple[int, ...], torch.Tensor] = {}  # most stacks hold the same row sets: stacked once
            for s in list(stacks):
                try:
                    sets = tuple(s.sets)
                    if sets not in stacked:
                        stacked[sets] = rows.batch(sets, index) if rows is not None else \
                            torch.stack([x[i] for i in sets])
                    with streams.lane(lane[id(s)], stacked[sets], index):
                        target, cond, prior = job_codes(s.jobs[0], "train", index, device, held)
                        s.train(stacked[sets], target, cond, prior, device)
                except Exception:  # noqa: BLE001 — its row sets are fitted alone instead
                    streams.join()
                    stacks.remove(s)
                    for k in s.live:
                        s.jobs[k].model.load_state_dict(starts[id(s.jobs[k])])
                        failed[s.sets[k]].append(s.jobs[k])
        n_sets = len({s.sets[k] for s in stacks for k in s.live})
        streams.join()
        stacks = validate_stacks(stacks, val, config, device, active, epoch, n_train, chunks=chunks)
        if progress:
            progress(n_sets)
    again = {id(j) for jobs in failed for j in jobs}
    concluding = [c for c in courses if id(c.job) not in again]
    load_states([(c.job.model, c.state) for c in concluding if c.result.error is None])
    for c in concluding:
        c.conclude(load=False)
    return failed


@stage_label("validation")
def validate_stacks(stacks: list[Stack], val: Sequence[RowReader | HeldSplit], config: TrainConfig, device: str,
              active: Sequence[dict[str, ProbeJob]], epoch: int, n_train: int,
              starts: dict[int, dict[str, torch.Tensor]] | None = None,
              chunks: dict[tuple[int, ...], list] | None = None) -> list[Stack]:
    """Score every stacked job on its row set's validation split (`val`, per row set) and count the
    epoch in its course (epoch 0: the stage's start, each job's weights there in `starts`, by id);
    a job that stops or fails leaves its stack, and a stack with none left is dropped. `chunks`:
    the stage's held validation chunks (`stack_bits`)."""
    # every stack's training bits in the validation bits' read (each read waits for the device)
    sums = [torch.cat([s.train_sum for s in stacks])] if epoch and stacks else []
    scored = stack_bits(stacks, val, config.batch_size, device, chunks, sums)
    if epoch and stacks:
        totals = scored[-1].tolist()
        ends = np.cumsum([0] + [len(s.jobs) for s in stacks])
        train = [totals[a:b] for a, b in zip(ends[:-1], ends[1:])]
    going: list[list[int]] = [[] for _ in stacks]
    for a, (s, bits) in enumerate(zip(stacks, scored)):
        for k in s.live:
            course = s.courses[k]
            if isinstance(bits, Exception):
                outcome: Exception | bool = bits
            elif epoch == 0:
                course.start(bits[k], starts[id(course.job)] if starts else None)
                outcome = True
            else:
                outcome = course.epoch(epoch, train[a][k] / n_train, bits[k], kept=partial(s.state_of, k))
            if isinstance(outcome, Exception):
                record_failure(course.result, outcome, active[s.sets[k]], course.job.name)
            if outcome is True:
                going[a].append(k)
        s.store_best()
    for s, kept in zip(stacks, going):
        if len(kept) < len(s.live):
            s.keep(kept)
        s.refresh_rates()
    return [s for s in stacks if s.live]


class _TrainRows:
    """The stacked row sets' training rows on the device for a stage, in one tensor (row sets x N x ...)
    where their rows have one shape: a stack's batch is then one gather, where a gather per row set
    and a stack of them were 27 kernels a batch for 26 row sets (the same rows either way)."""

    def __init__(self, arrays: dict[int, np.ndarray], device: str) -> None:
        self.position = {i: k for k, i in enumerate(arrays)}
        shapes = {a.shape for a in arrays.values()}
        self.block = torch.from_numpy(np.stack(list(arrays.values()))).to(device) if len(shapes) == 1 else None
        self.each = None if self.block is not None else {i: torch.from_numpy(a).to(device) for i, a in arrays.items()}
        self.picks: dict[tuple[int, ...], torch.Tensor] = {}  # per subset of the row sets, their positions

    def batch(self, sets: tuple[int, ...], index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of row sets `sets` (len(sets) x len(index) x ...), as float32 (held as stored,
        float16: half the bytes, upcast exactly here, batch by batch)."""
        if self.block is None:
            return torch.stack([self.each[i][index] for i in sets]).float()
        positions = [self.position[i] for i in sets]
        if positions == list(range(len(self.position))):
            return self.block[:, index].float()
        if sets not in self.picks:
            self.picks[sets] = to_device(torch.tensor(positions), self.block.device)
        return self.block[self.picks[sets][:, None], index[None, :]].float()


def _held_rows(stacks: list[Stack], inputs: Sequence[dict[str, RowReader]], device: str, config: TrainConfig
               ) -> tuple[_TrainRows | None, HeldCodes | None, list[RowReader | HeldSplit]]:
    """Every row set's training rows and validation split (`HeldSplit`, both as stored: float16; where
    all of them fit the stack's memory budget on the device, the validation split counted again as
    float32 as `stack_bits` stacks it once more, and the training rows the fit's on the host,
    `held_bytes`; else validation reads its readers) and the stacked jobs' training codes, on the device for the
    whole stage (`gradient._held_on_device`)."""
    readers = [one["val"] for one in inputs]
    sets = sorted({i for s in stacks for i in s.sets})
    train = sum(len(inputs[i]["train"]) * inputs[i]["train"].row_bytes for i in sets)
    size = train + sum(len(inputs[i]["val"]) * inputs[i]["val"].read_row_bytes for i in sets)
    jobs = [s.jobs[0] for s in stacks]
    held = HeldCodes(jobs, "train", device)
    # on the host the training rows are read, then stacked (twice their bytes), before they move
    if size > stack_budget(config, device) or 2 * train > held_bytes(config):
        return None, held, readers
    rows = _TrainRows({i: inputs[i]["train"].read_all(dtype=None) for i in sets}, device)
    codes = HeldCodes(jobs, "val", device)
    val = [HeldSplit(reader, codes) if i in sets else reader for i, reader in enumerate(readers)]
    return rows, held, val
