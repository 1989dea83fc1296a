"""The linear stage as one batched problem: penalised logistic regressions along a penalty path.

A probe's linear part reads bit k from [z, t_<k, cond, 1] alone, so with the rest of the probe
at zero every bit is its own logistic regression, and so is every row set (a backbone's layer
and tokens choice). `solve_path` fits all of them at once — bits of every target, row sets stacked
along a leading batch dimension — for each strength of an L2 path and then a short smoothed-L1
path, each warm-started from the last, and keeps per target the strength whose solution codes
validation in the fewest bits (one strength for all bits of a target, as before).

The solver (`evaluators.fitting.lbfgs`) is a limited-memory BFGS in tensor operations, every
(row set, bit) its own problem, with no value read back to the host inside the path; the problems
it reads are stacked in `evaluators.fitting.linear_problems`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from evaluators.fitting.batched_linalg import eigh
from evaluators.fitting.lbfgs import BatchedLBFGS
from evaluators.fitting.linear_problems import LinearProblem, PathSettings, ProblemBatch


@dataclass
class PathSolution:
    """Per target (list index as given), the chosen solution and its path, for every row set.

    `w`: R x K x D in the design's own coordinates; `v`: R x K x Q (the extra features'
    weights, the bias last); `choice`: R, the index into the path (`PathSettings.kinds`)
    validation chose; `strengths`: S x R, each path entry's strength (the refined L2 strengths
    are the target's own); `val_path`: S x R mean validation bits per entry; `val_scene_bits`:
    R x n_val of the chosen solution; `converged`: R, whether the chosen solution is within
    `PathSettings.slack` of its strength's optimum (`BatchedLBFGS.remaining`)."""

    w: torch.Tensor
    v: torch.Tensor
    choice: torch.Tensor
    strengths: torch.Tensor
    val_path: torch.Tensor
    val_scene_bits: torch.Tensor
    converged: torch.Tensor



def _principal_axes(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues and eigenvectors of covariances (R x D x D), in their type. On CUDA solved in
    float64: cuSOLVER solves a float32 matrix 32 to 512 wide by Jacobi sweeps, one matrix after
    another (9 ms a 384-wide one on an H200, 0.7 s of a 26-row-set fit), a float64 one by divide
    and conquer (3.5 ms)."""
    if cov.device.type != "cuda":
        return eigh(cov)
    evals, evecs = torch.linalg.eigh(cov.double())
    return evals.to(cov.dtype), evecs.to(cov.dtype)


def solve_path(x_train: torch.Tensor, x_val: torch.Tensor, train: list[LinearProblem], val: list[LinearProblem],
               settings: PathSettings) -> list[PathSolution]:
    """Fit every target of `train` on every row set of `x_train` (R x n x D, standardised) along
    the path, choose each target's strength on `val` (R x n_val x D), and return its solution.

    After the L2 path, each target's best strength is refined (`PathSettings.refine`, one ratio
    after the other): the strengths that far stronger and weaker are solved from its best solution
    so far, so that a coarse path chooses as finely as one with those strengths on it wherever
    validation has one minimum (a decade path refined by a half and then a quarter decade chooses
    what the quarter-decade path did, at 11 solves instead of 25). The L1 path (smoothed,
    sqrt(w² + eps²) − eps on every weight but the bias, which keeps an L2 penalty of the same
    strength) starts from each target's best L2 solution."""
    batch, vbatch = ProblemBatch(train), ProblemBatch(val)
    r, n, d = x_train.shape
    cov = x_train.transpose(1, 2) @ x_train / n
    evals, evecs = _principal_axes(cov)  # R x D, R x D x D
    evals = evals.clamp_min(0)
    xt, xv = x_train @ evecs, x_val @ evecs
    # each (row set, bit)'s parameters in one tensor: the weights w (D, in the principal axes) then v (Qmax)
    theta = x_train.new_zeros(r, len(batch.owner), d + batch.q_max)
    solver = BatchedLBFGS(batch, xt, evals, evecs, settings)
    data = solver.data_terms(theta)  # the training loss's part of the objective at θ: a new penalty reuses it
    kinds = settings.kinds
    n_targets = len(train)
    best_val = x_train.new_full((r, n_targets), math.inf)
    best_theta, best_data = theta.clone(), data
    best_scene = x_train.new_zeros(r, n_targets, x_val.shape[1])
    best_choice = torch.zeros(r, n_targets, dtype=torch.long, device=x_train.device)
    best_conv = torch.zeros(r, n_targets, dtype=torch.bool, device=x_train.device)
    val_path = x_train.new_zeros(len(kinds), r, n_targets)
    # each entry's strength, per row set and target, in float64: a path's own strengths are reported as given
    path = x_train.new_zeros(len(kinds), r, n_targets, dtype=torch.float64)
    n_l2 = len(settings.l2_path)
    grid = torch.tensor(settings.l2_path, dtype=torch.float64, device=x_train.device)
    previous: str | None = None
    for i, kind in enumerate(kinds):
        if n_l2 <= i < n_l2 + settings.refined:  # one side of each target's best L2 strength, from its solution
            level, side = divmod(i - n_l2, 2)
            if side == 0:
                best_strength = path.gather(0, best_choice[None]).squeeze(0)
                anchor = (best_strength, best_theta, best_data)  # R x P, and the solutions
            ratio = settings.refine[level] if side == 0 else 1 / settings.refine[level]
            strength = (anchor[0] * ratio).clamp(grid.min(), grid.max())
            path[i] = strength
            theta, data, remaining = solver.solve(anchor[1], anchor[2], kind,
                                                  strength[:, batch.owner].to(x_train.dtype), True, settings.iterations)
        else:
            strength = settings.l2_path[i] if kind == "l2" else settings.l1_path[i - n_l2 - settings.refined]
            path[i] = strength
            iterations = settings.iterations if kind == "l2" else settings.l1_iterations
            if previous == "l2" and kind == "l1":  # the L1 path starts from the best L2, further from its optimum
                theta, data, iterations = best_theta, best_data, settings.l1_first_iterations
            theta, data, remaining = solver.solve(theta, data, kind, strength, previous != kind, iterations)
        previous = kind
        scene = _scene_bits(vbatch, xv, theta[..., :d], theta[..., d:])  # R x n_val x P
        mean = scene.mean(1)
        val_path[i] = mean
        better = mean < best_val  # the first of equals is kept, as before
        best_val = torch.where(better, mean, best_val)
        best_scene = torch.where(better[..., None], scene.transpose(1, 2), best_scene)
        best_choice = torch.where(better, i, best_choice)
        conv_target = batch.per_target(remaining) / math.log(2) <= settings.slack
        best_conv = torch.where(better, conv_target, best_conv)
        bit_better = better[:, batch.owner]
        best_theta = torch.where(bit_better[..., None], theta, best_theta)
        best_data = _where(bit_better, data, best_data)
    w_orig = torch.einsum("red,rbd->rbe", evecs, best_theta[..., :d])
    best_v = best_theta[..., d:]
    out = []
    for p, (s, k) in enumerate(zip(batch.starts, batch.sizes)):
        out.append(PathSolution(w_orig[:, s : s + k], best_v[:, s : s + k, : train[p].extra.shape[1]],
                                best_choice[:, p], path[:, :, p], val_path[:, :, p], best_scene[:, p], best_conv[:, p]))
    return out


def _scene_bits(batch: ProblemBatch, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """R x n x P: each target's code length per scene in bits (bits fixed by the prior cost 0)."""
    z = batch.logits(x, w, v)
    nats = F.binary_cross_entropy_with_logits(z, batch.targets.expand_as(z), reduction="none") * batch.free
    return batch.per_target(nats) / math.log(2)


def _where(ok: torch.Tensor, new: tuple[torch.Tensor, ...], old: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Per (row set, bit) (`ok`: R x B), the new or the old of each of a point's tensors (R x B or R x B x P)."""
    return tuple(torch.where(ok if a.dim() == 2 else ok[..., None], a, b) for a, b in zip(new, old))
