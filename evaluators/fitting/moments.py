"""The moment stage: the quadratic families' starting directions from class-conditional
moments (`evaluators.fitting.fit_probes`, step 1b)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from evaluators.fitting.batched_linalg import eigh, qr_q
from evaluators.fitting.cuda_graphs import GraphedStep
from evaluators.fitting.data import FitResult, ProbeJob, RowReader, to_device
from evaluators.fitting.scoring import record_failure

#: Rows per chunk of the moment stage (its K x n x m products stay a few hundred MB at most).
_MOMENT_CHUNK = 1024


#: Principal directions the class moments are computed in (the top of the train covariance):
#: all of them up to 384-d inputs.
MOMENT_DIMS = 384


def moment_stage(jobs: Sequence[Sequence[ProbeJob]], readers: Sequence[RowReader], device: str,
                 results: Sequence[dict[str, FitResult]], active: Sequence[dict[str, ProbeJob]],
                 budget: int | None = None) -> None:
    """Give quadratic probes their moment-based starting directions (per `linear_key` once), the
    row sets of a stack (lists indexed by row set) together: their eigen-solves run as one batch,
    so that a GPU meets one train of small kernels per stack instead of one per row set. As many
    row sets share one batch as `budget` bytes hold (None: every row set), and a row set's
    directions are those it gets alone. A row set's principal basis is computed once for all of its
    targets (its jobs share their input and its standardisation)."""
    bases: dict[int, torch.Tensor] = {}
    orthonormal = GraphedGramSchmidt(device) if device.split(":")[0] in GRAPHED_DEVICES else None

    def basis(r: int, job: ProbeJob) -> torch.Tensor:
        if r not in bases:
            bases[r] = principal_basis(readers[r], job.model.mu, job.model.sigma, MOMENT_DIMS, device)
        return bases[r]

    for members in _by_key(jobs).values():
        labels = _shared_labels(members, readers, device)
        for chunk in _chunks(members, readers[members[0][0]].row_shape[-1], budget):
            try:
                directions = stacked_directions([readers[r] for r, _ in chunk], [j for _, j in chunk], MOMENT_DIMS,
                                                device, bases=[basis(r, j) for r, j in chunk], orthonormal=orthonormal,
                                                labels=[labels[r] for r, _ in chunk])
            except Exception:  # noqa: BLE001 — alone, a failing row set fails only its own probes
                directions = None
            for i, (r, job) in enumerate(chunk):
                sharing = [job] if job.linear_key is None else [j for j in jobs[r] if j.linear_key == job.linear_key]
                try:
                    mine = directions[i] if directions is not None else \
                        stacked_directions([readers[r]], [job], MOMENT_DIMS, device, bases=[basis(r, job)],
                                           orthonormal=orthonormal, labels=[labels[r]])[0]
                    for other in sharing:
                        other.model.init_from_moments(mine.to(device))
                except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
                    for other in sharing:
                        record_failure(results[r][other.name], e, active[r], other.name)


def _shared_labels(members: list[tuple[int, ProbeJob]], readers: Sequence[RowReader], device: str
                   ) -> dict[int, "ClassLabels | None"]:
    """Per row set of `members`, its `ClassLabels`: one for all the row sets whose job holds the same
    targets and prior arrays and whose training split has as many rows (a stack's row sets share
    one task), None where building it failed (the row set's own fit then fails, alone)."""
    out: dict[int, ClassLabels | None] = {}
    made: dict[tuple, ClassLabels | None] = {}
    for r, job in members:
        key = (id(job.targets["train"]), id(job.prior["train"]) if job.prior is not None else None, readers[r].n)
        if key not in made:
            try:
                made[key] = ClassLabels(job, readers[r].n, device)
            except Exception:  # noqa: BLE001 — said by the row set's own fit, which builds it again
                made[key] = None
        out[r] = made[key]
    return out


def _by_key(jobs: Sequence[Sequence[ProbeJob]]) -> dict[object, list[tuple[int, ProbeJob]]]:
    """Per `linear_key` (a job without one is its own), the first job of each row set that has it."""
    out: dict[object, list[tuple[int, ProbeJob]]] = {}
    for r, mine in enumerate(jobs):
        for job in mine:
            key = job.linear_key if job.linear_key is not None else ("\0", job.name)
            if not out.get(key) or out[key][-1][0] != r:
                out.setdefault(key, []).append((r, job))
    return out


def _chunks(members: list[tuple[int, ProbeJob]], width: int, budget: int | None) -> list[list[tuple[int, ProbeJob]]]:
    """`members` (row sets of inputs `width` wide) in runs whose class-difference matrices (2 halves x
    K x m x m float32 each) fit `budget`."""
    if budget is None:
        return [members]
    k = members[0][1].targets["train"].shape[1]
    m = min(MOMENT_DIMS, width)
    size = max(1, int(budget // max(2 * 2 * k * m * m * 4, 1)))
    return [members[i : i + size] for i in range(0, len(members), size)]


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
    float32 on the fitting device; only the input covariance (D x D) is summed in float64 (there too)."""
    return stacked_directions([reader], [job], dims, device, rank)[0]


@torch.no_grad()
def stacked_directions(readers: Sequence[RowReader], jobs: Sequence[ProbeJob], dims: int, device: str = "cpu",
                       rank: int | None = None, bases: Sequence[torch.Tensor | None] | None = None,
                       orthonormal: Callable[[torch.Tensor], torch.Tensor] | None = None,
                       labels: Sequence["ClassLabels | None"] | None = None) -> list[torch.Tensor]:
    """`class_directions` of several row sets (one job each, all with the same targets and rank),
    their eigen-solves batched. `bases`: each row set's principal basis (`principal_basis`) where
    the caller has it already (the jobs of a row set share their input and its standardisation);
    `orthonormal`: the subspace iteration's (default `_orthonormal`; the stage's `GraphedGramSchmidt`);
    `labels`: each row set's `ClassLabels` where the caller has them (None: built here)."""
    rank = rank if rank is not None else getattr(jobs[0].model, "rank", 8)
    bases = bases if bases is not None else [None] * len(readers)
    labels = labels if labels is not None else [None] * len(readers)
    labels = [own if own is not None else ClassLabels(job, reader.n, device)
              for reader, job, own in zip(readers, jobs, labels)]
    parts = [_class_difference(reader, job, dims, device, basis, own)
             for reader, job, basis, own in zip(readers, jobs, bases, labels)]
    k = parts[0][1].shape[1]
    delta = parts[0][1][None] if len(parts) == 1 else torch.stack([p[1] for p in parts])  # R x half x K x m x m
    r, _, _, m, _ = delta.shape
    candidates, block = _top_eigenvectors(delta[:, 0].reshape(r * k, m, m), rank,  # the first half
                                          orthonormal=orthonormal)
    candidates = candidates.reshape(r, k, m, -1)
    # both halves: their leading subspace is near the first half's, from which a few iterations reach it
    top = _top_eigenvectors(delta.mean(1).reshape(r * k, m, m), rank, block, EIGEN_REFINE,
                            orthonormal)[0].reshape(r, k, m, -1)
    out = []
    for i, (reader, own, (basis, _, mu, sigma)) in enumerate(zip(readers, labels, parts)):
        keep = _confirmed(reader, own, mu, sigma, basis, candidates[i])  # K x rank, on the second half
        n_keep = keep.sum(-1)  # as many of both halves' leading directions as the odd rows confirmed
        width = top.shape[-1]  # fewer than `rank` where the input has fewer dimensions
        mine = top[i] * (torch.arange(width, device=device)[None, :] < n_keep[:, None]).float()[:, None, :]
        out.append((basis @ mine).transpose(1, 2))  # K x rank x D
    return out


@torch.no_grad()
def principal_basis(reader: RowReader, mu: torch.Tensor, sigma: torch.Tensor, dims: int, device: str) -> torch.Tensor:
    """The top `dims` principal directions (D x m, float32) of the standardised training rows: the
    input covariance summed in float64 on the fitting device."""
    mu64, sigma64 = mu.double(), sigma.double()
    d = reader.row_shape[-1]
    cov = torch.zeros(d, d, dtype=torch.float64, device=device)
    for _, rows in reader.chunks(_MOMENT_CHUNK):
        x = (to_device(rows, device).double() - mu64) / sigma64
        cov += x.T @ x
    return torch.linalg.eigh(cov).eigenvectors[:, -min(dims, d):].float()


class ClassLabels:
    """What the moment stage reads of one target's labels: the two classes' weights per training
    scene and bit, the even/odd halves and the classes' counts and scales per half, and on the
    fitting device, each chunk's class-difference coefficients (`_add_dense`) and the odd rows' weights
    (`_confirmed`). The same for every row set of a stack (one task), so built once for all of them:
    built per row set, they were 10 ms of host numpy and 32 transfers a row set (dinov2-small, 2,000
    scenes; 0.26 s and ~830 transfers for 26 row sets), the GPU waiting on them."""

    def __init__(self, job: ProbeJob, n: int, device: str) -> None:
        self.device = device
        self.weights = _class_weights(job, n)  # class, N x K
        self.half = np.arange(n) % 2
        self.counts = np.stack([np.stack([w[self.half == h].sum(0) for w in self.weights])
                                for h in (0, 1)])  # half, class, K
        self.scale = 1.0 / np.maximum(self.counts, 1.0)
        self._coefficients: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._odd: dict[tuple[int, int], tuple[np.ndarray, list[torch.Tensor]]] = {}

    def coefficients(self, idx: np.ndarray) -> list[torch.Tensor]:
        """Per half, the chunk of rows `idx`'s coefficients (chunk rows x K, float32, on the device):
        1/n₁ on a bit's class-1 scenes, −1/n₀ on its class-0 ones, 0 where a prior fixes it or in the
        other half. `idx` is a chunk of consecutive rows (`RowReader.chunks`)."""
        key = (int(idx[0]), len(idx))
        if key not in self._coefficients:
            counted = [(self.weights[c][idx] > 0) for c in (0, 1)]
            self._coefficients[key] = []
            for h in (0, 1):
                mine = (self.half[idx] == h)[:, None]
                coef = (counted[1] & mine) * self.scale[h, 1][None, :] - (counted[0] & mine) * self.scale[h, 0][None, :]
                self._coefficients[key].append(to_device(coef.astype(np.float32), self.device))
        return self._coefficients[key]

    def odd(self, idx: np.ndarray) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The odd rows of the chunk `idx` (a mask) and, per class, their weights (rows x K, float64,
        on the device)."""
        key = (int(idx[0]), len(idx))
        if key not in self._odd:
            odd = idx % 2 == 1
            self._odd[key] = (odd, [to_device(np.ascontiguousarray(w[idx[odd]]), self.device) for w in self.weights])
        return self._odd[key]


def _class_difference(reader: RowReader, job: ProbeJob, dims: int, device: str, basis: torch.Tensor | None = None,
                      labels: ClassLabels | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(basis D x m, class difference per half 2 x K x m x m, mean, std) of one row set: the moments
    `class_directions` takes its directions from (`labels`: its job's `ClassLabels`, built here if None).

    Each bit's difference, Σ₁/n₁ − Σ₀/n₀ over the scenes where it is free, sums only those scenes'
    outer products, and where a bit is free in every scene of a half, only its rarer class's: the
    other's sum is the half's whole sum (one product for all bits) less it. On ColorShape's targets
    that is 0.4 of the products a sum over every scene and bit took. On CUDA (`DENSE_DEVICES`) every
    bit's difference is one product per chunk and half instead (`_add_dense`)."""
    mu, sigma = job.model.mu, job.model.sigma  # on the device: no read back to the host
    basis = basis if basis is not None else principal_basis(reader, mu, sigma, dims, device)
    labels = labels if labels is not None else ClassLabels(job, reader.n, device)
    m = basis.shape[1]
    k = job.targets["train"].shape[1]
    # Two halves of the training rows (even and odd): directions found on one half are kept only
    # where the other half confirms them (`_confirmed`).
    weights, half, counts, scale = labels.weights, labels.half, labels.counts, labels.scale
    delta = torch.zeros(2, k, m, m, device=device)  # half x K x m x m
    if device.split(":")[0] in DENSE_DEVICES:
        for idx, rows in reader.chunks(_MOMENT_CHUNK):
            y = ((to_device(rows, device) - mu) / sigma) @ basis
            _add_dense(delta, y, labels.coefficients(idx))
        return basis, delta, mu, sigma
    whole = np.stack([(counts[h, 0] + counts[h, 1]) == (half == h).sum() for h in (0, 1)])  # half, K: free everywhere
    terms = _summed_classes(counts, scale, whole)
    gram = torch.zeros(2, m, m, device=device)  # per half, the sum over all of its scenes
    for idx, rows in reader.chunks(_MOMENT_CHUNK):
        y = ((torch.from_numpy(rows).to(device) - mu) / sigma) @ basis
        for h in (0, 1):
            mine = half[idx] == h
            if whole[h].any():
                yh = y[torch.from_numpy(mine).to(device)]
                gram[h].addmm_(yh.T, yh)
            counted = [(weights[c][idx] > 0) & mine[:, None] for c in (0, 1)]  # chunk rows x K, per class
            for b in range(k):
                for c, coef in terms[h][b]:
                    sel = torch.from_numpy(np.flatnonzero(counted[c][:, b])).to(device)
                    if len(sel):
                        ys = y[sel]
                        delta[h, b].addmm_(ys.T, ys, alpha=coef)
    for h in (0, 1):
        for b in np.flatnonzero(whole[h]):  # the summed class's complement: the whole half less it
            other = 1 - terms[h][b][0][0]
            delta[h, b].add_(gram[h], alpha=(scale[h, 1, b] if other == 1 else -scale[h, 0, b]))
    return basis, delta, mu, sigma


#: The devices whose moment stage sums every bit's class difference in one product per chunk and
#: half (`_add_dense`) rather than over each bit's selected scenes: 2.5x the arithmetic, but on a
#: GPU the selections were ~4,000 small kernels a row set and target, and the product is one.
DENSE_DEVICES = ("cuda",)


def _add_dense(delta: torch.Tensor, y: torch.Tensor, coefficients: list[torch.Tensor]) -> None:
    """Add a chunk's class differences to `delta` (half x K x m x m): for each half, Yᵀ diag(c_b) Y for
    every bit b at once (`coefficients`: per half, chunk rows x K, `ClassLabels.coefficients`)."""
    n = y.shape[0]
    k, m = delta.shape[1], y.shape[1]
    for h, c in enumerate(coefficients):
        delta[h] += ((c[:, :, None] * y[:, None, :]).reshape(n, k * m).T @ y).reshape(k, m, m)


def _summed_classes(counts: np.ndarray, scale: np.ndarray, whole: np.ndarray) -> list[list[list[tuple[int, float]]]]:
    """Per half and bit, the classes whose outer products `_class_difference` sums, each with its
    coefficient: both (−1/n₀, +1/n₁) where a prior fixes the bit in some scenes of the half, else
    only the rarer class, its coefficient also counting the complement it stands for (±(1/n₁ + 1/n₀));
    `counts` and `scale` are half x class x K, `whole` half x K."""
    out = []
    for h in (0, 1):
        per_bit = []
        for b in range(counts.shape[2]):
            if whole[h, b]:
                c = int(counts[h, 1, b] <= counts[h, 0, b])
                per_bit.append([(c, (1.0 if c == 1 else -1.0) * (scale[h, 1, b] + scale[h, 0, b]))])
            else:
                per_bit.append([(0, -float(scale[h, 0, b])), (1, float(scale[h, 1, b]))])
        out.append(per_bit)
    return out


def _class_weights(job: ProbeJob, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(weights of class 0, of class 1) per training scene and bit: bits an exact prior fixes in a
    scene weigh 0 there."""
    t = job.targets["train"][:n].astype(np.float64)
    free = np.ones_like(t) if job.prior is None else np.isfinite(job.prior["train"][:n]).astype(np.float64)
    return (1 - t) * free, t * free


#: Subspace iterations behind `_top_eigenvectors`, and the block's width beyond the rank. Each step
#: reads every bit's m x m class difference; 15 (30 before version 8) with a block 8 wider than the
#: rank read the quadratic teacher (384-d, 10,000 scenes) as 30 did. Both halves' difference starts
#: from the first half's block, EIGEN_REFINE iterations from it.
EIGEN_ITERATIONS = 15
EIGEN_REFINE = 5
EIGEN_OVERSAMPLE = 8


def _top_eigenvectors(delta: torch.Tensor, rank: int, start: torch.Tensor | None = None,
                      iterations: int = EIGEN_ITERATIONS,
                      orthonormal: Callable[[torch.Tensor], torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per bit, the `rank` eigenvectors of a symmetric K x m x m stack with the largest |eigenvalue|,
    by block subspace iteration with a Rayleigh–Ritz step: only `rank` of m eigenvectors are wanted,
    and a full eigendecomposition of every bit's matrix cost seconds per target. (Those K x m x rank,
    and the whole block of Ritz vectors, K x m x width, from which another stack's iteration can
    `start`.)"""
    k, m, _ = delta.shape
    width = min(m, rank + EIGEN_OVERSAMPLE)
    if start is None:
        gen = torch.Generator().manual_seed(0)
        start = to_device(torch.randn(m, width, generator=gen, dtype=delta.dtype), delta.device).expand(k, -1, -1)
    orthonormal = orthonormal or _orthonormal
    q = orthonormal(start)
    for _ in range(iterations):
        q = orthonormal(delta @ q)
    values, vectors = eigh(q.transpose(1, 2) @ delta @ q)
    order = values.abs().argsort(dim=-1, descending=True)
    ritz = torch.gather(q @ vectors, 2, order[:, None, :].expand(-1, m, -1))  # K x m x width, largest |λ| first
    return ritz[..., :rank], ritz


def _orthonormal(x: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of each matrix's columns (... x m x w, m ≥ w): Householder QR, except on
    CUDA (`gram_schmidt`), where cuSOLVER factors matrices of over 256 rows one at a time: the
    moment stage's R row sets x K bits x 21 iterations a target took 12 s of a 22 s fit on an H200."""
    return gram_schmidt(x) if x.is_cuda else qr_q(x)


def gram_schmidt(x: torch.Tensor) -> torch.Tensor:
    """`_orthonormal` by classical Gram–Schmidt with each column orthogonalised twice ("twice is
    enough": orthogonal to rounding however ill-conditioned the columns), column by column over the
    whole batch, so a GPU meets a few kernels per column whatever the batch. A column that lies in
    the span of those before it (a bit's class difference of lower rank than the block) comes out 0
    where Householder QR would complete the basis: the Rayleigh–Ritz step reads it as eigenvalue 0."""
    q = torch.zeros_like(x)
    tiny = torch.finfo(x.dtype).tiny
    for j in range(x.shape[-1]):
        v = x[..., j : j + 1]
        for _ in range(2):
            done = q[..., :j]
            v = v - done @ (done.transpose(-1, -2) @ v)
        norm = v.norm(dim=-2, keepdim=True)
        # relative to the column's own size, so that what is left of a dependent column is rounding
        keep = norm > 1e-5 * x[..., j : j + 1].norm(dim=-2, keepdim=True)
        q[..., j : j + 1] = torch.where(keep, v / norm.clamp_min(tiny), torch.zeros_like(v))
    return q


#: The devices whose Gram–Schmidt is replayed from CUDA graphs (`GraphedGramSchmidt`; CUDA only).
GRAPHED_DEVICES = ("cuda",)


class GraphedGramSchmidt:
    """`gram_schmidt` replayed from a CUDA graph per input shape: a call is ~300 small kernels (a few
    per column), and the moment stage makes 22 calls of one shape per target, 27,000 launches from
    Python a fit; replayed, the same kernels, so the same numbers. The input is copied into the
    graph's own and the output copied out of it."""

    def __init__(self, device: str) -> None:
        self.graphs = GraphedStep(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.graphs.call((tuple(x.shape), x.dtype), gram_schmidt, x).clone()


#: A direction found on one half of the training rows is kept when the other half's class
#: difference in its mean square exceeds this many standard errors.
CONFIRM_SE = 4.0


@torch.no_grad()
def _confirmed(reader: RowReader, labels: ClassLabels, mu: torch.Tensor, sigma: torch.Tensor,
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
        odd, held = labels.odd(idx)
        y = ((to_device(rows[odd], dev) - mu) / sigma) @ basis
        sq = torch.einsum("nm,kmr->nkr", y, candidates).square().double()  # n x K x rank
        for c in (0, 1):
            wc = held[c]
            s1[c] += (wc[:, :, None] * sq).sum(0)
            s2[c] += (wc[:, :, None] * sq.square()).sum(0)
            cnt[c] += wc.sum(0)
    n = cnt.clamp_min(2)[..., None]
    mean = s1 / n
    var = (s2 / n - mean.square()).clamp_min(0) / (n - 1)
    z = (mean[1] - mean[0]) / (var[0] + var[1]).sqrt().clamp_min(1e-12)
    return z.abs() > CONFIRM_SE
