"""Scenes resampled by group: the labels of their groups and the standard error of a mean that
resamples whole groups (the cluster-robust SE). The binding estimator's validation errors and
the fit's guard against the prior both resample whole F codes, as the bootstrap does."""

from __future__ import annotations

import functools
import math

import numpy as np


def group_labels(groups: np.ndarray | None, n: int) -> np.ndarray:
    """0..G-1 labels of n scenes' groups (rows of `groups`, e.g. each scene's F code); every
    scene its own group when `groups` is None. Read-only: the labels of the same groups are
    computed once (`_labels`)."""
    if groups is None:
        return np.arange(n)
    rows = np.ascontiguousarray(np.asarray(groups).reshape(n, -1))
    return _labels(rows.tobytes(), rows.shape, rows.dtype.str)


@functools.lru_cache(maxsize=16)
def _labels(data: bytes, shape: tuple[int, int], dtype: str) -> np.ndarray:
    """`group_labels` of rows given by their bytes: a fit asks for the same split's groups for
    every probe, family and row set (26 row sets: 780 times), and `np.unique` over rows took 0.7 s
    of them on an H200's host."""
    rows = np.frombuffer(data, dtype=dtype).reshape(shape)
    labels = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1)
    labels.flags.writeable = False
    return labels


def mean_se(values: np.ndarray, groups: np.ndarray | None = None) -> float:
    """Standard error of the mean of per-scene `values`, resampling whole `groups` (the
    cluster-robust SE, the bootstrap's resampling unit); inf with fewer than two groups."""
    v = np.asarray(values, dtype=np.float64)
    labels = group_labels(groups, len(v))
    g = int(labels.max()) + 1 if len(v) else 0
    if g < 2:
        return math.inf
    sums = np.bincount(labels, weights=v - v.mean(), minlength=g)
    return float(math.sqrt(g / (g - 1) * np.square(sums).sum()) / len(v))
