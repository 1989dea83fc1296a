"""Subspaces of a layer's token space: the binding subspace a fitted IsSameObject probe reads,
and its controls, kept as an artefact (one `.npz`) with the fingerprints of what it was fitted on.

The binding subspace (issue 58, after the IsSameObject paper's §4.4): the quadratic pair probe
scores standardised tokens x̃ = (x − m)/σ by x̃ᵀWỹ, W = (UᵀV + VᵀU)/2, so in raw token space it
reads (x − m)ᵀ diag(1/σ) W diag(1/σ) (y − m). The eigenvectors of that symmetric matrix, largest
|λ| first, holding `energy` of Σλ² (its squared Frobenius norm), span what the probe reads; rank
16 U and V span up to 32 dimensions, and the directions the probe never used keep their small
random start, which the energy cut leaves out. Controls of the same rank: `random` (a seeded
orthonormal basis), `feature` (what per-patch linear probes of the covering object's features
read: on ColorShape an object's identity can be read from its colour and shape, so the binding
subspace must be shown to differ from it) and `shuffled-labels` (the binding probe fitted on
permuted pair labels). Fitting them is `evaluators.interventions.fit` (it extracts activations;
this module, which an intervened backbone loads, stays free of the backbone registry).
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.core.dataset import replacing
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed, sha256_hex, stable_json
from bench.core.intervention_specs import SUBSPACE_KINDS


@dataclass(frozen=True)
class Subspace:
    """An orthonormal basis (D, r) of a layer's raw token space and what it was fitted on.

    `mean` is the training mean of the raw patch tokens (so `remove` sets P·h to P·mean);
    `backbone_revision` the base backbone's weights fingerprint and `dataset_fingerprint` the
    train split's: an intervention refuses another backbone, layer or dataset by them."""

    basis: np.ndarray
    mean: np.ndarray
    kind: str
    backbone: str
    backbone_revision: str
    layer: int
    dataset: str
    dataset_fingerprint: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])

    def metadata(self) -> dict[str, Any]:
        """Everything but the arrays, JSON-able (stored beside them, part of the fingerprint)."""
        return {k: v for k, v in asdict(self).items() if k not in ("basis", "mean")}

    @property
    def fingerprint(self) -> str:
        """sha256 of the basis, the mean and the metadata: an intervention's rows carry it."""
        return sha256_hex(np.ascontiguousarray(self.basis, np.float64).tobytes(),
                          np.ascontiguousarray(self.mean, np.float64).tobytes(), stable_json(self.metadata()))

    def projector(self) -> np.ndarray:
        """P = B Bᵀ (D, D): the orthogonal projection onto the subspace."""
        return self.basis @ self.basis.T


def save_subspace(sub: Subspace, path: str | os.PathLike[str]) -> Path:
    """Write one `.npz` (basis, mean, metadata JSON), atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, basis=np.asarray(sub.basis, np.float64), mean=np.asarray(sub.mean, np.float64),
                 metadata=np.array(json.dumps(sub.metadata(), sort_keys=True)))
    return path


def load_subspace(path: str | os.PathLike[str]) -> Subspace:
    """A subspace `save_subspace` wrote; one line (BenchError) for a missing or foreign file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise BenchError(f"subspace: no such file {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            basis, mean, meta = z["basis"], z["mean"], json.loads(str(z["metadata"]))
        sub = Subspace(basis=basis, mean=mean, **meta)
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as e:  # truncated: BadZipFile
        raise BenchError(f"subspace: {path} is not a subspace file ({type(e).__name__}: {e})") from None
    if basis.ndim != 2 or mean.shape != (basis.shape[0],) or sub.kind not in SUBSPACE_KINDS:
        raise BenchError(f"subspace: {path} is not a subspace file (basis {basis.shape}, mean {mean.shape})")
    return sub


def subspace_from_quadratic(u: np.ndarray, v: np.ndarray, std: np.ndarray, energy: float = 0.95,
                            span: np.ndarray | None = None) -> np.ndarray:
    """Orthonormal eigenvectors (D, k) of diag(1/σ)·W·diag(1/σ), W = (UᵀV + VᵀU)/2 (U, V: (r, D)),
    largest |λ| first, the fewest holding `energy` of Σλ².

    `span` (D, s), orthonormal: the directions the training tokens vary in (`token_span`). The
    form is restricted to them first, since on directions where no token varies the probe's
    U, V keep their random start (no gradient reaches them) and it reads nothing there; a real
    model's tokens vary in every direction, so there it changes nothing."""
    if not 0.0 < energy <= 1.0:
        raise BenchError(f"energy: must be in (0, 1], got {energy}")
    u, v = np.asarray(u, np.float64), np.asarray(v, np.float64)
    inv = 1.0 / np.asarray(std, np.float64)
    w = (u.T @ v + v.T @ u) / 2.0
    m = inv[:, None] * w * inv[None, :]
    if span is not None:
        p = span @ span.T
        m = p @ m @ p
    lam, vec = np.linalg.eigh((m + m.T) / 2.0)
    order = np.argsort(-np.abs(lam), kind="stable")
    share = np.cumsum(lam[order] ** 2) / max(float((lam**2).sum()), 1e-300)
    k = int(np.searchsorted(share, energy - 1e-12) + 1)
    return vec[:, order[:k]]


def token_span(tokens: np.ndarray, tol: float = 1e-8) -> np.ndarray:
    """An orthonormal basis (D, s) of the directions centred tokens (n, D) vary in: the
    eigenvectors of their scatter matrix with eigenvalue above `tol` of the largest."""
    x = np.asarray(tokens, np.float64)
    x = x - x.mean(0)
    lam, vec = np.linalg.eigh(x.T @ x)
    return vec[:, lam > tol * max(float(lam.max()), 1e-300)]


def principal_angles(a: "Subspace | np.ndarray", b: "Subspace | np.ndarray") -> np.ndarray:
    """Cosines of the principal angles between two subspaces (bases or Subspaces), descending:
    1 where they share a direction, 0 where orthogonal; min(rank a, rank b) of them."""
    from scipy.linalg import subspace_angles

    x, y = (s.basis if isinstance(s, Subspace) else np.asarray(s, np.float64) for s in (a, b))
    if x.shape[0] != y.shape[0]:
        raise BenchError(f"subspace: widths differ ({x.shape[0]} vs {y.shape[0]}): not the same token space")
    return np.sort(np.cos(subspace_angles(x, y)))[::-1]


def random_basis(width: int, rank: int, seed: int) -> np.ndarray:
    """A seeded random orthonormal basis (width, rank): QR of a Gaussian matrix."""
    g = np.random.default_rng(derive_seed(seed, "random-subspace", width, rank))
    q, r = np.linalg.qr(g.standard_normal((width, rank)))
    return q * np.sign(np.diag(r))[None, :]
