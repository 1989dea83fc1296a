"""IsSameObject pairs: which patch pairs of each image are scored, and their labels (the package
docstring, `evaluators.tasks.issameobject`, explains the two samplings)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.core.errors import ConfigError
from evaluators.tasks.issameobject.scorers import SAMPLINGS
from evaluators.tasks.issameobject.patch_labels import BACKGROUND, DEFAULT_MIN_SHARE, IGNORE


@dataclass(frozen=True)
class PairConfig:
    """How pairs are drawn from each image (see the module docstring)."""

    pairs_per_image: int = 64
    sampling: str = "balanced"
    min_share: float = DEFAULT_MIN_SHARE
    exclude_background: bool = False

    def validate(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ConfigError("sampling", f"unknown {self.sampling!r}; allowed: {', '.join(SAMPLINGS)}")
        if self.pairs_per_image < 2:
            raise ConfigError("pairs_per_image", f"must be ≥ 2, got {self.pairs_per_image}")


@dataclass
class Pairs:
    """Patch pairs: image index, the two patch indices (row-major over the grid), and the label."""

    image: np.ndarray
    i: np.ndarray
    j: np.ndarray
    same: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.same)


def valid_patches(labels: np.ndarray, exclude_background: bool) -> np.ndarray:
    """Boolean mask of patches that may appear in a pair."""
    ok = labels != IGNORE
    return ok & (labels != BACKGROUND) if exclude_background else ok


def pair_kind(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """0 same object, 1 background-background, 2 two different objects, 3 object-background."""
    bg_a, bg_b = a == BACKGROUND, b == BACKGROUND
    return np.where(bg_a & bg_b, 1, np.where(bg_a | bg_b, 3, np.where(a == b, 0, 2)))


def sample_pairs(labels: np.ndarray, config: PairConfig, seed: int) -> Pairs:
    """Pairs from every image of an (N, T) label array; deterministic given `seed`."""
    config.validate()
    rng = np.random.default_rng(seed)
    parts: list[tuple[np.ndarray, ...]] = []
    for n, row in enumerate(labels):
        idx = np.flatnonzero(valid_patches(row, config.exclude_background))
        a, b = np.triu_indices(len(idx), k=1)
        if not len(a):
            continue
        a, b = idx[a], idx[b]
        same = row[a] == row[b]
        if config.sampling == "natural":
            take = rng.choice(len(a), min(config.pairs_per_image, len(a)), replace=False)
        else:
            kind = pair_kind(row[a], row[b])
            quota = config.pairs_per_image // (2 if config.exclude_background else 4)
            take = np.concatenate([
                rng.choice(sel, min(quota, len(sel)), replace=False)
                for sel in (np.flatnonzero(kind == k) for k in range(4))
            ])
        take = np.sort(take)
        parts.append((np.full(len(take), n), a[take], b[take], same[take]))
    if not parts:
        return Pairs(*(np.zeros(0, np.int64) for _ in range(3)), np.zeros(0, bool))
    image, i, j, same = (np.concatenate(p) for p in zip(*parts))
    return Pairs(image.astype(np.int64), i.astype(np.int64), j.astype(np.int64), same.astype(bool))


def gather_tokens(tokens: np.ndarray, pairs: Pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(U, ix, iy): the distinct tokens the pairs use as float32, and each pair's two rows of U.

    Reading only the used tokens keeps memory at pairs x D, not images x patches x D.
    """
    n, t, d = tokens.shape
    flat_x, flat_y = pairs.image * t + pairs.i, pairs.image * t + pairs.j
    used, inverse = np.unique(np.concatenate([flat_x, flat_y]), return_inverse=True)
    u = np.asarray(tokens.reshape(n * t, d)[used], dtype=np.float32)
    return u, inverse[: len(pairs)], inverse[len(pairs) :]
