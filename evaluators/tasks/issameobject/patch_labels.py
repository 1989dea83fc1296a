"""Patch labels for IsSameObject (docs/explanation/architecture.md §3): which instance each backbone patch belongs to.

A backbone sees the image resized to its input size and cut into a rows x cols grid,
so a patch covers an exact rectangle of the *original* mask in fractional pixel
coordinates: [i H / rows, (i + 1) H / rows) x [j W / cols, (j + 1) W / cols). Each
label's share of a patch is its area-weighted coverage of that rectangle (pixels cut by
a patch border count with the fraction inside), which is what a box-filter resize of
the mask would give, and does not depend on H being a multiple of rows.

The label of a patch is the instance with the largest share (ties go to the smaller
id, so background 0 wins a tie); background is one region with label 0. A patch whose
best share is below `min_share` is ambiguous and gets `IGNORE` (-1): pairs that involve
it are never sampled.
"""

from __future__ import annotations

import numpy as np

from bench.core.dataset import Dataset, decode_mask
from bench.core.errors import ConfigError

#: Label of a patch that no instance (nor background) covers by at least `min_share`.
IGNORE = -1
BACKGROUND = 0
DEFAULT_MIN_SHARE = 0.5


def overlap_matrix(n_pixels: int, n_cells: int) -> np.ndarray:
    """(n_cells, n_pixels) lengths of pixel [p, p+1) inside cell [c n/k, (c+1) n/k), times k (whole
    numbers, in float64): products and sums of whole numbers below 2**53 are exact in any order, so
    the shares below are the same bits whatever BLAS kernel the processor picks, and a tie between
    two labels is an exact tie."""
    cells, pixels = np.arange(n_cells)[:, None], np.arange(n_pixels)[None, :]
    lo = np.maximum(cells * n_pixels, pixels * n_cells)
    hi = np.minimum((cells + 1) * n_pixels, (pixels + 1) * n_cells)
    return np.clip(hi - lo, 0, None).astype(np.float64)


def label_shares(mask: np.ndarray, grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, shares): the labels present in `mask` and each one's share of every patch.

    `shares[k, i, j]` is the fraction of patch (i, j) covered by label `ids[k]`; shares
    of a patch sum to 1.
    """
    rows, cols = grid
    if rows <= 0 or cols <= 0:
        raise ConfigError("grid", f"must be positive, got {grid}")
    h, w = mask.shape
    ids, inverse = np.unique(mask, return_inverse=True)
    onehot = np.zeros((len(ids), h * w))
    onehot[inverse.ravel(), np.arange(h * w)] = 1.0
    a_r, a_c = overlap_matrix(h, rows), overlap_matrix(w, cols)
    covered = a_r @ onehot.reshape(len(ids), h, w) @ a_c.T  # (K, rows, cols) pixel areas x rows x cols, exact
    return ids, covered / (h * w)


def patch_labels(mask: np.ndarray, grid: tuple[int, int], min_share: float = DEFAULT_MIN_SHARE) -> np.ndarray:
    """(rows, cols) int32 labels: the instance covering most of each patch, `IGNORE` if below `min_share`."""
    if not 0.0 <= min_share <= 1.0:
        raise ConfigError("min_share", f"must be in [0, 1], got {min_share}")
    ids, shares = label_shares(np.asarray(mask), grid)
    best = shares.argmax(axis=0)  # first maximum: the smallest id wins ties
    labels = ids[best].astype(np.int32)
    # a tiny tolerance so an exact half share passes min_share = 0.5 despite float rounding
    labels[np.take_along_axis(shares, best[None], 0)[0] < min_share - 1e-9] = IGNORE
    return labels


def split_patch_labels(
    dataset: Dataset, split: str, grid: tuple[int, int], min_share: float = DEFAULT_MIN_SHARE, limit: int | None = None
) -> np.ndarray:
    """(N, rows * cols) labels of a split's scenes in dataset order, row-major like the spatial tokens."""
    out: list[np.ndarray] = []
    for batch in dataset.iter_batches(split, columns=["mask"]):
        for m in batch.column("mask").to_pylist():
            if limit is not None and len(out) >= limit:
                return np.stack(out)
            out.append(patch_labels(decode_mask(m), grid, min_share).ravel())
    return np.stack(out) if out else np.zeros((0, grid[0] * grid[1]), np.int32)
