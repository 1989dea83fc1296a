"""The gradient stage of many row sets as one: the same job of every row set of a stack (the same
family and target, read from another layer or view) trained as one module with stacked
parameters (`torch.func.vmap` over `functional_call`), one AdamW step for all of them.

On a GPU every step of a probe is a train of small kernels whatever its rows: stepped row set by
row set, the 26 row sets of dinov2-small kept an H200 a third busy. Stacked, a step launches the
kernels of one probe for all of them. A row set's numbers do not depend on its batch-mates: every
one has its own parameters, moments, learning rate, plateau and stop, and the batches are the
same for all (one seed); on one thread a row set stacked with three others equals its fit alone to
the last bit (tests/test_stacking.py).

Where the stage runs stacked: on CUDA (`STACKED_DEVICES`), every family (the attention probe's
moving average of weights stacked too; its encoder hands no product on there, `TokenEncoder`). On
a CPU a stacked step costs what the row sets' steps cost one after another, and vmap's own
overhead made one row set's step two to three times slower (quadratic and dnn, 31 rows of 384
inputs; four stacked row sets' gradient stage took 87 s, the same four one after another 72 s)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, Sequence

import numpy as np
import torch
from torch.func import functional_call, vmap

from evaluators.early_stopping import WeightAverage
from evaluators.fitting.data import FitResult, ProbeJob, RowReader, TrainConfig, stack_budget
from evaluators.fitting.gradient import _Course, _gradient_stage, _optim_settings, _trained
from evaluators.fitting.scoring import HeldCodes, _codes, _fail, _score_sets
from evaluators.probes import anchor, scene_bits
from evaluators.token_encoder import TokenEncoder

#: The devices whose gradient stage steps a stack's row sets as one (`trains_stacked`).
STACKED_DEVICES = ("cuda",)

#: AdamW's defaults (`torch.optim.AdamW`), which the stacked step applies with a learning rate per row set.
_BETAS, _EPS = (0.9, 0.999), 1e-8


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
            _gradient_stage(jobs, inputs[i], config, device, results[i], active[i], progress)
        return
    groups: dict[tuple, list[tuple[int, ProbeJob]]] = {}
    for i, jobs in enumerate(jobs_per_set):
        for j in jobs:
            groups.setdefault(_signature(j, config), []).append((i, j))
    if groups:
        failed = _stacked_stage(list(groups.values()), inputs, config, device, results, active, progress)
        for i, jobs in enumerate(failed):  # a stack whose step raised: its jobs again, alone
            torch.manual_seed(config.seed)
            _gradient_stage(jobs, inputs[i], config, device, results[i], active[i], progress)


def _signature(job: ProbeJob, config: TrainConfig) -> tuple:
    """What jobs must share to be stacked: name, every tensor's name and shape, what is frozen, the
    weight decay and the moving average (the learning rate may differ: it is one per row set)."""
    model = job.model
    return (job.name, _optim_settings(job, config)[1:], frozenset(getattr(model, "frozen_names", ())),
            tuple((n, tuple(p.shape)) for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()))


class _Stack:
    """The same job of several row sets as one: each tensor of the module stacked along a first
    dimension (one entry per row set), AdamW's moments with them, and each row set's course."""

    def __init__(self, members: list[tuple[int, ProbeJob]], results: Sequence[dict[str, FitResult]],
                 config: TrainConfig) -> None:
        self.sets = [i for i, _ in members]
        self.jobs = [j for _, j in members]
        self.template = self.jobs[0].model
        first = {id(p) for p in _trained(self.jobs[0])}
        for j in self.jobs[1:]:
            _trained(j)
        self.trained = [n for n, p in self.template.named_parameters() if id(p) in first]
        self.courses: list[_Course] = []
        for i, j in members:
            lr, self.decay, self.ema = _optim_settings(j, config)
            self.courses.append(_Course(j, results[i][j.name], lr, config))
            results[i][j.name].setting.update(lr=lr, weight_decay=self.decay, ema=self.ema)
        self.params = {n: torch.stack([j.model.get_parameter(n).detach() for j in self.jobs])
                       for n, _ in self.template.named_parameters()}
        self.buffers = {n: torch.stack([j.model.get_buffer(n) for j in self.jobs])
                        for n, _ in self.template.named_buffers()}
        for n in self.trained:
            self.params[n].requires_grad_(True)
        self.moments = {n: (torch.zeros_like(self.params[n]), torch.zeros_like(self.params[n])) for n in self.trained}
        self.average = WeightAverage([self.params[n] for n in self.trained], self.ema) if self.ema else None
        self.steps = 0
        self.train_sum = torch.zeros(len(self.jobs), device=self.params[self.trained[0]].device)
        self.rates = self.learning_rates()

    def learning_rates(self) -> torch.Tensor:
        """Each row set's learning rate, on the device (its schedule changes it only between epochs)."""
        return torch.tensor([c.lr for c in self.courses], device=self.train_sum.device)

    def losses(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None,
               prior: torch.Tensor | None, device: str) -> torch.Tensor:
        """Each row set's mean bits on its batch (x: row sets x batch x ...), teacher-forced."""
        def one(params: dict, buffers: dict, rows: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                residual = functional_call(self.template, (params, buffers), (rows, target, cond))
            return scene_bits(anchor(residual.float(), prior), target).mean()

        with TokenEncoder.uncached():
            return vmap(one)(self.params, self.buffers, x)

    @torch.no_grad()
    def step(self, lr: torch.Tensor) -> None:
        """One AdamW step of every row set's parameters (as `torch.optim.AdamW` steps one probe's,
        with `lr` per row set: torch's takes one rate per parameter group, and a stack is one tensor)."""
        self.steps += 1
        (b1, b2), t = _BETAS, self.steps
        for n in self.trained:
            p, (m, v) = self.params[n], self.moments[n]
            g, p.grad = p.grad, None
            rate = lr.view(-1, *[1] * (p.dim() - 1))
            p.mul_(1 - rate * self.decay)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(_EPS)
            p.sub_(rate / (1 - b1 ** t) * m / denom)
        if self.average is not None:
            self.average.update()

    @torch.no_grad()
    def write_back(self) -> None:
        """Each row set's slice into its own module, to be scored and kept as a job trained alone is:
        the averaged weights where the job keeps an average (training goes on from the raw ones)."""
        with self.average.swapped_in() if self.average is not None else nullcontext():
            for k, j in enumerate(self.jobs):
                for n in self.trained:
                    j.model.get_parameter(n).copy_(self.params[n][k])

    def keep(self, kept: list[int]) -> None:
        """Go on with the row sets at positions `kept` only (the others stopped or failed)."""
        index = torch.tensor(kept, dtype=torch.long, device=self.train_sum.device)
        self.sets = [self.sets[k] for k in kept]
        self.jobs = [self.jobs[k] for k in kept]
        self.courses = [self.courses[k] for k in kept]
        self.params = {n: t[index].detach().requires_grad_(n in self.trained) for n, t in self.params.items()}
        self.buffers = {n: t[index] for n, t in self.buffers.items()}
        self.moments = {n: (m[index], v[index]) for n, (m, v) in self.moments.items()}
        self.train_sum = self.train_sum[index]
        if self.average is not None:
            self.average.select([self.params[n] for n in self.trained], index)


def _stacked_stage(groups: list[list[tuple[int, ProbeJob]]], inputs: Sequence[dict[str, RowReader]],
                   config: TrainConfig, device: str, results: Sequence[dict[str, FitResult]],
                   active: Sequence[dict[str, ProbeJob]], progress: Callable[[int], None] | None
                   ) -> list[list[ProbeJob]]:
    """Train each group (one job of several row sets) as a `_Stack`; returns, per row set, the jobs
    of stacks whose step raised, reset to where the stage started, to be trained alone."""
    n_train = len(inputs[0]["train"])
    rng = np.random.default_rng(config.seed)
    stacks = [_Stack(members, results, config) for members in groups]
    courses = [c for s in stacks for c in s.courses]
    starts = {id(j): {n: t.detach().clone() for n, t in j.model.state_dict().items()} for s in stacks for j in s.jobs}
    failed: list[list[ProbeJob]] = [[] for _ in inputs]
    stacks = _validate(stacks, inputs, config, device, active, 0, n_train)
    rows, held = _held_rows(stacks, inputs, device, config)
    for epoch in range(1, config.epochs + 1):
        if not stacks:
            break
        for s in stacks:
            s.train_sum.zero_()
        perm = rng.permutation(n_train)
        for start in range(0, n_train, config.batch_size):
            idx = np.sort(perm[start : start + config.batch_size])
            index = torch.from_numpy(idx).to(device, non_blocking=True) if rows is not None else idx
            x = {i: rows[i][index] if rows is not None else torch.from_numpy(inputs[i]["train"].take(idx)).to(device)
                 for i in sorted({i for s in stacks for i in s.sets})}
            batches: dict[tuple[int, ...], torch.Tensor] = {}  # most stacks hold the same row sets: stacked once
            for s in list(stacks):
                try:
                    target, cond, prior = _codes(s.jobs[0], "train", index, device, held)
                    sets = tuple(s.sets)
                    if sets not in batches:
                        batches[sets] = torch.stack([x[i] for i in sets])
                    losses = s.losses(batches[sets], target, cond, prior, device)
                    losses.sum().backward()
                    s.step(s.rates)
                    s.train_sum += losses.detach() * len(idx)
                except Exception:  # noqa: BLE001 — its row sets are fitted alone instead
                    stacks.remove(s)
                    for i, j in zip(s.sets, s.jobs):
                        j.model.load_state_dict(starts[id(j)])
                        failed[i].append(j)
        n_sets = len({i for s in stacks for i in s.sets})
        stacks = _validate(stacks, inputs, config, device, active, epoch, n_train)
        if progress:
            progress(n_sets)
    again = {id(j) for jobs in failed for j in jobs}
    for c in courses:
        if id(c.job) not in again:
            c.conclude()
    return failed


def _validate(stacks: list[_Stack], inputs: Sequence[dict[str, RowReader]], config: TrainConfig, device: str,
              active: Sequence[dict[str, ProbeJob]], epoch: int, n_train: int) -> list[_Stack]:
    """Score every stacked job on its row set's validation split and count the epoch in its course
    (epoch 0: the stage's start); a job that stops or fails leaves its stack, and a stack with
    none left is dropped."""
    if epoch:  # every stack's training bits in one read
        sums = torch.cat([s.train_sum for s in stacks]).tolist() if stacks else []
        ends = np.cumsum([0] + [len(s.jobs) for s in stacks])
        train = [sums[a:b] for a, b in zip(ends[:-1], ends[1:])]
    going: list[list[int]] = [[] for _ in stacks]
    for s in stacks:
        s.write_back()
    mine = [[(a, k) for a, s in enumerate(stacks) for k, r in enumerate(s.sets) if r == i] for i in range(len(inputs))]
    scored = _score_sets([([stacks[a].jobs[k] for a, k in ours], reader["val"]) for ours, reader in zip(mine, inputs)],
                         "val", device, config.batch_size)
    for i, ours in enumerate(mine):
        for a, k in ours:
            course = stacks[a].courses[k]
            val = scored[i][course.job.name]
            if isinstance(val, Exception):
                outcome: Exception | bool = val
            elif epoch == 0:
                course.start(val[0])
                outcome = True
            else:
                outcome = course.epoch(epoch, train[a][k] / n_train, val[0])
            if isinstance(outcome, Exception):
                _fail(course.result, outcome, active[i], course.job.name)
            if outcome is True:
                going[a].append(k)
    for s, kept in zip(stacks, going):
        if len(kept) < len(s.jobs):
            s.keep(kept)
        s.rates = s.learning_rates()
    return [s for s in stacks if s.jobs]


def _held_rows(stacks: list[_Stack], inputs: Sequence[dict[str, RowReader]], device: str, config: TrainConfig
               ) -> tuple[dict[int, torch.Tensor] | None, HeldCodes | None]:
    """On CUDA, every row set's training rows (where all of them fit the stack's memory budget) and
    the stacked jobs' codes, on the device for the whole stage (`gradient._held_on_device`)."""
    if not device.startswith("cuda"):
        return None, None
    sets = sorted({i for s in stacks for i in s.sets})
    size = sum(len(inputs[i]["train"]) * inputs[i]["train"].float_row_bytes for i in sets)
    held = HeldCodes([s.jobs[0] for s in stacks], "train", device)
    if size > stack_budget(config, device):
        return None, held
    return {i: torch.from_numpy(inputs[i]["train"].take(np.arange(len(inputs[i]["train"])))).to(device)
            for i in sets}, held
