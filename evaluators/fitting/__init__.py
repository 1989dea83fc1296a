"""Fitting probes on cached activations: one pass over the data trains many probes.

Activations live on disk (float16 memmaps, docs/ARCHITECTURE.md §2). Batches are read with
positioned reads instead of through the memory map, so resident memory stays at a
few batches whatever the dataset size (pages touched through a map count as RSS).
Every batch read is shared by all probes of a (backbone, layer, view): the F-, O|F- and
paper probes of every family step on it in turn.

How a probe is fitted (`fit_probes` has the details): its linear part by full-batch L-BFGS
along an L2 and then a short L1 path, the strength chosen on validation (a convex fit has no
learning rate to get wrong); the quadratic families' directions from class-conditional moments
(`class_directions`); whatever else a family has (and the bias) by AdamW on shared batches, the
rest of the linear part frozen, until the mean validation bits plateau (`ReduceLROnPlateau`, the family's patience; 200
epochs is only a backstop); and a guard that keeps a fit only when it beats the exact prior on
validation by about two standard errors. The chosen settings go into each `FitResult`, and the
test split is scored once, with the chosen weights. Mixed precision (bf16 autocast) on CUDA
only, for the families that take it (`ProbeFamily.amp`: not attention); CPU runs in fp32 (this
machine has no bf16 matrix units).
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import torch

from evaluators.fitting.data import (STAGE_PREFIX, FitResult, ProbeJob, RowReader, TrainConfig, auto_batch_size,
                                     bounded_row_sets, feature_stats, held_bytes, memory_budget, modules_to_device,
                                     row_set_bytes, row_sets_per_stack, stack_budget, stacks_row_sets, stage_label)
from evaluators.probes.training import resolve_device
from evaluators.fitting.gradient import has_linear, has_nonlinear, warm_start_from
from evaluators.fitting.linear import linear_stage
from evaluators.fitting.moments import moment_stage, class_directions
from evaluators.fitting.scoring import record_failure, guard_against_prior, saving_and_se
from evaluators.fitting.stacked import gradient_stages, score_sets, trains_stacked
from evaluators.probes.families import ProbeOptim
from evaluators.runner.threads import torch_threads

__all__ = ["FitResult", "ProbeJob", "RowReader", "TrainConfig", "auto_batch_size", "class_directions", "feature_stats",
           "fit_probes", "fit_row_sets", "resolve_device", "row_set_bytes", "row_sets_per_stack", "saving_and_se",
           "stacks_row_sets", "stage_label", "STAGE_PREFIX", "warm_start_from"]


def fit_probes(
    jobs: Sequence[ProbeJob],
    inputs: dict[str, RowReader],
    config: TrainConfig = TrainConfig(),
    progress: Callable[[int], None] | None = None,
    groups: np.ndarray | None = None,
) -> dict[str, FitResult]:
    """Fit the jobs of one row set: `fit_row_sets` with a stack of one."""
    return fit_row_sets([(jobs, inputs)], config, progress, groups)[0]


def fit_row_sets(
    row_sets: Sequence[tuple[Sequence[ProbeJob], dict[str, RowReader]]],
    config: TrainConfig = TrainConfig(),
    progress: Callable[[int], None] | None = None,
    groups: np.ndarray | None = None,
) -> list[dict[str, FitResult]]:
    """Fit every job of every row set in stages, guard it against its prior, and score test once.

    A row set is the jobs that read one input (a backbone's layer and tokens choice) and its
    train/val/test row readers. The row sets of one call share their targets (one dataset, one
    task); their linear stages are solved as one batched problem (the row set a batch dimension,
    `evaluators.fitting.linear_solver`), and so are their moment stages' eigen-solves; on CUDA the same
    job of every row set trains as one module in the gradient stage (`evaluators.fitting.stacked`),
    on a CPU the gradient stage runs row set by row set. A row set's numbers never depend on its
    batch-mates: every (row set, bit) problem has its own step, memory and stopping, every stacked
    job its own rate, plateau and stop, and every row set's batches come from the same seed. Each
    split's scores of all row sets come back to the host in one transfer.

    1. Linear stage (probes with a linear part, `Probe.linear_names`): the linear part is
       fitted by full-batch L-BFGS for every L2 strength of `config.l2_path`, strongest
       first, each warm-started from the last, then for each ratio of `config.l2_refine` the two
       strengths that far either side of each target's best so far, and the strength with the lowest mean
       validation bits is kept; then a short smoothed-L1 path (`config.l1_path`) from the
       best of them, for bindings that a few inputs carry. A convex fit has no learning
       rate or epoch count to get wrong: Adam at a fixed rate recovered 16 % of a planted
       linear teacher's bits where the tuned path recovers 40 % (1024-d, 2,000 scenes).
       Jobs sharing a `linear_key` share one path.
    1b. Moment stage (quadratic families): their directions start from class-conditional
       moments (`class_directions`, differences of class covariances as in SAVE, only those
       that both halves of the training rows agree on); from random directions the quadratic
       family recovered 0 % of a planted quadratic teacher at 2,000 scenes.
    2. Gradient stage (probes with parameters beyond the linear part): those parameters and
       the bias are trained with AdamW on shared batches, the rest of the linear part frozen
       at its chosen solution, until the mean validation bits plateau (`ReduceLROnPlateau` drops the
       rate by `lr_factor` after `lr_patience` epochs without a `min_delta` improvement,
       the job stops after `patience` such epochs: the config's, else its family's,
       `ProbeFamily.patience`); epoch 0 is the stage's start, so the
       family never ends worse on validation than the linear probe. A row set's jobs step
       together: one backward pass and one AdamW step per batch. Jobs with `warm_start`
       train in a second round, starting from the encoder of the job they name.
    3. Guard (anchored jobs, `prior` given): the chosen probe replaces the exact prior only
       when its mean validation saving over the prior exceeds `config.guard_se` standard
       errors of that mean, resampling whole `groups` (one label per validation scene,
       the F codes; None: scenes). A representation that adds nothing then reads exactly
       0 rather than a noise-fitted ±: on oracle:features a validation-selected fit read
       β* −0.014 without it.

    A job that raises is dropped and reported through `FitResult.error`; the others go on, in
    its row set and in the others. `progress(n)` is called once per gradient epoch with the number of
    row sets that trained in it.

    On a CPU every stage runs on one torch thread, whatever the caller set: torch splits a reduction
    of more than ~32,000 numbers (a full-batch loss, an L-BFGS dot product, a validation score)
    between its threads, so its rounding, and through the strength and epoch that validation picks
    a row set's numbers, depended on the thread count (dinov2-small at 300 training scenes: the
    paper columns up to 5e-6 apart between one thread and two, the sensitivity 5e-4). The same config and
    seed give the same bytes on any thread count. Two threads fitted a row set 1.3-1.5x faster on 2
    cores; a machine's cores fit a backbone's row sets side by side instead, a one-thread process
    each (`evaluators.tasks.binding.workers`; `--executor ray`: a one-thread task each).
    """
    device = resolve_device(config.device)
    with torch_threads(1) if device == "cpu" else nullcontext():
        return _fit_stages(row_sets, config, progress, groups, device)


def _fit_stages(row_sets: Sequence[tuple[Sequence[ProbeJob], dict[str, RowReader]]], config: TrainConfig,
                progress: Callable[[int], None] | None, groups: np.ndarray | None,
                device: str) -> list[dict[str, FitResult]]:
    """`fit_row_sets`'s stages, on `device`."""
    n_train = len(row_sets[0][1]["train"])
    # one batch size for the shared batches: the device's only where every family takes it, else as
    # many steps an epoch as the family that asks for most
    every = [j for jobs, _ in row_sets for j in jobs]
    sized_for = device if all(j.optim.device_batches for j in every) else "cpu"
    steps = max((j.optim.cpu_steps for j in every), default=ProbeOptim.cpu_steps)
    config = replace(config, batch_size=config.batch_size or auto_batch_size(n_train, sized_for, steps),
                     memory_budget=memory_budget(config))  # resolved once: MemAvailable moves
    row_sets = bounded_row_sets(row_sets, config, trains_stacked(device))
    if trains_stacked(device):
        row_sets = _read_once(row_sets, min(stack_budget(config, "cpu"), held_bytes(config)))
    with stage_label("start"):
        states = [_RowSet(jobs, inputs, device) for jobs, inputs in row_sets]
        for one, scored in zip(states, score_sets([(one.jobs, one.inputs["val"]) for one in states], "val", device,
                                                   config.batch_size)):
            one.start(scored)
    with stage_label("linear"):
        linear_stage([[j for j in one.active.values() if has_linear(j)] for one in states],
                     [one.inputs for one in states], config, device, [one.results for one in states],
                     [one.active for one in states])
    with stage_label("moments"):
        moment_stage([[j for j in one.active.values() if hasattr(j.model, "init_from_moments")] for one in states],
                     [one.inputs["train"] for one in states], device, [one.results for one in states],
                     [one.active for one in states], stack_budget(config, device))
    with stage_label("gradient"):
        gradient_rounds(states, config, device, progress)
    with stage_label("guard"):
        finished = [one.guard(config, groups) for one in states]
    with stage_label("test"):
        for one, jobs, scored in zip(states, finished, score_sets([(jobs, one.inputs["test"]) for one, jobs
                                                                   in zip(states, finished)], "test", device,
                                                                  config.batch_size)):
            one.finish(scored)
    return [one.results for one in states]


def gradient_rounds(states: Sequence["_RowSet"], config: TrainConfig, device: str,
                    progress: Callable[[int], None] | None) -> None:
    """The gradient stage of every row set, in two rounds: the jobs that start on their own, then
    those warm-started from a job of the first (`ProbeJob.warm_start`)."""
    first = [[j for j in one.active.values() if has_nonlinear(j) and j.warm_start not in one.active]
             for one in states]
    _gradient_of(states, first, config, device, progress)
    later = []
    for one, done in zip(states, first):
        later.append([j for j in one.active.values() if has_nonlinear(j) and all(j is not f for f in done)])
        for j in later[-1]:
            if j.warm_start in one.active:  # else its source failed: it starts from its own weights
                warm_start_from(j.model, one.active[j.warm_start].model)
    _gradient_of(states, later, config, device, progress)


def _gradient_of(states: Sequence["_RowSet"], jobs: list[list[ProbeJob]], config: TrainConfig, device: str,
                 progress: Callable[[int], None] | None) -> None:
    """One round of the gradient stage over the row sets of a stack (`stacked.gradient_stages`)."""
    gradient_stages(jobs, [one.inputs for one in states], config, device, [one.results for one in states],
                    [one.active for one in states], progress)


class _RowSet:
    """One row set's jobs through the stages: what `fit_row_sets` does before and after the
    linear and moment stages the stack shares."""

    def __init__(self, jobs: Sequence[ProbeJob], inputs: dict[str, RowReader], device: str) -> None:
        self.jobs, self.inputs = jobs, inputs
        mean, std = feature_stats(inputs["train"])
        self.results = {j.name: FitResult(j.name, n_bits=j.targets["train"].shape[1]) for j in jobs}
        self.active = {j.name: j for j in jobs}
        for j in jobs:
            j.model.set_standardization(mean, std)
        modules_to_device([j.model for j in jobs], device)
        anchored = [j for j in jobs if j.prior is not None]
        self.prior_states = dict(zip((j.name for j in anchored), _copied_states([j.model for j in anchored])))
        self.prior_val: dict[str, np.ndarray] = {}

    def start(self, val: dict[str, tuple[np.ndarray, np.ndarray] | Exception]) -> None:
        """The untrained probes' validation scores (`val`): the anchored ones' are their prior's."""
        for name, scored in val.items():
            if isinstance(scored, Exception):
                record_failure(self.results[name], scored, self.active, name)
            elif name in self.prior_states:
                self.prior_val[name] = scored[0]

    def guard(self, config: TrainConfig, groups: np.ndarray | None) -> list[ProbeJob]:
        """After the gradient stage, the guard; returns the jobs that finished, whose test split is scored next."""
        finished = [j for j in self.jobs if self.results[j.name].error is None]
        for j in finished:
            if j.name in self.prior_states:
                guard_against_prior(j, self.results[j.name], self.prior_val[j.name], self.prior_states[j.name], groups,
                                    config.guard_se)
        return finished

    def finish(self, test: dict[str, tuple[np.ndarray, np.ndarray] | Exception]) -> None:
        """The finished jobs' test scores (`test`), scored once with the chosen weights."""
        for name, scored in test.items():
            if isinstance(scored, Exception):
                record_failure(self.results[name], scored, {}, name)
            elif not np.isfinite(scored[0]).all():
                record_failure(self.results[name], _non_finite_test(scored[0]), {}, name)
            else:
                self.results[name].scene_bits, self.results[name].bits_correct = scored


def _read_once(row_sets: Sequence[tuple[Sequence[ProbeJob], dict[str, RowReader]]], budget: int
               ) -> list[tuple[Sequence[ProbeJob], dict[str, RowReader]]]:
    """The row sets with their training rows read into memory once, as stored (float16: half the
    bytes of float32, upcast exactly by each read), where all of them fit `budget` bytes; else as
    given. The stages read a row set's training split some 25 times (statistics, the linear stage,
    the moment stage's passes per target, the gradient stage), each time from its file: 0.6 s of an
    H200's 26-row-set fit, on its host."""
    if sum(len(inputs["train"]) * inputs["train"].row_bytes for _, inputs in row_sets) > budget:
        return list(row_sets)
    return [(jobs, {**inputs, "train": RowReader(inputs["train"].read_all(dtype=None),
                                                 read_bytes=inputs["train"].read_bytes)})
            for jobs, inputs in row_sets]


def _copied_states(models: Sequence[torch.nn.Module]) -> list[dict[str, torch.Tensor]]:
    """Each model's state dict copied, as `copy.deepcopy` would, in one copy per device and type,
    of which each tensor is a view: on a GPU a copy per tensor is a kernel launched from Python,
    and a row set's anchored probes hold ~600 tensors (~16,000 launches for 26 row sets)."""
    states = [m.state_dict() for m in models]
    kinds: dict[tuple, list[tuple[int, str, torch.Tensor]]] = {}
    for i, state in enumerate(states):
        for name, t in state.items():
            kinds.setdefault((t.device, t.dtype), []).append((i, name, t))
    views: list[dict[str, torch.Tensor]] = [{} for _ in states]
    for members in kinds.values():
        flat = torch.cat([t.reshape(-1) for _, _, t in members])
        for (i, name, t), piece in zip(members, flat.split([t.numel() for _, _, t in members])):
            views[i][name] = piece.view(t.shape)
    out = []
    for state, mine in zip(states, views):
        copied = OrderedDict((name, mine[name]) for name in state)
        copied._metadata = getattr(state, "_metadata", None)  # what load_state_dict reads of module versions
        out.append(copied)
    return out


def _non_finite_test(bits: np.ndarray) -> FloatingPointError:
    """The error of a probe whose test bits are not all finite. Train and validation inputs holding
    NaN or inf are refused by the linear stage, but test is read only here: a NaN scene there gave
    an "ok" row whose paper columns were NaN (and whose headline columns read the prior's, where
    the guard kept it). Finite weights on finite inputs always give finite bits (bits an exact
    prior fixes cost 0), so only the activations can be at fault."""
    bad = int((~np.isfinite(bits)).sum())
    return FloatingPointError(f"the test activations hold NaN or inf ({bad} of {len(bits)} test scenes)")
