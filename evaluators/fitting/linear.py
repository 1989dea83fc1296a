"""The linear stage: every probe's linear part along an L2 and then an L1 penalty path, the
strength chosen on validation, solved as one batched problem per design
(`evaluators.fitting.linear_solver`; `evaluators.fitting.fit_probes`, step 1)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from evaluators.fitting.data import FitResult, ProbeJob, RowReader, TrainConfig, to_device
from evaluators.fitting.scoring import record_failure
from evaluators.fitting.linear_problems import LinearProblem, PathSettings
from evaluators.fitting.linear_solver import PathSolution, solve_path
from evaluators.probes.base import strictly_lower


def linear_stage(jobs: Sequence[Sequence[ProbeJob]], inputs: Sequence[dict[str, RowReader]], config: TrainConfig,
                 device: str, results: Sequence[dict[str, FitResult]], active: Sequence[dict[str, ProbeJob]]) -> None:
    """Fit every linear problem of every row set (lists indexed by row set) along the penalty path
    (`evaluators.fitting.linear_solver`), and give every job its target's chosen solution.

    A row set's problems are grouped by the input they read (targets with the same design share
    one rotation and one solve, `_row_set_problems`); the same group of every row set — the same
    targets on an input of the same shape — is stacked into one batched solve, the row set its
    batch dimension. Should a stacked solve fail, each of its row sets is solved alone, so that
    one row set's failure costs only its own rows.

    One strength for all bits of a target: choosing per bit (each bit's logit reads only its own
    rows of the linear parameters, so it could) overfits validation wherever a bit is free in few
    scenes — on a 1-bit task whose bit moves over 64 positions, oracle:features read β* −0.87.
    The L1 path starts from the best L2 solution; its bias keeps an L2 penalty of the same
    strength (a bias is not sparse, and L1 would pull a rarely free bit's bias to its noise)."""
    if not any(jobs):
        return
    if not config.l2_path and not config.l1_path:
        raise ValueError("the linear stage needs at least one L2 or L1 strength")
    refine = config.l2_refine  # a tuple of ratios; one number is one ratio, as before version 9
    refine = (float(refine),) if isinstance(refine, (int, float)) else tuple(refine or ())
    settings = PathSettings(config.l2_path, config.l1_path, config.l1_eps, refine, config.linear_iterations,
                            config.l1_iterations, config.l1_first_iterations)
    made: dict[tuple, tuple] = {}  # problems shared by row sets (`_linear_problem`)
    found = [(r, group) for r, (mine, rows) in enumerate(zip(jobs, inputs))
             for group in _row_set_problems(mine, rows, device, results[r], active[r], made)]
    # each group is stacked with the first group of its shapes where it poses the same problems; one
    # read for every group's check (inputs holding NaN or inf fail their targets) and comparison with
    # its first, however many row sets
    shapes = [_shapes(group) for _, group in found]
    first: dict[tuple, int] = {}
    checks: list[tuple[int, torch.Tensor]] = []
    for i, (_, group) in enumerate(found):
        lead = first.setdefault(shapes[i], i)
        if lead != i:
            checks.append((i, _equal_problems(found[lead][1], group)))
    compared = [(i, c) for i, c in checks if isinstance(c, torch.Tensor)]
    flags = torch.stack([torch.isfinite(g[0]).all() & torch.isfinite(g[1]).all() for _, g in found]
                        + [c for _, c in compared]).tolist() if found else []
    finite = flags[:len(found)]
    equal = {**dict(checks), **dict(zip((i for i, _ in compared), flags[len(found):]))}
    stacks: list[list[tuple[int, _Group]]] = []  # the same group of several row sets: [(row set, group)]
    home_of: dict[int, list[tuple[int, _Group]]] = {}  # a first group's stack
    for i, ((r, group), ok) in enumerate(zip(found, finite)):
        if not ok:
            for members, _, _ in group[2]:
                for job in members:
                    record_failure(results[r][job.name], FloatingPointError("the activations hold NaN or inf"), active[r],
                                   job.name)
            continue
        lead = first[shapes[i]]
        home = home_of.get(lead) if equal.get(i) else None
        if home is None and i != lead:  # not its first's problems: any other stack's (as rare as it is)
            home = next((st for st in stacks if _stackable(st[0][1], group)), None)
        if home is None:
            home = home_of[i] = []
            stacks.append(home)
        home.append((r, group))
    for stack in stacks:
        if len(stack) == 1:
            _linear_stage_alone(stack[0], settings, results, active)
            continue
        try:
            solved = _solve(stack, settings)
        except Exception:  # noqa: BLE001 — alone, a failing row set fails only its own targets
            for one in stack:
                _linear_stage_alone(one, settings, results, active)
            continue
        host = _on_host(solved)
        for i, (r, group) in enumerate(stack):
            _assign(group, solved, i, settings, results[r], active[r], host)


#: One row set's targets that read the same input: (design on train, on val, [(jobs, train problem,
#: val problem)]), jobs of one entry sharing one problem.
_Group = tuple[torch.Tensor, torch.Tensor, list[tuple[list[ProbeJob], LinearProblem, LinearProblem]]]


def _row_set_problems(jobs: Sequence[ProbeJob], inputs: dict[str, RowReader], device: str,
                      results: dict[str, FitResult], active: dict[str, ProbeJob],
                      made: dict[tuple, tuple]) -> list[_Group]:
    """One row set's linear problems (one per `linear_key`), grouped by the input they read; a
    target whose problem cannot be built becomes error rows of its jobs here. `made`: the problems
    built so far, for other row sets to share (`_linear_problem`)."""
    if not jobs:
        return []
    keyed: dict[str, list[ProbeJob]] = {}
    for job in jobs:
        keyed.setdefault(job.linear_key if job.linear_key is not None else "\0" + job.name, []).append(job)
    raw = {s: torch.from_numpy(inputs[s].read_all()).to(device) for s in ("train", "val")}
    groups: list[_Group] = []
    for members in keyed.values():
        try:
            x_train, train = _linear_problem(members[0], raw["train"], "train", device, made)
            x_val, val = _linear_problem(members[0], raw["val"], "val", device, made)
        except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
            for job in members:
                record_failure(results[job.name], e, active, job.name)
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
    return groups


def _stackable(a: _Group, b: _Group) -> bool:
    """Whether two row sets' groups can be solved as one batch: inputs of one shape, and the
    same problems (targets, priors, extra features) in the same order."""
    return _shapes(a) == _shapes(b) and bool(_equal_problems(a, b))


def _shapes(group: _Group) -> tuple:
    """A group's shapes (its inputs', each problem's tensors'): two groups can stack only where these agree."""
    return (tuple(group[0].shape), tuple(group[1].shape),
            tuple(tuple(getattr(p[s], f).shape) for p in group[2] for s in (1, 2) for f in _PROBLEM_FIELDS))


def _equal_problems(a: _Group, b: _Group) -> torch.Tensor | bool:
    """Whether two groups of the same shapes (`_shapes`) pose the same problems: True where they hold
    the same problems (shared, `_linear_problem`), else a flag on the device (read once by the caller:
    `torch.equal` reads the device for each tensor, ~50 waits a row set)."""
    pairs = [(getattr(p[s], f), getattr(q[s], f)) for p, q in zip(a[2], b[2]) for s in (1, 2) for f in _PROBLEM_FIELDS]
    pairs = [(x, y) for x, y in pairs if x is not y]
    if not pairs:
        return True
    return torch.stack([(x == y).all() for x, y in pairs]).all()


def _solve(stack: list[tuple[int, _Group]], settings: PathSettings) -> list[PathSolution]:
    """One batched solve of a stack of row sets' groups (the first group's problems stand for all)."""
    problems = stack[0][1][2]
    x_train = torch.stack([g[0] for _, g in stack])
    x_val = torch.stack([g[1] for _, g in stack])
    return solve_path(x_train, x_val, [p[1] for p in problems], [p[2] for p in problems], settings)


def _linear_stage_alone(one: tuple[int, _Group], settings: PathSettings, results: Sequence[dict[str, FitResult]],
                        active: Sequence[dict[str, ProbeJob]]) -> None:
    """Solve one row set's group by itself; a failure becomes error rows of its targets."""
    r, group = one
    try:
        solved = _solve([one], settings)
    except Exception as e:  # noqa: BLE001 — a failing solve becomes error rows of its targets
        for members, _, _ in group[2]:
            for job in members:
                record_failure(results[r][job.name], e, active[r], job.name)
        return
    _assign(group, solved, 0, settings, results[r], active[r])


def _assign(group: _Group, solutions: list[PathSolution], i: int, settings: PathSettings,
            results: dict[str, FitResult], active: dict[str, ProbeJob],
            host: list[tuple[np.ndarray, ...]] | None = None) -> None:
    """Give the jobs of row set `i` of a stack their targets' chosen solutions and paths; `host`
    holds the solutions' choices, paths, flags and validation bits on the host (`_on_host`)."""
    kinds = settings.kinds
    for (members, _, _), sol, (choices, strengths, paths, flags, scenes) in zip(group[2], solutions,
                                                                                 host or _on_host(solutions)):
        choice, path, strength_of = int(choices[i]), paths[:, i].astype(float), strengths[:, i].astype(float)
        kind, strength = kinds[choice], float(strength_of[choice])
        setting = {"penalty": kind, "strength": strength, "lbfgs_converged": bool(flags[i])}
        scene = scenes[i]
        for job in members:
            r = results[job.name]
            if not math.isfinite(path[choice]):
                record_failure(r, FloatingPointError(f"validation loss is {path[choice]} at {kind.upper()} {strength:g}"),
                               active, job.name)
                continue
            _load_linear(job.model, sol.w[i], sol.v[i])
            r.l2_path, r.l1_path = (sorted(((float(s), float(v)) for k, s, v in zip(kinds, strength_of, path)
                                            if k == penalty), reverse=True) for penalty in ("l2", "l1"))
            r.val_bits, r.val_scene_bits = float(path[choice]), scene
            r.setting.update(setting)
            r.best_epoch, r.converged, r.history = 0, setting["lbfgs_converged"], [(math.nan, r.val_bits)]


def _on_host(solutions: list[PathSolution]) -> list[tuple[np.ndarray, ...]]:
    """(choice, path strengths, validation path, convergence flag, validation bits) of every target for
    every row set of a stack, read from the device once for the whole stack."""
    return [tuple(t.cpu().numpy() for t in (sol.choice, sol.strengths, sol.val_path, sol.converged,
                                            sol.val_scene_bits)) for sol in solutions]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and bool(torch.equal(a, b)))


def _same_problem(a: LinearProblem, b: LinearProblem) -> bool:
    """Whether two targets pose the same problem on the same input: solved once, they get the same
    solution, where two solves could differ in their last bits."""
    return all(_same(getattr(a, f), getattr(b, f)) for f in _PROBLEM_FIELDS)


#: What a `LinearProblem` is: two with these equal are the same problem.
_PROBLEM_FIELDS = ("targets", "offsets", "free", "extra", "extra_mask")


def _linear_problem(job: ProbeJob, x: torch.Tensor, split: str, device: str,
                    made: dict[tuple, tuple]) -> tuple[torch.Tensor, LinearProblem]:
    """(the standardised input the job's linear weights read, its linear problem) on one split.

    The problem is the job's labels' (targets, prior, condition), not its input's: `made` keeps
    each problem built, by the arrays it was built from and the probe's kind, and a row set whose
    job holds the same arrays (a stack's row sets share one task) gets the same problem, not a
    copy: built per row set, 26 row sets' problems were ~600 transfers and ~4,000 small kernels
    launched while the GPU waited, and ~2,600 more to find them equal."""
    model = job.model
    n = len(x)
    dtype = linear_dtype(device)
    key = (split, n, type(model), model.trains_context,
           *(id(a[split]) if a is not None else None for a in (job.targets, job.cond, job.prior)))
    # (the condition on the device, what the probe's design read of it, the problem)
    cond, read, problem = made.get(key, (None, None, None))
    if problem is None and job.cond is not None:
        cond = to_device(job.cond[split][:n], device).float()
    design, cond_read = model.linear_design(x, cond)
    if problem is not None and cond_read is read:
        return design.to(dtype), problem
    target = to_device(job.targets[split][:n], device).float()
    k = target.shape[1]
    extra, mask = [], []
    if model.trains_context:
        extra.append(target)
        mask.append(to_device(strictly_lower(k), device))
    if cond_read is not None:
        extra.append(cond_read)
        mask.append(torch.ones(k, cond_read.shape[1], device=device))
    extra.append(torch.ones(n, 1, device=device))
    mask.append(torch.ones(k, 1, device=device))
    if job.prior is not None:
        prior = to_device(job.prior[split][:n], device).float()
        free = torch.isfinite(prior)
        offsets = torch.where(free, prior, torch.zeros_like(prior))
    else:
        free, offsets = torch.ones_like(target, dtype=torch.bool), torch.zeros_like(target)
    problem = LinearProblem(*(t.to(dtype) for t in (target, offsets, free, torch.cat(extra, 1), torch.cat(mask, 1))))
    made.setdefault(key, (cond, cond_read, problem))
    return design.to(dtype), problem


def linear_dtype(device: str | torch.device) -> torch.dtype:
    """The linear stage's type: float64 on a CPU, float32 elsewhere. The path's weak strengths and
    its L1 path stop short of their optimum after a fixed budget of iterations, where a step's
    acceptance turns on the last bits of a float32 sum, which the processor's kernels round in their
    own order: forced onto MKL's AVX2, AVX-512 and compatible kernels in turn, one machine's float32
    L2 path read 1.31 and 0.47 validation bits at strength 1e-6 for the same target, and the
    strength chosen moved with it (another machine, another chosen strength, a β* 10 % apart). In
    float64 the whole L2 path agreed across those kernels to six digits, at ~35 % more CPU time
    for one row set's fit (10.1 -> 13.7 s, one thread, 2,000 scenes). On CUDA the numbers are the
    GPU's own anyway, and float64 costs far more there."""
    return torch.float64 if torch.device(device).type == "cpu" else torch.float32


@torch.no_grad()
def _load_linear(model: torch.nn.Module, w: torch.Tensor, v: torch.Tensor) -> None:
    """Set a probe's linear part from a solution: w (K x D), v (K x Q: [context], [cond], bias)."""
    k = w.shape[0]
    context = v[:, :k] if model.trains_context else None
    rest = v[:, k:] if model.trains_context else v
    model.set_linear(w, rest[:, -1], context, rest[:, :-1] if rest.shape[1] > 1 else None)


def bias_ids(model: torch.nn.Module) -> set[int]:
    """The probe's per-bit bias (its own or a wrapped probe's): the one linear parameter the
    gradient stage trains on, and the one the L1 path keeps under L2."""
    return {id(p) for name, p in model.named_parameters() if name in ("bias", "probe.bias")}
