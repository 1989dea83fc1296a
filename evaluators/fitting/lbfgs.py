"""The linear stage's solver: a batched limited-memory BFGS over (row set, bit) problems.

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
reuses the training loss's terms there (`BatchedLBFGS.data_terms`): only the penalty changed.

"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch.nn import functional as F

from evaluators.fitting.cuda_graphs import GraphedStep
from evaluators.fitting.linear_problems import PathSettings, ProblemBatch


#: The devices whose iterations are replayed from CUDA graphs (`BatchedLBFGS.iterate`; CUDA only: a
#: benchmark empties it to time the eager path).
GRAPHED_DEVICES = ("cuda",)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per (row set, bit) inner product of two parameter tensors (R x B x P)."""
    return torch.linalg.vecdot(a, b)


class BatchedLBFGS:
    """Batched L-BFGS over (row set, bit) problems sharing one rotated design. A problem's
    parameters are one row of an R x B x P tensor θ = [w, v] (P = D + Qmax), so that each step of
    the two-loop recursion is one product and one update over all of them."""

    def __init__(self, batch: ProblemBatch, x: torch.Tensor, evals: torch.Tensor, evecs: torch.Tensor,
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
