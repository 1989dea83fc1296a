"""The gradient stage: AdamW on what a probe has beyond its linear part, early-stopped on
validation (`evaluators.fitting.fit_probes`, step 2), and the warm start of one probe from another."""

from __future__ import annotations

import copy
import math
from contextlib import ExitStack
from typing import Callable, Sequence

import numpy as np
import torch

from evaluators.fitting.early_stopping import Plateau, WeightAverage
from evaluators.fitting.data import (FitResult, ProbeJob, RowReader, TrainConfig, held_bytes, piece_rows, read_spans,
                                     stack_budget)
from evaluators.fitting.linear import bias_ids
from evaluators.fitting.scoring import HeldCodes, batch_bits, record_failure, score_jobs


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


def has_linear(job: ProbeJob) -> bool:
    """Whether the job's probe has a linear part for the linear stage to fit (`Probe.linear_names`)."""
    linear = getattr(job.model, "linear_parameters", None)
    return linear is not None and bool(linear())


def has_nonlinear(job: ProbeJob) -> bool:
    """Whether the job's probe has parameters beyond its linear part, which the gradient stage trains
    (a module without `nonlinear_parameters`: any parameter at all)."""
    nonlinear = getattr(job.model, "nonlinear_parameters", None)
    return bool(nonlinear()) if nonlinear is not None else any(True for _ in job.model.parameters())


def trained_parameters(job: ProbeJob) -> list[torch.nn.Parameter]:
    """The parameters the gradient stage trains (and marks as needing a gradient): all but the
    linear part, which stays at its solution except the bias (a quadratic term shifts the logits'
    mean, and a bias frozen at the linear fit's value no longer centres them), and but the parts a
    warm start froze (`FROZEN_PARTS`)."""
    kept = {id(p) for p in (job.model.linear_parameters() if has_linear(job) else [])} - bias_ids(job.model)
    frozen = getattr(job.model, "frozen_names", frozenset())
    kept |= {id(p) for name, p in job.model.named_parameters() if name in frozen}
    for p in job.model.parameters():
        p.requires_grad_(id(p) not in kept)
    return [p for p in job.model.parameters() if id(p) not in kept]


def optim_settings(job: ProbeJob, config: TrainConfig) -> tuple[float, float, float | None]:
    """(learning rate, weight decay, moving-average decay): the config's where it sets them, else the job's."""
    lr = config.lr if config.lr is not None else job.optim.lr
    decay = config.weight_decay if config.weight_decay is not None else job.optim.weight_decay
    ema = config.ema if config.ema is not None else job.optim.ema
    return lr, decay, ema


def _plateau_settings(job: ProbeJob, config: TrainConfig) -> tuple[int, int]:
    """(patience, learning-rate patience): the config's where it sets them, else the job's (its family's)."""
    patience = config.patience if config.patience is not None else job.optim.patience
    lr_patience = config.lr_patience if config.lr_patience is not None else job.optim.lr_patience
    return patience, lr_patience


class Course:
    """One job's course through the gradient stage, however it is stepped (with its row set's other
    jobs, or stacked with the same job of other row sets): its validation history, the plateau that
    stops it, its learning rate and the schedule that lowers it, and the best weights so far.

    The rate lives in an optimiser of its own that steps nothing (`ReduceLROnPlateau` schedules an
    optimiser's rates), and the optimiser that steps the job reads it between epochs: one optimiser
    steps all jobs of a row set, a stacked step all row sets' job at once."""

    def __init__(self, job: ProbeJob, result: FitResult, lr: float, config: TrainConfig) -> None:
        self.job, self.result, self.config = job, result, config
        self.optimizer = torch.optim.SGD([torch.zeros(1)], lr=lr)
        self.patience, lr_patience = _plateau_settings(job, config)
        result.setting["patience"] = self.patience  # the plateau rule it stopped on, beside its rate
        self.schedule = torch.optim.lr_scheduler.ReduceLROnPlateau(
            self.optimizer, mode="min", factor=config.lr_factor, patience=lr_patience,
            threshold=config.min_delta, threshold_mode="abs")
        self.plateau: Plateau | None = None
        self.state: dict[str, torch.Tensor] | None = None

    @property
    def lr(self) -> float:
        """The learning rate for the next epoch."""
        return self.optimizer.param_groups[0]["lr"]

    def start(self, val_bits: np.ndarray, state: dict[str, torch.Tensor] | None = None) -> None:
        """Epoch 0: the stage's start (the linear stage's solution, or the untrained probe), whose
        weights are `state` where the caller holds a copy (else the model's are copied)."""
        r = self.result
        r.val_bits, r.val_scene_bits, r.best_epoch = float(val_bits.mean()), val_bits, 0
        r.history = [(math.nan, r.val_bits)]
        self.schedule.step(r.val_bits)
        self.plateau = Plateau(r.val_bits, self.patience, self.config.min_delta)
        self.state = state if state is not None else copy.deepcopy(self.job.model.state_dict())

    def epoch(self, epoch: int, train_bits: float, val_bits: np.ndarray,
              kept: dict[str, torch.Tensor] | Callable[[], dict[str, torch.Tensor]] | None = None
              ) -> Exception | bool:
        """Count one epoch (`train_bits`: its mean training bits; `kept`: the weights to keep if it is
        the best, or what gives them, so that a stacked job copies its slice only then; else the
        model's own). False when the job stops, an error when it fails."""
        r, v = self.result, float(val_bits.mean())
        r.history.append((train_bits, v))
        if not math.isfinite(v):
            return FloatingPointError(f"validation loss is {v} at epoch {epoch}")
        self.schedule.step(v)
        if self.plateau.improved(v):
            r.val_bits, r.val_scene_bits, r.best_epoch = v, val_bits, epoch
            kept = kept() if callable(kept) else kept
            self.state = kept if kept is not None else copy.deepcopy(self.job.model.state_dict())
        return not self.plateau.stopped

    def conclude(self, load: bool = True) -> None:
        """Load the best weights (unless the caller did, `load_states`) and record how the stage ended."""
        r = self.result
        if r.error is not None:
            return
        stage_ok = self.plateau.stopped and r.best_epoch <= 0.9 * self.config.epochs
        r.converged = stage_ok and r.setting.get("lbfgs_converged", True)
        r.setting["gradient_epoch"] = r.best_epoch
        if load:
            self.job.model.load_state_dict(self.state)
        for p in self.job.model.parameters():
            p.requires_grad_(True)


@torch.no_grad()
def load_states(pairs: Sequence[tuple[torch.nn.Module, dict[str, torch.Tensor]]]) -> None:
    """`load_state_dict` of each (module, state), the copies of one device and type in one
    multi-tensor copy (`torch._foreach_copy_`): a copy per tensor and job was ~120 kernels a row set
    at the end of a stacked stage on a GPU. A state that does not match its module goes through
    `load_state_dict`, which says how."""
    groups: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for module, state in pairs:
        own = module.state_dict()
        if own.keys() != state.keys() or any(own[n].shape != state[n].shape for n in own):
            module.load_state_dict(state)
            continue
        for name, mine in own.items():
            given = state[name]
            dsts, srcs = groups.setdefault((mine.device, mine.dtype, given.device, given.dtype), ([], []))
            dsts.append(mine)
            srcs.append(given)
    for dsts, srcs in groups.values():
        torch._foreach_copy_(dsts, srcs)


def gradient_stage(jobs: Sequence[ProbeJob], inputs: dict[str, RowReader], config: TrainConfig, device: str,
                   results: dict[str, FitResult], active: dict[str, ProbeJob],
                   progress: Callable[[int], None] | None) -> None:
    """AdamW on each job's parameters beyond its linear part, early-stopped on validation: the jobs
    of one row set, stepped together on shared batches (`evaluators.fitting.stacked` steps the same
    job of many row sets as one).

    A batch's losses are back-propagated in one call and stepped by one optimiser, a parameter
    group per job (its own rate, which its schedule lowers, and decay): the same numbers as one
    backward and one optimiser per job, a fifth less time per step (ten quadratic and dnn probes,
    31 rows)."""
    if not jobs:
        return
    n_train = len(inputs["train"])
    rng = np.random.default_rng(config.seed)
    courses, groups, averages = {}, {}, {}
    running = {j.name: j for j in jobs}
    for j in jobs:
        lr, decay, ema = optim_settings(j, config)
        trained = trained_parameters(j)
        groups[j.name] = {"params": trained, "lr": lr, "weight_decay": decay}
        if ema:
            averages[j.name] = WeightAverage(trained, ema)
        courses[j.name] = Course(j, results[j.name], lr, config)
        results[j.name].setting.update(lr=lr, weight_decay=decay, ema=ema)
    optimizer = adamw(list(groups.values()))
    for name, scored in score_jobs(jobs, inputs["val"], "val", device, config.batch_size).items():
        if isinstance(scored, Exception):
            record_failure(results[name], scored, active, name)
            running.pop(name, None)
        else:
            courses[name].start(scored[0])
    rows, held = _held_on_device(jobs, inputs["train"], device, config)
    pieces = piece_rows(inputs["train"].float_row_bytes, device)
    for epoch in range(1, config.epochs + 1):
        if not running:
            break
        for name, group in groups.items():
            group["lr"] = courses[name].lr
        train_sum = {name: torch.zeros((), device=device) for name in running}  # read once an epoch
        for j in running.values():
            j.model.train()
        perm = rng.permutation(n_train)
        for start in range(0, n_train, config.batch_size):
            idx = np.sort(perm[start : start + config.batch_size])
            losses = _step(idx, pieces, rows, inputs["train"], running, held, optimizer, groups, device,
                           results, active)
            for name, loss in losses.items():
                if name in averages:
                    averages[name].update()
                train_sum[name] += loss * len(idx)
        averaged = [name for name in running if name in averages]
        with ExitStack() as swapped:  # validate (and keep) the averaged weights; train on from the raw ones
            for name in averaged:
                swapped.enter_context(averages[name].swapped_in())
            val = score_jobs(list(running.values()), inputs["val"], "val", device, config.batch_size)
            keep = {name: copy.deepcopy(running[name].model.state_dict()) for name in averaged}
        for name in list(running):
            outcome = val[name] if isinstance(val[name], Exception) else \
                courses[name].epoch(epoch, float(train_sum[name]) / n_train, val[name][0], keep.get(name))
            if isinstance(outcome, Exception):
                record_failure(results[name], outcome, active, name)
            if outcome is not True:
                running.pop(name)
        if progress:
            progress(1)
    for j in jobs:
        courses[j.name].conclude()


def _step(idx: np.ndarray, pieces: int | None, rows: torch.Tensor | None, train: RowReader,
          running: dict[str, ProbeJob], held: HeldCodes | None, optimizer: torch.optim.Optimizer,
          groups: dict[str, dict], device: str, results: dict[str, FitResult],
          active: dict[str, ProbeJob]) -> dict[str, torch.Tensor]:
    """One optimiser step of the running jobs on the training rows `idx`; returns each stepped job's
    mean bits on them (a tensor: not read here). The rows go through the probes in even pieces of at
    most `pieces` rows (`piece_rows`; None: at once), each piece's share of the batch's mean loss
    back-propagated as it goes: the gradient of the whole batch, up to its rounding, and on a CPU
    almost twice as fast where a batch of spatial rows outgrows the caches. A job that raises
    becomes an error row and is not stepped; a backward pass or step that raises fails every job in it."""
    optimizer.zero_grad(set_to_none=True)  # a job that stopped keeps no gradient: not stepped
    totals: dict[str, torch.Tensor] = {}
    for a, b in read_spans(len(idx), len(idx), pieces):
        part = idx[a:b]
        if rows is not None:
            index = torch.from_numpy(part).to(device, non_blocking=True)
            x = rows[index].float()  # held as stored (float16): upcast exactly, batch by batch
        else:
            index, x = part, torch.from_numpy(train.take(part)).to(device)
        losses = {}
        for name, j in list(running.items()):
            try:
                bits = batch_bits(j, "train", index, x, device, j.optim.amp, held)[0]
                # the piece's share of the batch's mean (a whole batch: its mean, as CUDA's kernel rounds it)
                losses[name] = bits.mean() if len(part) == len(idx) else bits.sum() / len(idx)
            except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
                _drop([name], e, running, groups, results, active)
                totals.pop(name, None)
        try:
            if losses:
                torch.autograd.backward(list(losses.values()))
        except Exception as e:  # noqa: BLE001 — then every job of the step fails
            _drop([*totals, *losses], e, running, groups, results, active)
            return {}
        for name, loss in losses.items():
            totals[name] = totals[name] + loss.detach() if name in totals else loss.detach()
    try:
        if totals:
            optimizer.step()
    except Exception as e:  # noqa: BLE001 — then every job of the step fails
        _drop(list(totals), e, running, groups, results, active)
        return {}
    return totals


def _drop(names: Sequence[str], error: Exception, running: dict[str, ProbeJob], groups: dict[str, dict],
          results: dict[str, FitResult], active: dict[str, ProbeJob]) -> None:
    """Jobs that raised in a step: error rows, out of the running ones, and nothing of theirs stepped."""
    for name in dict.fromkeys(names):
        record_failure(results[name], error, active, name)
        running.pop(name, None)
        for param in groups[name]["params"]:
            param.grad = None


def _held_on_device(jobs: Sequence[ProbeJob], train: RowReader, device: str, config: TrainConfig
                    ) -> tuple[torch.Tensor | None, HeldCodes | None]:
    """On CUDA, the training split's rows as stored (float16: half the bytes; where they fit the stack's
    memory budget on the device and the fit's on the host, `held_bytes`) and every job's codes,
    moved to the device once for the stage: a step then indexes them there instead of waiting for
    copies from the host. On a CPU (None, None): the rows are read batch by batch, so that resident
    memory stays at a few batches whatever the split's size."""
    if not device.startswith("cuda"):
        return None, None
    size = len(train) * train.row_bytes
    fits = size <= stack_budget(config, device) and size <= held_bytes(config)
    rows = torch.from_numpy(train.read_all(dtype=None)).to(device) if fits else None
    return rows, HeldCodes(jobs, "train", device)


def adamw(groups: list[dict]) -> torch.optim.AdamW:
    """AdamW over parameter `groups` (each with its own "lr" and "weight_decay") with its fused
    kernel, one pass over a group's tensors per step (torch < 2.4 has none on a CPU: its
    multi-tensor form there). Stepped one tensor at a time, as torch does on a CPU by default, the
    optimiser took half of a quadratic or dnn probe's gradient stage."""
    try:
        return torch.optim.AdamW(groups, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, foreach=True)
