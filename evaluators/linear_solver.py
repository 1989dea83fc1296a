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
with strengths, row sets or bits, and on a GPU the whole path is a stream of kernels.

Why it needs few iterations: inputs are rotated into their principal axes (an orthogonal map,
so the L2 penalty is unchanged) and L-BFGS starts each iteration from the Hessian the logistic
loss would have if every scene carried its bit's mean curvature — diagonal in those axes. The
eigenvalues of standardised backbone features span orders of magnitude; that preconditioner
takes the spread out, and the memory corrects for the curvature that varies from scene to
scene. Along an L2 path the memory stays valid: the penalty's Hessian moves by the change of
strength times the identity, which is added to the stored curvature pairs.
"""

from __future__ import annotations

import math
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
    #: after the L2 path, each target's best strength times and divided by this (within the path's
    #: range) is solved too, from that best solution (`TrainConfig.l2_refine`); None: no refinement
    refine: float | None = None
    #: iterations per L2 strength (each one objective and gradient on the training rows): warm-started
    #: with the curvature pairs of the last strength, a step along the path needs few
    iterations: int = 8
    #: iterations per L1 strength: the smoothed L1 penalty is not quadratic, so each of its strengths
    #: starts without curvature pairs, and a few strong inputs take long to grow
    l1_iterations: int = 25
    memory: int = 10
    #: a bit stops moving when every component of its gradient is below this
    tolerance: float = 1e-5
    #: a target's solution counts as converged when the training loss that its solver still expects
    #: to gain (summed over its bits, bits per scene) is below this: a thousandth of a bit is far
    #: inside any result's interval, where a fixed budget leaves some bits short of the gradient test
    slack: float = 1e-3

    @property
    def refined(self) -> int:
        """How many refined L2 strengths follow the L2 path: two (one each side of the best), or none."""
        return 2 if self.refine and len(self.l2_path) > 1 else 0

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
        mask = torch.zeros(len(self.owner), self.q_max, device=dev)
        for p, s in zip(problems, self.starts):
            mask[s : s + p.n_bits, : p.extra.shape[1]] = p.extra_mask
        self.v_mask = mask  # B x Qmax
        self.bias_col = torch.tensor([s.extra.shape[1] - 1 for s in problems], device=dev)[self.owner]  # B
        self.is_bias = F.one_hot(self.bias_col, self.q_max).float() * mask  # B x Qmax

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
        for p, s in zip(self.problems, self.starts):
            h[:, s : s + p.n_bits, : p.extra.shape[1]] = _per_row_set(weight[:, :, s : s + p.n_bits],
                                                                       p.extra.square())
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


def _dot(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Per (row set, bit) inner product of two (w, v) pairs."""
    return (a[0] * b[0]).sum(-1) + (a[1] * b[1]).sum(-1)


def solve_path(x_train: torch.Tensor, x_val: torch.Tensor, train: list[LinearProblem], val: list[LinearProblem],
               settings: PathSettings) -> list[PathSolution]:
    """Fit every target of `train` on every row set of `x_train` (R x n x D, standardised) along
    the path, choose each target's strength on `val` (R x n_val x D), and return its solution.

    After the L2 path, each target's best strength is refined (`PathSettings.refine`): the
    strengths that far stronger and weaker are solved from its best solution, so that a coarse
    path chooses as finely as one with those strengths on it wherever validation has one minimum
    (a half-decade path refined by a quarter decade chooses what the quarter-decade path did, at
    15 solves instead of 25). The L1 path (smoothed, sqrt(w² + eps²) − eps on every weight but the
    bias, which keeps an L2 penalty of the same strength) starts from each target's best L2 solution."""
    batch, vbatch = _Batch(train), _Batch(val)
    r, n, d = x_train.shape
    cov = x_train.transpose(1, 2) @ x_train / n
    evals, evecs = torch.linalg.eigh(cov)  # R x D, R x D x D
    evals = evals.clamp_min(0)
    xt, xv = x_train @ evecs, x_val @ evecs
    b_total, q = len(batch.owner), batch.q_max
    w = x_train.new_zeros(r, b_total, d)
    v = x_train.new_zeros(r, b_total, q)
    kinds = settings.kinds
    n_targets = len(train)
    best_val = x_train.new_full((r, n_targets), math.inf)
    best_w, best_v = w.clone(), v.clone()
    best_scene = x_train.new_zeros(r, n_targets, x_val.shape[1])
    best_choice = torch.zeros(r, n_targets, dtype=torch.long, device=x_train.device)
    best_conv = torch.zeros(r, n_targets, dtype=torch.bool, device=x_train.device)
    val_path = x_train.new_zeros(len(kinds), r, n_targets)
    # each entry's strength, per row set and target, in float64: a path's own strengths are reported as given
    path = x_train.new_zeros(len(kinds), r, n_targets, dtype=torch.float64)
    solver = _LBFGS(batch, xt, evals, evecs, settings)
    n_l2 = len(settings.l2_path)
    grid = torch.tensor(settings.l2_path, dtype=torch.float64, device=x_train.device)
    previous: str | None = None
    for i, kind in enumerate(kinds):
        if n_l2 <= i < n_l2 + settings.refined:  # one side of each target's best L2 strength, from its solution
            if i == n_l2:
                anchor = (grid[best_choice], best_w.clone(), best_v.clone())  # R x P, and the solutions
            ratio = settings.refine if i == n_l2 else 1 / settings.refine
            strength = (anchor[0] * ratio).clamp(grid.min(), grid.max())
            path[i] = strength
            w, v, remaining = solver.solve(anchor[1].clone(), anchor[2].clone(), kind,
                                           strength[:, batch.owner].to(x_train.dtype), restart=True)
        else:
            strength = settings.l2_path[i] if kind == "l2" else settings.l1_path[i - n_l2 - settings.refined]
            path[i] = strength
            if previous == "l2" and kind == "l1":  # the L1 path starts from the best L2
                w, v = best_w.clone(), best_v.clone()
            w, v, remaining = solver.solve(w, v, kind, strength, restart=previous != kind)
        previous = kind
        scene = _scene_bits(vbatch, xv, w, v)  # R x n_val x P
        mean = scene.mean(1)
        val_path[i] = mean
        better = mean < best_val  # the first of equals is kept, as before
        best_val = torch.where(better, mean, best_val)
        best_scene = torch.where(better[..., None], scene.transpose(1, 2), best_scene)
        best_choice = torch.where(better, i, best_choice)
        conv_target = batch.per_target(remaining) / math.log(2) <= settings.slack
        best_conv = torch.where(better, conv_target, best_conv)
        bit_better = better[:, batch.owner, None]
        best_w = torch.where(bit_better, w, best_w)
        best_v = torch.where(bit_better, v, best_v)
    w_orig = torch.einsum("red,rbd->rbe", evecs, best_w)
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
    """Batched L-BFGS over (row set, bit) problems sharing one rotated design."""

    def __init__(self, batch: _Batch, x: torch.Tensor, evals: torch.Tensor, evecs: torch.Tensor,
                 settings: PathSettings) -> None:
        self.batch, self.x, self.evals, self.evecs, self.settings = batch, x, evals, evecs, settings
        r, b, d, q, m = x.shape[0], len(batch.owner), x.shape[2], batch.q_max, settings.memory
        self.s = (x.new_zeros(m, r, b, d), x.new_zeros(m, r, b, q))
        self.y = (x.new_zeros(m, r, b, d), x.new_zeros(m, r, b, q))
        self.rho = x.new_zeros(m, r, b)
        self.head = 0
        self.kind: str | None = None
        self.strength = 0.0

    def objective(self, w: torch.Tensor, v: torch.Tensor, kind: str, strength: float | torch.Tensor
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """(loss per (row set, bit), its gradient, the diagonal preconditioner) at (w, v); an L2
        `strength` is one number or one per (row set, bit)."""
        batch = self.batch
        z = batch.logits(self.x, w, v)
        t = batch.targets
        weight = batch.weight  # free / n
        loss = F.binary_cross_entropy_with_logits(z, t.expand_as(z), weight=weight, reduction="none").sum(1)  # R x B
        p = torch.sigmoid(z)
        resid = (p - t).mul_(weight)
        gw = torch.bmm(resid.transpose(1, 2), self.x)  # R x B x D
        gv = batch.extra_grad(resid)
        curve = (p - p * p).mul_(weight)  # R x n x B
        hw = curve.sum(1)[..., None] * self.evals[:, None, :]  # the mean curvature on each principal axis
        hv = batch.extra_curvature(curve)
        if kind == "l2":
            each = strength[..., None] if isinstance(strength, torch.Tensor) else strength  # over the weights
            loss = loss + 0.5 * strength * ((w * w).sum(-1) + (v * v * batch.v_mask).sum(-1))
            gw, gv = gw + each * w, gv + each * v * batch.v_mask
            hw, hv = hw + each, hv + each * batch.v_mask
        else:
            eps = self.settings.l1_eps
            orig = torch.einsum("red,rbd->rbe", self.evecs, w)  # the weights on the input's own axes
            root = (orig * orig + eps * eps).sqrt()
            lasso_v = (v * v + eps * eps).sqrt()
            weights_v = batch.v_mask - batch.is_bias
            loss = loss + strength * ((root - eps).sum(-1) + ((lasso_v - eps) * weights_v).sum(-1)) \
                + 0.5 * strength * (v * v * batch.is_bias).sum(-1)
            gw = gw + strength * torch.bmm(orig / root, self.evecs)
            gv = gv + strength * (v / lasso_v * weights_v + v * batch.is_bias)
            # the smoothed L1's curvature is diagonal on the input's own axes: its diagonal on the principal ones
            hw = hw + strength * torch.bmm(eps * eps / root.pow(3), self.evecs.square())
            hv = hv + strength * (eps * eps / lasso_v.pow(3) * weights_v + batch.is_bias)
        # a coordinate no feature reaches has zero curvature: keep the step finite there
        return loss, (gw, gv), (hw.clamp_min(1e-12), hv + (1 - batch.v_mask))

    def direction(self, g: tuple[torch.Tensor, torch.Tensor], h: tuple[torch.Tensor, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """−H·g by the two-loop recursion (newest pair first), H0 the diagonal preconditioner."""
        m = self.settings.memory
        qw, qv = g
        alphas = []
        for i in range(m):
            j = (self.head - 1 - i) % m
            a = self.rho[j] * _dot((self.s[0][j], self.s[1][j]), (qw, qv))
            qw, qv = qw - a[..., None] * self.y[0][j], qv - a[..., None] * self.y[1][j]
            alphas.append((j, a))
        rw, rv = qw / h[0], qv / h[1]
        for j, a in reversed(alphas):
            beta = self.rho[j] * _dot((self.y[0][j], self.y[1][j]), (rw, rv))
            rw, rv = rw + (a - beta)[..., None] * self.s[0][j], rv + (a - beta)[..., None] * self.s[1][j]
        return -rw, -rv * self.batch.v_mask

    def solve(self, w: torch.Tensor, v: torch.Tensor, kind: str, strength: float | torch.Tensor, restart: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The settings' budget of iterations at one strength from (w, v); (w, v, the training loss each
        bit is still expected to gain, `remaining`)."""
        if restart or kind != "l2":
            self.rho.zero_()
            for t in (*self.s, *self.y):
                t.zero_()
        else:  # an L2 penalty's Hessian moves by the change of strength: so do the stored pairs
            shift = strength - self.strength
            self.y[0].add_(self.s[0], alpha=shift)
            self.y[1].add_(self.s[1] * self.batch.v_mask, alpha=shift)
            sy = _dot(self.s, self.y)
            self.rho = torch.where(sy > 1e-12, 1.0 / sy.clamp_min(1e-12), torch.zeros_like(sy))
        self.kind, self.strength = kind, strength
        tol = self.settings.tolerance
        f, g, h = self.objective(w, v, kind, strength)
        step = torch.ones_like(f)
        m = self.settings.memory
        for _ in range(self.settings.iterations if kind == "l2" else self.settings.l1_iterations):
            active = torch.maximum(g[0].abs().amax(-1), g[1].abs().amax(-1)) > tol
            dw, dv = self.direction(g, h)
            slope = _dot(g, (dw, dv))
            downhill = (slope < 0) & torch.isfinite(slope)
            dw = torch.where(downhill[..., None], dw, -g[0] / h[0])  # lost curvature: a scaled gradient step
            dv = torch.where(downhill[..., None], dv, -g[1] / h[1] * self.batch.v_mask)
            slope = torch.where(downhill, slope, _dot(g, (dw, dv)))
            a = step[..., None]
            movex = active[..., None]
            w_new, v_new = torch.where(movex, w + a * dw, w), torch.where(movex, v + a * dv, v)
            f_new, g_new, h_new = self.objective(w_new, v_new, kind, strength)
            # Armijo's condition, with a margin of float32 rounding: near the optimum a true decrease is
            # below the loss's resolution, and the gradient test (`tolerance`) decides instead
            ok = active & torch.isfinite(f_new) & (f_new <= f + 1e-4 * step * slope + 2e-7 * f.abs())
            sw, sv = (w_new - w) * ok[..., None], (v_new - v) * ok[..., None]
            yw, yv = (g_new[0] - g[0]) * ok[..., None], (g_new[1] - g[1]) * ok[..., None]
            sy = _dot((sw, sv), (yw, yv))
            # a pair whose curvature float32 cannot resolve would send the next direction anywhere
            keep = ok & (sy > 1e-6 * (_dot((sw, sv), (sw, sv)) * _dot((yw, yv), (yw, yv))).sqrt())
            j = self.head % m
            self.s[0][j], self.s[1][j] = sw * keep[..., None], sv * keep[..., None]
            self.y[0][j], self.y[1][j] = yw * keep[..., None], yv * keep[..., None]
            self.rho[j] = torch.where(keep, 1.0 / sy.clamp_min(1e-12), torch.zeros_like(sy))
            self.head += 1
            okx = ok[..., None]
            w, v = torch.where(okx, w_new, w), torch.where(okx, v_new, v)
            f = torch.where(ok, f_new, f)
            g = (torch.where(okx, g_new[0], g[0]), torch.where(okx, g_new[1], g[1]))
            h = (torch.where(okx, h_new[0], h[0]), torch.where(okx, h_new[1], h[1]))
            step = torch.where(ok, (step * 2).clamp_max(1.0), torch.where(active, step * 0.25, step))
        return w, v, self.remaining(g, h, tol)

    def remaining(self, g: tuple[torch.Tensor, torch.Tensor], h: tuple[torch.Tensor, torch.Tensor], tol: float
                  ) -> torch.Tensor:
        """Per (row set, bit), the decrease of the loss (nats per scene) that the quasi-Newton model
        still predicts, −g·d/2 (Newton's decrement, d the direction the next iteration would take;
        the scaled gradient's where memory lost the curvature); 0 where the gradient test is met.
        A fixed budget leaves the odd bit with a gradient above `tolerance` and nothing left to gain,
        which the gradient test alone would report as a failure."""
        dw, dv = self.direction(g, h)
        slope = _dot(g, (dw, dv))
        slope = torch.where((slope < 0) & torch.isfinite(slope), slope, -_dot(g, (g[0] / h[0], g[1] / h[1])))
        done = torch.maximum(g[0].abs().amax(-1), g[1].abs().amax(-1)) <= tol
        return torch.where(done, torch.zeros_like(slope), -slope / 2)
