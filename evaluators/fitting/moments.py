"""The moment stage: the quadratic families' starting directions from class-conditional
moments (`evaluators.fitting.fit_probes`, step 1b)."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

from evaluators.fitting.data import _LINEAR_CHUNK, FitResult, ProbeJob, RowReader
from evaluators.fitting.scoring import _fail

#: Rows per chunk of the moment stage (its n x K x m products stay a few tens of MB).
_MOMENT_CHUNK = 256


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
                directions = class_directions(reader, job, MOMENT_DIMS, getattr(job.model, "rank", 8))
                if key is not None:
                    done[key] = directions
            job.model.init_from_moments(done[key].to(device) if key is not None else directions.to(device))
        except Exception as e:  # noqa: BLE001 — a failing probe becomes an error row
            _fail(results[job.name], e, active, job.name)


@torch.no_grad()
def class_directions(reader: RowReader, job: ProbeJob, dims: int, rank: int) -> torch.Tensor:
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
    full 384 dims give 47 %). Bits an exact prior fixes in a scene do not count there."""
    model = job.model
    mu, sigma = model.mu.double().cpu(), model.sigma.double().cpu()
    d = reader.row_shape[-1]
    cov = torch.zeros(d, d, dtype=torch.float64)
    for _, rows in reader.chunks(_LINEAR_CHUNK):
        x = (torch.from_numpy(rows).double() - mu) / sigma
        cov += x.T @ x
    m = min(dims, d)
    basis = torch.linalg.eigh(cov).eigenvectors[:, -m:]  # D x m
    k = job.targets["train"].shape[1]
    # Two halves of the training rows (even and odd): directions found on one half are kept only
    # where the other half confirms them (`_confirmed`).
    sums = torch.zeros(2, 2, k * m, m, dtype=torch.float64)  # half, class, (K·m) x m
    counts = torch.zeros(2, 2, k, dtype=torch.float64)
    for idx, y, w in _class_weighted(reader, job, mu, sigma, basis):
        for h in (0, 1):
            rows = idx % 2 == h
            for c in (0, 1):
                wc = w[c][rows]
                sums[h, c] += (wc[:, :, None] * y[rows][:, None, :]).reshape(-1, k * m).T @ y[rows]
                counts[h, c] += wc.sum(0)
    mean = sums.view(2, 2, k, m, m) / counts.clamp_min(1)[..., None, None]
    delta = mean[:, 1] - mean[:, 0]  # half x K x m x m
    candidates = _top_eigenvectors(delta[0], rank)  # K x m x rank, from the first half
    keep = _confirmed(reader, job, mu, sigma, basis, candidates)  # K x rank, on the second half
    top = _top_eigenvectors(delta.mean(0), rank)  # from both halves
    n_keep = keep.sum(-1)  # as many of both halves' leading directions as the odd rows confirmed
    top = top * (torch.arange(rank)[None, :] < n_keep[:, None]).double()[:, None, :]
    return (basis @ top).transpose(1, 2).float()  # K x rank x D


def _class_weighted(reader: RowReader, job: ProbeJob, mu: torch.Tensor, sigma: torch.Tensor,
                    basis: torch.Tensor) -> Iterator[tuple[np.ndarray, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]]:
    """(row indices, rows in `basis`, (weights of class 0, of class 1) per bit) chunk by chunk;
    bits an exact prior fixes in a scene weigh 0 there."""
    for idx, rows in reader.chunks(_MOMENT_CHUNK):
        y = ((torch.from_numpy(rows).double() - mu) / sigma) @ basis
        t = torch.from_numpy(job.targets["train"][idx]).double()
        free = torch.ones_like(t) if job.prior is None else torch.from_numpy(
            np.isfinite(job.prior["train"][idx])).double()
        yield idx, y, ((1 - t) * free, t * free)


def _top_eigenvectors(delta: torch.Tensor, rank: int) -> torch.Tensor:
    """Per bit, the `rank` eigenvectors of a symmetric K x m x m stack with the largest |eigenvalue|."""
    values, vectors = torch.linalg.eigh(delta)
    order = values.abs().argsort(dim=-1, descending=True)[:, :rank]
    return torch.gather(vectors, 2, order[:, None, :].expand(-1, delta.shape[-1], -1))


#: A direction found on one half of the training rows is kept when the other half's class
#: difference in its mean square exceeds this many standard errors.
CONFIRM_SE = 4.0


@torch.no_grad()
def _confirmed(reader: RowReader, job: ProbeJob, mu: torch.Tensor, sigma: torch.Tensor, basis: torch.Tensor,
               candidates: torch.Tensor) -> torch.Tensor:
    """K x rank: whether each candidate direction (K x m x rank, found on the even rows) separates
    the classes on the odd rows too: the difference of the classes' mean (v·y)² there, over its
    standard error, exceeds `CONFIRM_SE`. Directions chosen as
    the training set's largest class differences are partly its noise: on a planted quadratic
    teacher (384-d, 10,000 scenes) unconfirmed ones let the quadratic terms fit 4.9 training bits
    against an exact 5.5 while validation got worse from the first epoch."""
    k, _, r = candidates.shape
    s1 = torch.zeros(2, k, r, dtype=torch.float64)
    s2 = torch.zeros(2, k, r, dtype=torch.float64)
    cnt = torch.zeros(2, k, dtype=torch.float64)
    for idx, y, w in _class_weighted(reader, job, mu, sigma, basis):
        odd = idx % 2 == 1
        sq = torch.einsum("nm,kmr->nkr", y[odd], candidates).square()  # n x K x rank
        for c in (0, 1):
            wc = w[c][odd][:, :, None]
            s1[c] += (wc * sq).sum(0)
            s2[c] += (wc * sq.square()).sum(0)
            cnt[c] += w[c][odd].sum(0)
    n = cnt.clamp_min(2)[..., None]
    mean = s1 / n
    var = (s2 / n - mean.square()).clamp_min(0) / (n - 1)
    z = (mean[1] - mean[0]) / (var[0] + var[1]).sqrt().clamp_min(1e-12)
    return z.abs() > CONFIRM_SE
