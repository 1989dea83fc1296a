"""The linear stage: every probe's linear part along an L2 and then an L1 penalty path, the
strength chosen on validation, solved as one batched problem per design
(`evaluators.linear_solver`; `evaluators.fitting.fit_probes`, step 1)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from evaluators.fitting.data import FitResult, ProbeJob, RowReader, TrainConfig
from evaluators.fitting.scoring import _fail
from evaluators.linear_solver import LinearProblem, PathSettings, solve_path
from evaluators.probes import strictly_lower


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
        for gx, gv, problems in groups:  # targets that read the same input share one rotation and one solve
            if _same(gx, x_train) and _same(gv, x_val):
                twin = next((p for p in problems if _same_problem(p[1], train) and _same_problem(p[2], val)), None)
                if twin is not None:  # the same problem under another key (a blind reference of a Z that is F)
                    twin[0].extend(members)
                else:
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


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def _same_problem(a: LinearProblem, b: LinearProblem) -> bool:
    """Whether two targets pose the same problem on the same input: solved once, they get the same
    solution, where two solves could differ in their last bits."""
    return all(_same(getattr(a, f), getattr(b, f)) for f in ("targets", "offsets", "free", "extra", "extra_mask"))


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
