"""The linear stage's problems, stacked: what `solve_path` and its L-BFGS (`evaluators.fitting.lbfgs`) read.

A `LinearProblem` is one target's bits on one split; a `ProblemBatch` sets the targets of one
design side by side, bits of every target along one dimension, and computes what every objective
reads from them (logits with the prior offsets, the extra features' gradient and curvature) for
all row sets at once. `PathSettings` is the path and the solver's budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class LinearProblem:
    """One target's linear problem on one split: K bits read the shared design x (the row set's
    standardised input) and the target's own `extra` features [t_<k, cond, 1].

    `offsets` are the exact prior logits (0 where there is none), `free` is 0 where the prior
    fixes a bit in a scene (it then costs nothing and teaches nothing), `extra_mask[k, q]` says
    which extra features bit k may read (strictly earlier bits only; none of them when the
    context is not a parameter), and the bias is the last extra column."""

    targets: torch.Tensor  # n x K float
    offsets: torch.Tensor  # n x K float, finite
    free: torch.Tensor  # n x K float in {0, 1}
    extra: torch.Tensor  # n x Q float
    extra_mask: torch.Tensor  # K x Q float in {0, 1}

    @property
    def n_bits(self) -> int:
        return self.targets.shape[1]



@dataclass(frozen=True)
class PathSettings:
    """The path and the solver's budget (`TrainConfig` carries the user-facing copies)."""

    l2_path: tuple[float, ...]
    l1_path: tuple[float, ...]
    l1_eps: float = 1e-2
    #: after the L2 path, each target's best strength times and divided by each of these in turn (within
    #: the path's range) is solved too, each pair from the best solution so far (`TrainConfig.l2_refine`)
    refine: tuple[float, ...] = ()
    #: iterations per L2 strength (each one objective and gradient on the training rows): warm-started
    #: with the curvature pairs of the last strength, a step along the path needs few
    iterations: int = 8
    #: iterations per L1 strength: the smoothed L1 penalty is not quadratic, so each of its strengths
    #: starts without curvature pairs, and a few strong inputs take long to grow
    l1_iterations: int = 25
    #: iterations at the first L1 strength, which starts from the best L2 solution, further from its optimum
    l1_first_iterations: int = 30
    memory: int = 10
    #: a bit stops moving when every component of its gradient is below this
    tolerance: float = 1e-5
    #: a target's solution counts as converged when the training loss that its solver still expects
    #: to gain (summed over its bits, bits per scene) is below this: a thousandth of a bit is far
    #: inside any result's interval, where a fixed budget leaves some bits short of the gradient test
    slack: float = 1e-3

    @property
    def refined(self) -> int:
        """How many refined L2 strengths follow the L2 path: two (one each side of the best) per ratio."""
        return 2 * len(self.refine) if len(self.l2_path) > 1 else 0

    @property
    def kinds(self) -> list[str]:
        """The penalty of each entry of the path: the L2 strengths, the refined ones, the L1 strengths."""
        return ["l2"] * (len(self.l2_path) + self.refined) + ["l1"] * len(self.l1_path)



class ProblemBatch:
    """The stacked problems of one design: bits of every target side by side (B = Σ K)."""

    def __init__(self, problems: list[LinearProblem]) -> None:
        self.sizes = [p.n_bits for p in problems]
        self.starts = [sum(self.sizes[:i]) for i in range(len(problems))]
        self.q_max = max(p.extra.shape[1] for p in problems)
        self.problems = problems
        dev = problems[0].targets.device
        self.owner = torch.cat([torch.full((k,), i, device=dev, dtype=torch.long) for i, k in enumerate(self.sizes)])
        self.targets = torch.cat([p.targets for p in problems], 1)
        self.offsets = torch.cat([p.offsets for p in problems], 1)
        self.free = torch.cat([p.free for p in problems], 1)
        self.weight = self.free / len(self.free)  # a scene's share of the mean loss where its bit is free
        mask = torch.zeros(len(self.owner), self.q_max, device=dev, dtype=self.targets.dtype)
        for p, s in zip(problems, self.starts):
            mask[s : s + p.n_bits, : p.extra.shape[1]] = p.extra_mask
        self.v_mask = mask  # B x Qmax
        bias_col = torch.tensor([s.extra.shape[1] - 1 for s in problems], device=dev)[self.owner]  # B
        self.is_bias = F.one_hot(bias_col, self.q_max).to(mask.dtype) * mask  # B x Qmax
        # a scene's loss is softplus(sign·z) and its residual p − t is sign·sigmoid(sign·z), sign = 1 − 2t
        self.sign = 1 - 2 * self.targets
        self.extra_squares = [p.extra.square() for p in problems]  # the curvature's reads, every objective

    def logits(self, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """R x n x B logits (prior offsets included) of weights w (R x B x D) and v (R x B x Q)."""
        z = torch.baddbmm(self.offsets.expand(x.shape[0], -1, -1), x, w.transpose(1, 2))
        parts = [torch.einsum("nq,rkq->rnk", p.extra, v[:, s : s + p.n_bits, : p.extra.shape[1]])
                 for p, s in zip(self.problems, self.starts)]
        return z + torch.cat(parts, dim=2)

    def extra_grad(self, resid: torch.Tensor) -> torch.Tensor:
        """R x B x Qmax: the extra features' gradient of the mean loss, given resid = free·(p − t)/n."""
        g = resid.new_zeros(resid.shape[0], len(self.owner), self.q_max)
        for p, s in zip(self.problems, self.starts):
            g[:, s : s + p.n_bits, : p.extra.shape[1]] = _per_row_set(resid[:, :, s : s + p.n_bits], p.extra)
        return g * self.v_mask

    def extra_curvature(self, weight: torch.Tensor) -> torch.Tensor:
        """R x B x Qmax: the diagonal of the extra features' Hessian, given weight = free·p(1 − p)/n."""
        h = weight.new_zeros(weight.shape[0], len(self.owner), self.q_max)
        for sq, s, k in zip(self.extra_squares, self.starts, self.sizes):
            h[:, s : s + k, : sq.shape[1]] = _per_row_set(weight[:, :, s : s + k], sq)
        return h * self.v_mask

    def per_target(self, per_bit: torch.Tensor) -> torch.Tensor:
        """Sum the last (bit) dimension within each target: ... x B -> ... x P."""
        return torch.stack([per_bit[..., s : s + k].sum(-1) for s, k in zip(self.starts, self.sizes)], -1)


def _per_row_set(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """R x K x Q = aᵀb for every row set, a R x n x K and b n x Q, summed over the scenes in the
    same order whatever R: `einsum` folds the row sets into one product, and a batched product
    with one column takes another kernel for one row set than for several, either of which made
    a row set's numbers depend on its batch-mates (Q is 1 for a probe that reads only its bias)."""
    if b.shape[1] == 1:
        return (a * b[None, :, :]).sum(1)[..., None]
    return torch.bmm(a.transpose(1, 2), b.expand(a.shape[0], -1, -1))
