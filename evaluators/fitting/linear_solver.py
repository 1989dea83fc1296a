"""The linear stage as one batched problem: penalised logistic regressions along a penalty path.

A probe's linear part reads bit k from [z, t_<k, cond, 1] alone, so with the rest of the probe
at zero every bit is its own logistic regression, and so is every row set (a backbone's layer
and token view). `solve_path` fits all of them at once — bits of every target, row sets stacked
along a leading batch dimension — for each strength of an L2 path and then a short smoothed-L1
path, each warm-started from the last, and keeps per target the strength whose solution codes
validation in the fewest bits (one strength for all bits of a target, as before).

The solver is a limited-memory BFGS written in tensor operations: every (row set, bit) carries
its own memory, step and convergence mask, a rejected step (Armijo's condition fails) is undone
and retried shorter by that problem alone, and a fixed budget of iterations per strength
replaces the host-side tests that `torch.optim.LBFGS` makes at every iteration. Nothing inside
the path reads a value back to the host, so the number of host synchronisations does not grow
with strengths, row sets or bits, and on a GPU the whole path is a stream of kernels. On CUDA an
iteration (a few hundred kernels, ~380 operations, most of them the two-loop recursion's) is
captured once per penalty kind and ring slot and replayed (`evaluators.fitting.cuda_graphs`): launched
from Python one by one they were the linear stage's 2.9 s for 26 row sets on an H200. For that an
iteration moves the solver's own tensors in place and reads the strength from a tensor.

Why it needs few iterations: inputs are rotated into their principal axes (an orthogonal map,
so the L2 penalty is unchanged) and L-BFGS starts each iteration from the Hessian the logistic
loss would have if every scene carried its bit's mean curvature — diagonal in those axes. The
eigenvalues of standardised backbone features span orders of magnitude; that preconditioner
takes the spread out, and the memory corrects for the curvature that varies from scene to
scene. Along an L2 path the memory stays valid: the penalty's Hessian moves by the change of
strength times the identity, which is added to the stored curvature pairs. And a solve that
starts where another stopped (the next strength, a refinement, the L1 path from the best L2)
reuses the training loss's terms there (`_LBFGS.data_terms`): only the penalty changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch.nn import functional as F

from evaluators.fitting.batched_linalg import eigh
from evaluators.fitting.cuda_graphs import GraphedStep


#: The devices whose iterations are replayed from CUDA graphs (`_LBFGS.iterate`; CUDA only: a
#: benchmark empties it to time the eager path).
GRAPHED_DEVICES = ("cuda",)


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


@dataclass
class PathSolution:
    """Per target (list index as given), the chosen solution and its path, for every row set.

    `w`: R x K x D in the design's own coordinates; `v`: R x K x Q (the extra features'
    weights, the bias last); `choice`: R, the index into the path (`PathSettings.kinds`)
    validation chose; `strengths`: S x R, each path entry's strength (the refined L2 strengths
    are the target's own); `val_path`: S x R mean validation bits per entry; `val_scene_bits`:
    R x n_val of the chosen solution; `converged`: R, whether the chosen solution is within
    `PathSettings.slack` of its strength's optimum (`_LBFGS.remaining`)."""

    w: torch.Tensor
    v: torch.Tensor
    choice: torch.Tensor
    strengths: torch.Tensor
    val_path: torch.Tensor
    val_scene_bits: torch.Tensor
    converged: torch.Tensor


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


class _Batch:
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


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per (row set, bit) inner product of two parameter tensors (R x B x P)."""
    return torch.linalg.vecdot(a, b)


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
    batch, vbatch = _Batch(train), _Batch(val)
    r, n, d = x_train.shape
    cov = x_train.transpose(1, 2) @ x_train / n
    evals, evecs = _principal_axes(cov)  # R x D, R x D x D
    evals = evals.clamp_min(0)
    xt, xv = x_train @ evecs, x_val @ evecs
    # each (row set, bit)'s parameters in one tensor: the weights w (D, in the principal axes) then v (Qmax)
    theta = x_train.new_zeros(r, len(batch.owner), d + batch.q_max)
    solver = _LBFGS(batch, xt, evals, evecs, settings)
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


def _scene_bits(batch: _Batch, x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """R x n x P: each target's code length per scene in bits (bits fixed by the prior cost 0)."""
    z = batch.logits(x, w, v)
    nats = F.binary_cross_entropy_with_logits(z, batch.targets.expand_as(z), reduction="none") * batch.free
    return batch.per_target(nats) / math.log(2)


class _LBFGS:
    """Batched L-BFGS over (row set, bit) problems sharing one rotated design. A problem's
    parameters are one row of an R x B x P tensor θ = [w, v] (P = D + Qmax), so that each step of
    the two-loop recursion is one product and one update over all of them."""

    def __init__(self, batch: _Batch, x: torch.Tensor, evals: torch.Tensor, evecs: torch.Tensor,
                 settings: PathSettings) -> None:
        self.batch, self.x, self.evals, self.evecs, self.settings = batch, x, evals, evecs, settings
        r, b, self.d, m = x.shape[0], len(batch.owner), x.shape[2], settings.memory
        width = self.d + batch.q_max
        self.mask = torch.cat([batch.v_mask.new_ones(b, self.d), batch.v_mask], 1)  # B x P: the parameters in use
        self.lasso = torch.cat([batch.v_mask.new_zeros(b, self.d), batch.v_mask - batch.is_bias], 1)  # v's L1 part
        self.is_bias = torch.cat([batch.v_mask.new_zeros(b, self.d), batch.is_bias], 1)
        self.evecs_squared = evecs.square()  # the smoothed L1's curvature on the principal axes, every L1 objective
        self.s = x.new_zeros(m, r, b, width)
        self.y = x.new_zeros(m, r, b, width)
        self.rho = x.new_zeros(m, r, b)
        self.head = 0
        self.strength: float | torch.Tensor = 0.0
        # the point an iteration moves and the strength it reads, written in place (a graph reads them):
        # θ, the training loss's terms there (`data_terms`), the objective, its gradient and preconditioner
        # (`penalised`), and each problem's step length
        self.penalty = x.new_zeros(r, b)
        self.theta = x.new_zeros(r, b, width)
        self.data = (x.new_zeros(r, b), x.new_zeros(r, b, width), x.new_zeros(r, b, width))
        self.f, self.g, self.h = x.new_zeros(r, b), x.new_zeros(r, b, width), x.new_zeros(r, b, width)
        self.step = x.new_zeros(r, b)
        self.left = x.new_zeros(r, b)  # what each problem is still expected to gain (`remaining`)
        self.graphs = GraphedStep(x.device) if x.device.type in GRAPHED_DEVICES else None

    def data_terms(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The training loss's part of the objective at θ: (loss per (row set, bit), its gradient, the
        diagonal of its curvature in the principal axes). It does not depend on the penalty, so a
        solve that starts where another stopped reuses it."""
        batch, d = self.batch, self.d
        u = batch.logits(self.x, theta[..., :d], theta[..., d:]).mul_(batch.sign)  # R x n x B
        sig = torch.sigmoid(u)  # |p − t|
        loss = (F.softplus(u) * batch.weight).sum(1)  # R x B
        a = sig * batch.weight
        resid = a * batch.sign  # free·(p − t)/n
        curve = torch.addcmul(a, a, sig, value=-1)  # free·p(1 − p)/n
        g = torch.cat([torch.bmm(resid.transpose(1, 2), self.x), batch.extra_grad(resid)], -1)
        h = torch.cat([curve.sum(1)[..., None] * self.evals[:, None, :], batch.extra_curvature(curve)], -1)
        return loss, g, h

    def penalised(self, theta: torch.Tensor, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], kind: str,
                  strength: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss per (row set, bit), its gradient, the diagonal preconditioner) at θ, the training
        loss's part given (`data_terms`), with a `strength` per (row set, bit)."""
        loss, g, h = data
        each = strength[..., None]  # over the parameters
        if kind == "l2":
            loss = loss + 0.5 * strength * (theta * theta * self.mask).sum(-1)
            g = g + each * theta * self.mask
            h = h + each * self.mask
        else:
            eps, w, v = self.settings.l1_eps, theta[..., : self.d], theta[..., self.d :]
            orig = torch.einsum("red,rbd->rbe", self.evecs, w)  # the weights on the input's own axes
            root = (orig * orig + eps * eps).sqrt()
            lasso_v = (theta * theta + eps * eps).sqrt()  # v's part is read (w's is masked out)
            loss = loss + strength * ((root - eps).sum(-1) + ((lasso_v - eps) * self.lasso).sum(-1)
                                      + 0.5 * (theta * theta * self.is_bias).sum(-1))
            g = g + each * (torch.cat([torch.bmm(orig / root, self.evecs), torch.zeros_like(v)], -1)
                            + theta / lasso_v * self.lasso + theta * self.is_bias)
            # the smoothed L1's curvature is diagonal on the input's own axes: its diagonal on the principal ones
            h = h + each * (torch.cat([torch.bmm(eps * eps / root.pow(3), self.evecs_squared),
                                       torch.zeros_like(v)], -1)
                            + eps * eps / lasso_v.pow(3) * self.lasso + self.is_bias)
        # a coordinate no feature reaches has zero curvature: keep the step finite there
        return loss, g, torch.where(self.mask > 0, h.clamp_min(1e-12), 1.0)

    def direction(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """−H·g by the two-loop recursion (newest pair first), H0 the diagonal preconditioner."""
        m = self.settings.memory
        q = g.clone()
        alphas = []
        for i in range(m):
            j = (self.head - 1 - i) % m
            a = self.rho[j] * _dot(self.s[j], q)
            q.addcmul_(a[..., None], self.y[j], value=-1)
            alphas.append((j, a))
        r = q.div_(h)
        for j, a in reversed(alphas):
            beta = self.rho[j] * _dot(self.y[j], r)
            r.addcmul_((a - beta)[..., None], self.s[j])
        return r.mul_(self.mask).neg_()

    def solve(self, theta: torch.Tensor, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], kind: str,
              strength: float | torch.Tensor, restart: bool, iterations: int
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """`iterations` at one strength (one number, or one per (row set, bit)) from θ, whose
        `data_terms` are `data`; (θ, its data terms, the training loss each bit is still expected
        to gain, `remaining`). On CUDA each iteration is replayed from a graph (`iterate`)."""
        if restart or kind != "l2":
            self.rho.zero_()
            self.s.zero_()
            self.y.zero_()
        else:  # an L2 penalty's Hessian moves by the change of strength: so do the stored pairs
            shift = strength - self.strength
            # s is 0 off the mask: no parameter there moves
            self.y.add_(self.s * (shift[..., None] if isinstance(shift, torch.Tensor) else shift))
            sy = _dot(self.s, self.y)
            self.rho.copy_(torch.where(sy > 1e-12, 1.0 / sy.clamp_min(1e-12), torch.zeros_like(sy)))
        self.strength = strength
        if isinstance(strength, torch.Tensor):
            self.penalty.copy_(strength)
        else:
            self.penalty.fill_(strength)
        self.theta.copy_(theta)
        for mine, given in zip(self.data, data):
            mine.copy_(given)
        self._run(("start", kind), partial(self._start, kind))
        for _ in range(iterations):
            self._run(kind, partial(self.iterate, kind))
            if self.graphs is None:  # graphed, the head stays and the pairs move (`_slot`)
                self.head += 1
        self._run("left", self._left)
        return self.theta.clone(), tuple(t.clone() for t in self.data), self.left.clone()

    def _run(self, key: str | tuple[str, str], step: Callable[[], None]) -> None:
        """`step` (which reads and writes only the solver's own tensors), replayed from its graph
        for `key` on CUDA: an iteration, and what a solve does before its first and after its last
        (the objective at its start, `remaining` at its end: ~150 operations a solve, ~12,000
        launched from Python for 26 row sets)."""
        if self.graphs is None:
            step()
        else:
            self.graphs.run(key, step)

    def _start(self, kind: str) -> None:
        """The objective, gradient and preconditioner at the solve's starting point; a full step first."""
        for mine, given in zip((self.f, self.g, self.h), self.penalised(self.theta, self.data, kind, self.penalty)):
            mine.copy_(given)
        self.step.fill_(1.0)

    def _left(self) -> None:
        """What each problem still expects to gain at the solve's end (`remaining`), into `left`."""
        self.left.copy_(self.remaining(self.g, self.h, self.settings.tolerance))

    def iterate(self, kind: str) -> None:
        """One iteration of every problem from the solver's point (`theta`, `data`, `f`, `g`, `h`,
        `step`), which it moves in place, storing its curvature pair in the ring (`_slot`)."""
        theta, data, f, g, h, step = self.theta, self.data, self.f, self.g, self.h, self.step
        active = g.abs().amax(-1) > self.settings.tolerance
        d = self.direction(g, h)
        slope = _dot(g, d)
        downhill = (slope < 0) & torch.isfinite(slope)
        d = torch.where(downhill[..., None], d, -g / h * self.mask)  # lost curvature: a scaled gradient step
        slope = torch.where(downhill, slope, _dot(g, d))
        theta_new = torch.where(active[..., None], theta + step[..., None] * d, theta)
        data_new = self.data_terms(theta_new)
        f_new, g_new, h_new = self.penalised(theta_new, data_new, kind, self.penalty)
        # Armijo's condition, with a margin of float32 rounding: near the optimum a true decrease is
        # below the loss's resolution, and the gradient test (`tolerance`) decides instead
        ok = active & torch.isfinite(f_new) & (f_new <= f + 1e-4 * step * slope + 2e-7 * f.abs())
        okx = ok[..., None]
        sk = (theta_new - theta).mul_(okx)
        yk = (g_new - g).mul_(okx)
        sy = _dot(sk, yk)
        # a pair whose curvature float32 cannot resolve would send the next direction anywhere
        keep = ok & (sy > 1e-6 * (_dot(sk, sk) * _dot(yk, yk)).sqrt())
        j = self._slot()
        torch.mul(sk, keep[..., None], out=self.s[j])
        torch.mul(yk, keep[..., None], out=self.y[j])
        self.rho[j] = torch.where(keep, 1.0 / sy.clamp_min(1e-12), torch.zeros_like(sy))
        torch.where(okx, theta_new, theta, out=theta)
        for new, old in zip(data_new, data):
            torch.where(ok if old.dim() == 2 else okx, new, old, out=old)
        torch.where(ok, f_new, f, out=f)
        torch.where(okx, g_new, g, out=g)
        torch.where(okx, h_new, h, out=h)
        torch.where(ok, (step * 2).clamp_max(1.0), torch.where(active, step * 0.25, step), out=step)

    def _slot(self) -> int:
        """The ring's slot for the newest curvature pair. Graphed, the head stays at 0 and the pairs
        move down a slot each iteration instead, the newest into the last: a graph fixes the slot it
        writes and the order in which the recursion reads, and a moving head needed a graph per kind
        and slot (40 captures of a 26-row-set fit, ~5 ms each on an H200). The recursion reads the same
        pairs in the same order either way, so the numbers are the same."""
        if self.graphs is None:
            return self.head % self.settings.memory
        for ring in (self.s, self.y, self.rho):
            ring.copy_(torch.roll(ring, -1, 0))
        return self.settings.memory - 1

    def remaining(self, g: torch.Tensor, h: torch.Tensor, tol: float) -> torch.Tensor:
        """Per (row set, bit), the decrease of the loss (nats per scene) that the quasi-Newton model
        still predicts, −g·d/2 (Newton's decrement, d the direction the next iteration would take;
        the scaled gradient's where memory lost the curvature); 0 where the gradient test is met.
        A fixed budget leaves the odd bit with a gradient above `tolerance` and nothing left to gain,
        which the gradient test alone would report as a failure."""
        slope = _dot(g, self.direction(g, h))
        slope = torch.where((slope < 0) & torch.isfinite(slope), slope, -_dot(g, g / h * self.mask))
        done = g.abs().amax(-1) <= tol
        return torch.where(done, torch.zeros_like(slope), -slope / 2)


def _where(ok: torch.Tensor, new: tuple[torch.Tensor, ...], old: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Per (row set, bit) (`ok`: R x B), the new or the old of each of a point's tensors (R x B or R x B x P)."""
    return tuple(torch.where(ok if a.dim() == 2 else ok[..., None], a, b) for a, b in zip(new, old))
