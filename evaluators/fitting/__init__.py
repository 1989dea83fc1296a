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
rest of the linear part frozen, until the mean validation bits plateau (`ReduceLROnPlateau`, `patience` epochs; 200
epochs is only a backstop); and a guard that keeps a fit only when it beats the exact prior on
validation by about two standard errors. The chosen settings go into each `FitResult`, and the
test split is scored once, with the chosen weights. Mixed precision (bf16 autocast) on CUDA
only; CPU runs in fp32 (this machine has no bf16 matrix units).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np
import torch

from evaluators.fitting.data import (FitResult, ProbeJob, RowReader, TrainConfig, auto_batch_size, feature_stats,
                                     resolve_device)
from evaluators.fitting.gradient import _gradient_stage, _has_linear, _has_nonlinear, warm_start_from
from evaluators.fitting.linear import _linear_stage
from evaluators.fitting.moments import _moment_stage, class_directions
from evaluators.fitting.scoring import _fail, _guard, _score, saving_and_se

__all__ = ["FitResult", "ProbeJob", "RowReader", "TrainConfig", "auto_batch_size", "class_directions", "feature_stats",
           "fit_probes", "resolve_device", "saving_and_se", "warm_start_from"]


def fit_probes(
    jobs: Sequence[ProbeJob],
    inputs: dict[str, RowReader],
    config: TrainConfig = TrainConfig(),
    progress: Callable[[int], None] | None = None,
    groups: np.ndarray | None = None,
) -> dict[str, FitResult]:
    """Fit every job in stages, guard it against its prior, and score test once.

    1. Linear stage (probes with a linear part, `Probe.linear_names`): the linear part is
       fitted by full-batch L-BFGS for every L2 strength of `config.l2_path`, strongest
       first, each warm-started from the last, and the strength with the lowest mean
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
       the job stops after `patience` such epochs); epoch 0 is the stage's start, so the
       family never ends worse on validation than the linear probe. Jobs with `warm_start`
       train in a second round, starting from the encoder of the job they name.
    3. Guard (anchored jobs, `prior` given): the chosen probe replaces the exact prior only
       when its mean validation saving over the prior exceeds `config.guard_se` standard
       errors of that mean, resampling whole `groups` (one label per validation scene,
       the F codes; None: scenes). A representation that adds nothing then reads exactly
       0 rather than a noise-fitted ±: on oracle:features a validation-selected fit read
       β* −0.014 without it.

    `inputs` maps "train", "val", "test" to row readers aligned with the jobs' targets.
    A job that raises is dropped and reported through `FitResult.error`; the others go on.
    `progress(1)` is called once per gradient epoch.
    """
    device = resolve_device(config.device)
    n_train = len(inputs["train"])
    config = replace(config, batch_size=config.batch_size or auto_batch_size(n_train))
    torch.manual_seed(config.seed)
    mean, std = feature_stats(inputs["train"])
    results = {j.name: FitResult(j.name, n_bits=j.targets["train"].shape[1]) for j in jobs}
    active = {j.name: j for j in jobs}
    for j in jobs:
        j.model.set_standardization(mean, std)
        j.model.to(device)
    prior_states = {j.name: copy.deepcopy(j.model.state_dict()) for j in jobs if j.prior is not None}
    start = _score(jobs, inputs["val"], "val", device, config.batch_size)
    prior_val: dict[str, np.ndarray] = {}
    for name, scored in start.items():
        if isinstance(scored, Exception):
            _fail(results[name], scored, active, name)
        elif name in prior_states:
            prior_val[name] = scored[0]
    _linear_stage([j for j in active.values() if _has_linear(j)], inputs, config, device, results, active)
    _moment_stage([j for j in active.values() if hasattr(j.model, "init_from_moments")], inputs["train"], device,
                  results, active)
    first = [j for j in active.values() if _has_nonlinear(j) and j.warm_start not in active]
    _gradient_stage(first, inputs, config, device, results, active, progress)
    later = [j for j in active.values() if _has_nonlinear(j) and all(j is not f for f in first)]
    for j in later:
        warm_start_from(j.model, active[j.warm_start].model)
    _gradient_stage(later, inputs, config, device, results, active, progress)
    finished = [j for j in jobs if results[j.name].error is None]
    for j in finished:
        if j.name in prior_states:
            _guard(j, results[j.name], prior_val[j.name], prior_states[j.name], groups, config.guard_se)
    for name, scored in _score(finished, inputs["test"], "test", device, config.batch_size).items():
        if isinstance(scored, Exception):
            _fail(results[name], scored, {}, name)
        else:
            results[name].scene_bits, results[name].bits_correct = scored
    return results
