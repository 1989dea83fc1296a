"""Training probes on cached activations: one pass over the data trains many probes.

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
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import scipy.stats
import torch

from evaluators.metrics import group_labels, mean_se
from evaluators.linear_solver import LinearProblem, PathSettings, solve_path
from evaluators.probes import Probe, anchor, scene_bits, strictly_lower


def resolve_device(device: str) -> str:
    """`auto` means CUDA when available."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and stopping settings shared by every probe of one `fit_probes` call.

    `lr` / `weight_decay` None mean each probe's own (`Probe.lr`, `Probe.weight_decay`, set
    per family from its registry defaults, `evaluators.families`, by `build_probe`); a number overrides it for every probe.
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
    #: L2 strengths (per scene, on the mean code length in nats) the linear stage tries,
    #: strongest first; the one with the lowest validation bits is kept.
    l2_path: tuple[float, ...] = tuple(float(10.0 ** -(e / 4)) for e in range(25))
    #: L1 strengths the linear stage tries after the L2 path, strongest first, each warm-started
    #: from the last (the first from the best L2 solution); validation chooses among all of them.
    #: A binding that only some inputs carry (oracle:mix-0.5) is read by a few strong weights,
    #: which L2 shrinks as hard as it shrinks the noise of all the others.
    l1_path: tuple[float, ...] = (1e-2, 3e-3, 1e-3, 3e-4)
    #: The L1 penalty is smoothed, sqrt(w² + eps²) − eps, so that L-BFGS sees a smooth problem.
    l1_eps: float = 1e-2
    #: Iterations of the batched L-BFGS per L2 and per L1 strength (`evaluators.linear_solver`),
    #: warm-started along the path: a fixed budget, so that no iteration waits on the host.
    linear_iterations: int = 12
    l1_iterations: int = 40
    #: A fit replaces the exact prior only when its validation saving exceeds this many
    #: standard errors (`fit_probes`, the guard; Student's t at the same level for few groups).
    guard_se: float = 2.0
    #: The weights' moving-average decay for every probe (None: each probe's own, `Probe.ema`).
    ema: float | None = None


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
    that the probe's residual is added to.

    Jobs with the same `linear_key` solve the same linear problem (the same targets, prior
    and condition, and probes whose linear parts have the same shape, e.g. one target's
    probes across families): its L2 path is fitted once and copied into each of them.
    `warm_start` names another job whose fitted parameters this one starts from where names
    and shapes agree (`warm_start_from`): it is trained after that job."""

    name: str
    model: Probe
    targets: dict[str, np.ndarray]
    cond: dict[str, np.ndarray] | None = None
    prior: dict[str, np.ndarray] | None = None
    linear_key: str | None = None
    warm_start: str | None = None


@dataclass
class FitResult:
    """A trained probe's test scores with the settings chosen on validation.

    `best_epoch` is the gradient stage's best epoch (0: its start, the linear stage's
    solution or, for probes without one, the untrained probe). `setting` records what was
    chosen on validation: the linear stage's penalty ("l2" or "l1") and its `strength`, and
    whether the gradient stage improved on it. `guard` is "fit" when the probe's validation saving over its
    exact prior exceeded `TrainConfig.guard_se` standard errors (taken over validation
    groups, the F codes), "prior" when it did not and the probe was reset to its prior
    (it then codes test exactly at the prior), None for unanchored probes. `val_bits` is
    the chosen probe's mean validation code length, `val_prior_bits` the prior's and
    `val_saving_se` the saving's standard error.

    `converged` is False when the fit may have stopped short of its optimum: validation was
    still improving when the epoch budget ran out (no `patience` epochs without improvement),
    or the best epoch lies in the last 10 % of the budget, or the linear solver hit its
    iteration limit.
    """

    name: str
    best_epoch: int = -1
    val_bits: float = math.inf
    scene_bits: np.ndarray | None = None  # test bits per scene
    bits_correct: np.ndarray | None = None  # teacher-forced correct bits per test scene
    n_bits: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)  # (train, val) mean bits per epoch
    l2_path: list[tuple[float, float]] = field(default_factory=list)  # (L2 strength, val mean bits)
    l1_path: list[tuple[float, float]] = field(default_factory=list)  # (L1 strength, val mean bits)
    converged: bool = False
    error: str | None = None
    val_scene_bits: np.ndarray | None = None  # validation bits per scene of the chosen probe
    val_prior_bits: float | None = None
    val_saving_se: float | None = None
    guard: str | None = None
    setting: dict[str, Any] = field(default_factory=dict)


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


@torch.no_grad()
def warm_start_from(model: torch.nn.Module, source: torch.nn.Module) -> None:
    """Copy `source`'s parameters into `model` wherever the names agree and the shapes agree, or
    differ only in a wider last (input) dimension of `model` (its leading inputs get the
    source's weights, the extra ones keep their own). Residual terms that start at zero in
    `model` are not copied, so it still starts at its prior: only what reads the input (an
    attention probe's token encoder, keys and values) carries over; an encoder copied whole
    is frozen (`FROZEN_PARTS`)."""
    theirs = dict(source.named_parameters())
    whole, part = set(), set()
    for name, p in model.named_parameters():
        q = theirs.get(name)
        if q is None or not name.startswith(WARM_START_PARTS):
            continue
        if q.shape == p.shape:
            p.copy_(q)
            whole.add(name)
        elif q.dim() == p.dim() and q.shape[:-1] == p.shape[:-1] and q.shape[-1] < p.shape[-1]:
            p[..., : q.shape[-1]] = q
            part.add(name)
    # a module is frozen only if every parameter of it came whole (a widened encoder's bias fits too)
    widened = {name.rpartition(".")[0] for name in part}
    model.frozen_names = frozenset(n for n in whole
                                   if n.startswith(FROZEN_PARTS) and n.rpartition(".")[0] not in widened)


#: The parameters `warm_start_from` carries over: those that turn tokens into keys and values.
WARM_START_PARTS = ("encoder.", "keys.", "values.", "probe.encoder.", "probe.keys.", "probe.values.")
#: Of those, the ones a probe that reads the same tokens keeps as they came (its gradient stage
#: does not train them): the per-token encoder is most of an attention probe's step, and an
#: F-probe started from the O|F-probe's encoder reads the features as well frozen as trained.
#: A probe whose tokens are wider (the planted probe's) trains its encoder on.
FROZEN_PARTS = ("encoder.", "probe.encoder.")


def _has_linear(job: ProbeJob) -> bool:
    linear = getattr(job.model, "linear_parameters", None)
    return linear is not None and bool(linear())


def _has_nonlinear(job: ProbeJob) -> bool:
    nonlinear = getattr(job.model, "nonlinear_parameters", None)
    return bool(nonlinear()) if nonlinear is not None else any(True for _ in job.model.parameters())


#: Rows per chunk of the moment stage (its K x n x m products stay a few hundred MB at most).
_MOMENT_CHUNK = 1024


def _linear_stage(jobs: Sequence[ProbeJob], inputs: dict[str, RowReader], config: TrainConfig, device: str,
                  results: dict[str, FitResult], active: dict[str, ProbeJob]) -> None:
    """Fit every linear problem (one per `linear_key`) along the penalty path in one batched solve
    per design (`evaluators.linear_solver`), and give every job its target's chosen solution.

    One strength for all bits of a target: choosing per bit (each bit's logit reads only its own
    rows of the linear parameters, so it could) overfits validation wherever a bit is free in few
    scenes — on a 1-bit task whose bit moves over 64 positions, oracle:features read β* −0.87.
    The L1 path starts from the best L2 solution; its bias keeps an L2 penalty of the same
    strength (a bias is not sparse, and L1 would pull a rarely free bit's bias to its noise)."""
    if not jobs:
        return
    if not config.l2_path and not config.l1_path:
        raise ValueError("the linear stage needs at least one L2 or L1 strength")
    keyed: dict[str, list[ProbeJob]] = {}
    for job in jobs:
        keyed.setdefault(job.linear_key if job.linear_key is not None else "\0" + job.name, []).append(job)
    raw = {s: torch.from_numpy(inputs[s].take(np.arange(len(inputs[s])))).to(device) for s in ("train", "val")}
    groups: list[tuple[torch.Tensor, torch.Tensor, list[tuple[list[ProbeJob], LinearProblem, LinearProblem]]]] = []
    for members in keyed.values():
        try:
            x_train, train = _linear_problem(members[0], raw["train"], "train", device)
            x_val, val = _linear_problem(members[0], raw["val"], "val", device)
            if not bool(torch.isfinite(x_train).all()) or not bool(torch.isfinite(x_val).all()):
                raise FloatingPointError("the activations hold NaN or inf")
        except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
            for job in members:
                _fail(results[job.name], e, active, job.name)
            continue
        for gx, _, problems in groups:  # targets that read the same input share one rotation and one solve
            if gx.shape == x_train.shape and torch.equal(gx, x_train):
                problems.append((members, train, val))
                break
        else:
            groups.append((x_train, x_val, [(members, train, val)]))
    settings = PathSettings(config.l2_path, config.l1_path, config.l1_eps, config.linear_iterations,
                            config.l1_iterations)
    strengths = settings.strengths
    for x_train, x_val, problems in groups:
        try:
            solutions = solve_path(x_train[None], x_val[None], [p[1] for p in problems], [p[2] for p in problems],
                                   settings)
        except Exception as e:  # noqa: BLE001 — a failing solve becomes error rows of its targets
            for members, _, _ in problems:
                for job in members:
                    _fail(results[job.name], e, active, job.name)
            continue
        for (members, _, _), sol in zip(problems, solutions):
            choice, path = int(sol.choice[0]), sol.val_path[:, 0].cpu().numpy().astype(float)
            kind, strength = strengths[choice]
            setting = {"penalty": kind, "strength": strength, "lbfgs_converged": bool(sol.converged[0])}
            scene = sol.val_scene_bits[0].cpu().numpy()
            for job in members:
                r = results[job.name]
                if not math.isfinite(path[choice]):
                    _fail(r, FloatingPointError(f"validation loss is {path[choice]} at {kind.upper()} {strength:g}"),
                          active, job.name)
                    continue
                _load_linear(job.model, sol.w[0], sol.v[0])
                r.l2_path = [(s, float(v)) for (k, s), v in zip(strengths, path) if k == "l2"]
                r.l1_path = [(s, float(v)) for (k, s), v in zip(strengths, path) if k == "l1"]
                r.val_bits, r.val_scene_bits = float(path[choice]), scene
                r.setting.update(setting)
                r.best_epoch, r.converged, r.history = 0, setting["lbfgs_converged"], [(math.nan, r.val_bits)]


def _linear_problem(job: ProbeJob, x: torch.Tensor, split: str, device: str) -> tuple[torch.Tensor, LinearProblem]:
    """(the standardised input the job's linear weights read, its linear problem) on one split."""
    model = job.model
    n = len(x)
    target = torch.from_numpy(job.targets[split][:n]).to(device).float()
    cond = torch.from_numpy(job.cond[split][:n]).to(device).float() if job.cond is not None else None
    design, cond_read = model.linear_design(x, cond)
    k = target.shape[1]
    extra, mask = [], []
    if model.trains_context:
        extra.append(target)
        mask.append(strictly_lower(k).to(device))
    if cond_read is not None:
        extra.append(cond_read)
        mask.append(torch.ones(k, cond_read.shape[1], device=device))
    extra.append(torch.ones(n, 1, device=device))
    mask.append(torch.ones(k, 1, device=device))
    if job.prior is not None:
        prior = torch.from_numpy(job.prior[split][:n]).to(device).float()
        free = torch.isfinite(prior)
        offsets = torch.where(free, prior, torch.zeros_like(prior))
    else:
        free, offsets = torch.ones_like(target, dtype=torch.bool), torch.zeros_like(target)
    return design.float(), LinearProblem(target, offsets, free.float(), torch.cat(extra, 1), torch.cat(mask, 1))


@torch.no_grad()
def _load_linear(model: torch.nn.Module, w: torch.Tensor, v: torch.Tensor) -> None:
    """Set a probe's linear part from a solution: w (K x D), v (K x Q: [context], [cond], bias)."""
    k = w.shape[0]
    context = v[:, :k] if model.trains_context else None
    rest = v[:, k:] if model.trains_context else v
    model.set_linear(w, rest[:, -1], context, rest[:, :-1] if rest.shape[1] > 1 else None)


def _bias_ids(model: torch.nn.Module) -> set[int]:
    """The probe's per-bit bias (its own or a wrapped probe's): the one linear parameter the
    gradient stage trains on, and the one the L1 path keeps under L2."""
    return {id(p) for name, p in model.named_parameters() if name in ("bias", "probe.bias")}


#: Principal directions the class moments are computed in (the top of the train covariance):
#: all of them up to 384-d inputs.
MOMENT_DIMS = 384


def _moment_stage(jobs: Sequence[ProbeJob], reader: RowReader, device: str, results: dict[str, FitResult],
                  active: dict[str, ProbeJob]) -> None:
    """Give quadratic probes their moment-based starting directions (per `linear_key` once)."""
    done: dict[str | None, torch.Tensor] = {}
    for job in jobs:
        try:
            key = job.linear_key
            if key is None or key not in done:
                directions = class_directions(reader, job, MOMENT_DIMS, getattr(job.model, "rank", 8), device)
                if key is not None:
                    done[key] = directions
            job.model.init_from_moments(done[key].to(device) if key is not None else directions.to(device))
        except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
            _fail(results[job.name], e, active, job.name)


@torch.no_grad()
def class_directions(reader: RowReader, job: ProbeJob, dims: int, rank: int, device: str = "cpu") -> torch.Tensor:
    """Per target bit, up to `rank` unit directions (K x rank x D; unused ones are zero) along
    which the standardised input's covariance differs most between scenes where the bit is 1
    and where it is 0 (eigenvectors of Σ_1 − Σ_0 by |eigenvalue|, the sliced-average-variance
    idea of SAVE): the directions a quadratic form of the input can read the bit from.

    Only as many directions are kept as one half of the training rows confirms of those found
    on the other (`_confirmed`): the largest class differences of a finite sample are partly
    its noise, and terms on them fitted that noise (planted quadratic teacher, 384-d, 10,000
    scenes: 22 % of the recoverable bits with all 8, 47 % with the confirmed ones). Computed
    in the top `dims` principal directions of the training rows, so the cost is N·K·dims², not
    N·K·D²; on isotropic inputs a 128-dim subspace keeps a third of a direction (26 % where the
    full 384 dims give 47 %). Bits an exact prior fixes in a scene do not count there.

    The class difference is accumulated as one product per half, Yᵀ diag(w₁/n₁ − w₀/n₀) Y, in
    float32 on the fitting device; only the input covariance (D x D) is summed in float64."""
    model = job.model
    mu, sigma = model.mu.double().cpu(), model.sigma.double().cpu()
    d = reader.row_shape[-1]
    cov = torch.zeros(d, d, dtype=torch.float64)
    for _, rows in reader.chunks(_MOMENT_CHUNK):
        x = (torch.from_numpy(rows).double() - mu) / sigma
        cov += x.T @ x
    m = min(dims, d)
    basis = torch.linalg.eigh(cov).eigenvectors[:, -m:]  # D x m
    k = job.targets["train"].shape[1]
    # Two halves of the training rows (even and odd): directions found on one half are kept only
    # where the other half confirms them (`_confirmed`).
    weights = _class_weights(job, reader.n)  # class, N x K
    half = np.arange(reader.n) % 2
    counts = np.stack([np.stack([w[half == h].sum(0) for w in weights]) for h in (0, 1)])  # half, class, K
    scale = 1.0 / np.maximum(counts, 1.0)
    delta = torch.zeros(2, k, m, m, device=device)  # half x K x m x m
    basis_dev, mu_dev, sigma_dev = basis.float().to(device), mu.float().to(device), sigma.float().to(device)
    for idx, rows in reader.chunks(_MOMENT_CHUNK):
        y = ((torch.from_numpy(rows).to(device) - mu_dev) / sigma_dev) @ basis_dev
        for h in (0, 1):
            mine = half[idx] == h
            coef = weights[1][idx[mine]] * scale[h, 1] - weights[0][idx[mine]] * scale[h, 0]  # n_h x K
            yh = y[torch.from_numpy(mine).to(device)]
            scaled = torch.from_numpy(coef.astype(np.float32)).to(device).T[:, :, None] * yh[None]  # K x n_h x m
            delta[h] += scaled.transpose(1, 2) @ yh
    candidates = _top_eigenvectors(delta[0], rank)  # K x m x rank, from the first half
    keep = _confirmed(reader, weights, mu_dev, sigma_dev, basis_dev, candidates)  # K x rank, on the second half
    top = _top_eigenvectors(delta.mean(0), rank)  # from both halves
    n_keep = keep.sum(-1)  # as many of both halves' leading directions as the odd rows confirmed
    width = top.shape[-1]  # fewer than `rank` where the input has fewer dimensions
    top = top * (torch.arange(width, device=device)[None, :] < n_keep[:, None]).float()[:, None, :]
    return (basis_dev @ top).transpose(1, 2)  # K x rank x D


def _class_weights(job: ProbeJob, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights of class 0, of class 1) per training scene and bit: bits an exact prior fixes in a
    scene weigh 0 there."""
    t = job.targets["train"][:n].astype(np.float64)
    free = np.ones_like(t) if job.prior is None else np.isfinite(job.prior["train"][:n]).astype(np.float64)
    return (1 - t) * free, t * free


#: Subspace iterations behind `_top_eigenvectors`, and the block's width beyond the rank.
EIGEN_ITERATIONS = 30
EIGEN_OVERSAMPLE = 8


def _top_eigenvectors(delta: torch.Tensor, rank: int) -> torch.Tensor:
    """Per bit, the `rank` eigenvectors of a symmetric K x m x m stack with the largest |eigenvalue|,
    by block subspace iteration with a Rayleigh–Ritz step: only `rank` of m eigenvectors are wanted,
    and a full eigendecomposition of every bit's matrix cost seconds per target."""
    k, m, _ = delta.shape
    width = min(m, rank + EIGEN_OVERSAMPLE)
    gen = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(m, width, generator=gen, dtype=delta.dtype).to(delta.device).expand(k, -1, -1)).Q
    for _ in range(EIGEN_ITERATIONS):
        q = torch.linalg.qr(delta @ q).Q
    values, vectors = torch.linalg.eigh(q.transpose(1, 2) @ delta @ q)
    order = values.abs().argsort(dim=-1, descending=True)[:, :rank]
    ritz = q @ vectors  # K x m x width
    return torch.gather(ritz, 2, order[:, None, :].expand(-1, m, -1))


#: A direction found on one half of the training rows is kept when the other half's class
#: difference in its mean square exceeds this many standard errors.
CONFIRM_SE = 4.0


@torch.no_grad()
def _confirmed(reader: RowReader, weights: tuple[np.ndarray, np.ndarray], mu: torch.Tensor, sigma: torch.Tensor,
               basis: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """K x rank: whether each candidate direction (K x m x rank, found on the even rows) separates
    the classes on the odd rows too: the difference of the classes' mean (v·y)² there, over its
    standard error, exceeds `CONFIRM_SE`. Directions chosen as
    the training set's largest class differences are partly its noise: on a planted quadratic
    teacher (384-d, 10,000 scenes) unconfirmed ones let the quadratic terms fit 4.9 training bits
    against an exact 5.5 while validation got worse from the first epoch."""
    k, _, r = candidates.shape
    dev = candidates.device
    s1 = torch.zeros(2, k, r, dtype=torch.float64, device=dev)
    s2 = torch.zeros(2, k, r, dtype=torch.float64, device=dev)
    cnt = torch.zeros(2, k, dtype=torch.float64, device=dev)
    for idx, rows in reader.chunks(_MOMENT_CHUNK):
        odd = idx % 2 == 1
        y = ((torch.from_numpy(rows[odd]).to(dev) - mu) / sigma) @ basis
        sq = torch.einsum("nm,kmr->nkr", y, candidates).square().double()  # n x K x rank
        for c in (0, 1):
            wc = torch.from_numpy(weights[c][idx[odd]]).to(dev)
            s1[c] += (wc[:, :, None] * sq).sum(0)
            s2[c] += (wc[:, :, None] * sq.square()).sum(0)
            cnt[c] += wc.sum(0)
    n = cnt.clamp_min(2)[..., None]
    mean = s1 / n
    var = (s2 / n - mean.square()).clamp_min(0) / (n - 1)
    z = (mean[1] - mean[0]) / (var[0] + var[1]).sqrt().clamp_min(1e-12)
    return z.abs() > CONFIRM_SE


def _gradient_stage(jobs: Sequence[ProbeJob], inputs: dict[str, RowReader], config: TrainConfig, device: str,
                    results: dict[str, FitResult], active: dict[str, ProbeJob],
                    progress: Callable[[int], None] | None) -> None:
    """AdamW on each job's parameters beyond its linear part, early-stopped on validation."""
    if not jobs:
        return
    n_train = len(inputs["train"])
    rng = np.random.default_rng(config.seed)
    states, optims, schedules, trained_params, emas, decays = {}, {}, {}, {}, {}, {}
    steps = {j.name: 0 for j in jobs}
    stale = {j.name: 0 for j in jobs}
    running = {j.name: j for j in jobs}
    for j in jobs:
        # the linear part stays at its solution, all but the bias: a quadratic term shifts
        # the logits' mean, and a bias frozen at the linear fit's value no longer centres them
        kept = {id(p) for p in (j.model.linear_parameters() if _has_linear(j) else [])} - _bias_ids(j.model)
        frozen = getattr(j.model, "frozen_names", frozenset())
        kept |= {id(p) for name, p in j.model.named_parameters() if name in frozen}
        trained = [p for p in j.model.parameters() if id(p) not in kept]
        for p in j.model.parameters():
            p.requires_grad_(id(p) not in kept)
        lr = config.lr if config.lr is not None else getattr(j.model, "lr", Probe.lr)
        decay = config.weight_decay if config.weight_decay is not None else getattr(j.model, "weight_decay",
                                                                                     Probe.weight_decay)
        optims[j.name] = adamw(trained, lr, decay)
        trained_params[j.name] = trained
        decays[j.name] = config.ema if config.ema is not None else getattr(j.model, "ema", None)
        emas[j.name] = [p.detach().clone() for p in trained] if decays[j.name] else []
        schedules[j.name] = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optims[j.name], mode="min", factor=config.lr_factor, patience=config.lr_patience,
            threshold=config.min_delta, threshold_mode="abs")
        r = results[j.name]
        r.setting.update(lr=lr, weight_decay=decay, ema=decays[j.name])
    # Epoch 0 is the stage's start (the linear stage's solution, or the untrained probe).
    for name, scored in _score(jobs, inputs["val"], "val", device, config.batch_size).items():
        r = results[name]
        if isinstance(scored, Exception):
            _fail(r, scored, active, name)
            running.pop(name, None)
            continue
        r.val_bits, r.val_scene_bits, r.best_epoch = float(scored[0].mean()), scored[0], 0
        r.history = [(math.nan, r.val_bits)]
        schedules[name].step(r.val_bits)
        states[name] = copy.deepcopy(running[name].model.state_dict())
    for epoch in range(1, config.epochs + 1):
        if not running:
            break
        train_sum = {name: torch.zeros((), device=device) for name in running}  # read once an epoch
        for j in running.values():
            j.model.train()
        perm = rng.permutation(n_train)
        for start in range(0, n_train, config.batch_size):
            idx = np.sort(perm[start : start + config.batch_size])
            x = torch.from_numpy(inputs["train"].take(idx)).to(device)
            for name, j in list(running.items()):
                try:
                    loss = _batch_bits(j, "train", idx, x, device)[0].mean()
                    optims[name].zero_grad(set_to_none=True)
                    loss.backward()
                    optims[name].step()
                    if decays[name]:
                        steps[name] += 1
                        # warmed up (as TensorFlow's moving averages are): early on the average follows
                        # the weights instead of lagging ~1/(1 - decay) steps behind them
                        decay = min(decays[name], (1 + steps[name]) / (10 + steps[name]))
                        with torch.no_grad():
                            for e, p in zip(emas[name], trained_params[name]):
                                e.lerp_(p, 1 - decay)
                    train_sum[name] += loss.detach() * len(idx)
                except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
                    _fail(results[name], e, active, name)
                    running.pop(name, None)
        averaged = [name for name in running if decays[name]]
        raw = {name: [p.detach().clone() for p in trained_params[name]] for name in averaged}
        with torch.no_grad():  # validate (and keep) the averaged weights; train on from the raw ones
            for name in averaged:
                for e, p in zip(emas[name], trained_params[name]):
                    p.copy_(e)
        val = _score(list(running.values()), inputs["val"], "val", device, config.batch_size)
        keep = {name: copy.deepcopy(running[name].model.state_dict()) for name in averaged}
        with torch.no_grad():
            for name in averaged:
                for r_, p in zip(raw[name], trained_params[name]):
                    p.copy_(r_)
        for name in list(running):
            r = results[name]
            if isinstance(val[name], Exception):
                _fail(r, val[name], active, name)
                running.pop(name)
                continue
            v = float(val[name][0].mean())
            r.history.append((float(train_sum[name]) / n_train, v))
            if not math.isfinite(v):
                _fail(r, FloatingPointError(f"validation loss is {v} at epoch {epoch}"), active, name)
                running.pop(name)
                continue
            schedules[name].step(v)
            if v < r.val_bits - config.min_delta:
                r.val_bits, r.val_scene_bits, r.best_epoch, stale[name] = v, val[name][0], epoch, 0
                states[name] = keep.get(name) or copy.deepcopy(running[name].model.state_dict())
            else:
                stale[name] += 1
                if stale[name] >= config.patience:
                    del running[name]
        if progress:
            progress(1)
    for j in jobs:
        r = results[j.name]
        if r.error is not None:
            continue
        stage_ok = stale[j.name] >= config.patience and r.best_epoch <= 0.9 * config.epochs
        r.converged = stage_ok and r.setting.get("lbfgs_converged", True)
        r.setting["gradient_epoch"] = r.best_epoch
        j.model.load_state_dict(states[j.name])
        for p in j.model.parameters():
            p.requires_grad_(True)


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with its fused kernel, one pass over all of a probe's tensors per step (torch < 2.4
    has none on a CPU: its multi-tensor form there). Stepped one tensor at a time, as torch does on
    a CPU by default, the optimiser took half of a quadratic or dnn probe's gradient stage."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)


def _guard(job: ProbeJob, result: FitResult, prior_val: np.ndarray, prior_state: dict[str, torch.Tensor],
           groups: np.ndarray | None, n_se: float) -> None:
    """Keep the fit only if it saves more validation bits than the exact prior by more than
    `n_se` standard errors (Student's t with G − 1 degrees of freedom at the same one-sided level,
    G the validation groups, so that a handful of F codes cannot pass a noise fit: with 16
    validation scenes a two-SE guard let fits through that read β* −0.6 on test); otherwise reset
    the probe to its prior (a zero residual)."""
    saving, se = saving_and_se(prior_val, result.val_scene_bits, groups)
    result.val_prior_bits, result.val_saving_se = float(prior_val.mean()), se
    n_groups = int(group_labels(groups, len(prior_val)).max()) + 1 if len(prior_val) else 0
    bar = n_se if not math.isfinite(n_se) or n_groups < 2 else \
        float(scipy.stats.t.ppf(scipy.stats.norm.cdf(n_se), df=n_groups - 1))
    if saving > bar * se:
        result.guard = "fit"
        return
    result.guard = "prior"
    job.model.load_state_dict(prior_state)
    result.val_bits, result.val_scene_bits = float(prior_val.mean()), prior_val


def saving_and_se(reference: np.ndarray, fitted: np.ndarray, groups: np.ndarray | None = None) -> tuple[float, float]:
    """Mean of reference − fitted per scene, and its standard error resampling whole groups."""
    d = np.asarray(reference, dtype=np.float64) - np.asarray(fitted, dtype=np.float64)
    return (float(d.mean()) if len(d) else 0.0), mean_se(d, groups)


def _fail(result: FitResult, error: Exception, active: dict, name: str) -> None:
    result.error = f"{type(error).__name__}: {error}".splitlines()[0]
    result.converged = False
    active.pop(name, None)


def _batch_bits(job: ProbeJob, split: str, idx: np.ndarray, x: torch.Tensor, device: str,
                amp: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits per scene, logits) of one job on a batch, teacher-forced (bf16 autocast on CUDA
    unless `amp` is off: L-BFGS needs exact gradients)."""
    target = torch.from_numpy(job.targets[split][idx]).to(device)
    cond = torch.from_numpy(job.cond[split][idx]).to(device).float() if job.cond is not None else None
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp and device.startswith("cuda")):
        residual = job.model(x, target, cond)
    prior = torch.from_numpy(job.prior[split][idx]).to(device) if job.prior is not None else None
    logits = anchor(residual.float(), prior)
    return scene_bits(logits, target), logits


#: Input bytes per chunk when a split is scored: no gradient is kept, so a pooled view's split is
#: scored in one pass, a spatial view's in chunks of this size.
_SCORE_BYTES = 64 * 2**20


@torch.no_grad()
def _score(jobs: Sequence[ProbeJob], reader: RowReader, split: str, device: str,
           batch: int) -> dict[str, tuple[np.ndarray, np.ndarray] | Exception]:
    """Per-scene bits and teacher-forced correct-bit counts of every job on a split, in order;
    a job that raises gets its exception instead, and the others go on. Scores stay on the device
    until the split is done: one transfer per job and split."""
    for j in jobs:
        j.model.eval()
    bits: dict[str, list] = {j.name: [] for j in jobs}
    correct: dict[str, list] = {j.name: [] for j in jobs}
    failed: dict[str, Exception] = {}
    chunk = max(batch, _SCORE_BYTES // max(reader.row_bytes * 4 // max(reader.dtype.itemsize, 1), 1))
    for idx, rows in reader.chunks(chunk):
        x = torch.from_numpy(rows).to(device)
        for j in jobs:
            if j.name in failed:
                continue
            try:
                b, logits = _batch_bits(j, split, idx, x, device)
            except Exception as e:  # noqa: BLE001 — reported per job
                failed[j.name] = e
                continue
            target = torch.from_numpy(j.targets[split][idx]).to(device)
            bits[j.name].append(b.float())
            correct[j.name].append(((logits > 0) == (target > 0)).sum(1))
    return {n: failed.get(n) or (torch.cat(bits[n]).cpu().numpy(), torch.cat(correct[n]).cpu().numpy())
            for n in bits}
