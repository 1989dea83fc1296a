"""Segmentation metrics of patch label maps (the package docstring, `evaluators.tasks.segmentation`, says
what each measures): semantic mIoU over the classes present in test, instance mIoU with Hungarian
matching per image, and the adjusted Rand index over an image's foreground patches, each with a
percentile bootstrap interval over test images (`evaluators.tasks.binding.metrics.bootstrap_means`,
the resampling every task's intervals use). numpy and scipy only."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from evaluators.tasks.binding.metrics import bootstrap_means, paired_ratio_difference
from evaluators.tasks.issameobject.patch_labels import BACKGROUND


def class_counts(pred: np.ndarray, true: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(intersection, union), each (N, C): per image and class, the patches both maps give the class
    and the patches either gives it. Labels are (N, T) ints in [0, n_classes)."""
    n = len(true)
    rows = np.repeat(np.arange(n), true.shape[1])
    hit = np.zeros((n, n_classes), np.int64)
    np.add.at(hit, (rows, true.ravel()), (pred == true).ravel().astype(np.int64))
    in_true = np.zeros((n, n_classes), np.int64)
    np.add.at(in_true, (rows, true.ravel()), 1)
    in_pred = np.zeros((n, n_classes), np.int64)
    np.add.at(in_pred, (rows, pred.ravel()), 1)
    return hit, in_true + in_pred - hit


def mean_iou(intersection: np.ndarray, union: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Mean over the `present` classes of intersection / union, along the last axis (one value,
    or one per bootstrap replicate); a present class a replicate did not draw (union 0) is left
    out of that replicate's mean."""
    inter, uni = intersection[..., present], union[..., present]
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(uni > 0, inter / np.where(uni > 0, uni, 1), np.nan)
    counted = np.isfinite(iou).sum(-1)
    return np.where(counted > 0, np.nansum(iou, -1) / np.maximum(counted, 1), np.nan)


def semantic_scores(pred: np.ndarray, true: np.ndarray, n_classes: int, *, n_boot: int = 1000, seed: int = 0,
                    level: float = 0.95) -> dict[str, Any]:
    """`semantic_miou` with `_lo`/`_hi`: per class the IoU of its patches summed over all test
    images, averaged over the classes present in the test ground truth. A class absent from
    test is left out of the mean (it has no IoU to measure), but a patch predicted as it still
    costs the union of the patch's true class. Intervals resample images. The per-image class counts
    behind it (intersection, union, ground truth; N x `n_classes` each, flattened row-major) come
    with it, so `bench compare` can resample two backbones' images together (`paired_semantic_miou`)."""
    inter, union = class_counts(pred, true, n_classes)
    present = np.flatnonzero(np.bincount(true.ravel(), minlength=n_classes) > 0)
    point = mean_iou(inter.sum(0).astype(np.float64), union.sum(0).astype(np.float64), present)
    boot = bootstrap_means(np.concatenate([inter, union], axis=1).astype(np.float64), n_boot, seed)
    replicates = mean_iou(boot[:, :n_classes], boot[:, n_classes:], present)
    truth = np.zeros_like(inter)
    np.add.at(truth, (np.repeat(np.arange(len(true)), true.shape[1]), true.ravel()), 1)
    scenes = {f"scene_semantic_{k}": v.astype(np.int32).ravel().tolist()
              for k, v in (("intersection", inter), ("union", union), ("truth", truth))}
    return {**interval("semantic_miou", float(point), replicates, level), **scenes, "n_classes": n_classes}


def paired_semantic_miou(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
                         ) -> tuple[float, float, float] | None:
    """`semantic_miou`(a) − `semantic_miou`(b) of two backbones' rows (one per seed) on the same test
    images, with the paired bootstrap interval (`paired_ratio_difference`): each replicate draws the
    same images for both and recomputes each one's mIoU from their per-image class counts
    (`semantic_scores`' own `mean_iou` over the classes present in test). None when a row lacks
    the counts or the two were not measured on the same images (their ground-truth counts differ).
    The task's `Task.paired` hook for `semantic_miou` (`bench compare`)."""
    sides, truth = [], None
    for rows in (a, b):
        mats = []
        for r in rows:
            inter, union, true, c = (r.get("scene_semantic_intersection"), r.get("scene_semantic_union"),
                                     r.get("scene_semantic_truth"), r.get("n_classes"))
            if inter is None or union is None or true is None or not c:
                return None
            t = np.asarray(true).reshape(-1, c)
            if truth is not None and not np.array_equal(t, truth):
                return None
            truth = t
            mats.append(np.concatenate([np.asarray(inter).reshape(-1, c), np.asarray(union).reshape(-1, c)], axis=1))
        if not mats:
            return None
        sides.append(mats)
    present = np.flatnonzero(truth.sum(0) > 0)
    c = truth.shape[1]
    return paired_ratio_difference(sides[0], sides[1], lambda m: mean_iou(m[..., :c], m[..., c:], present))


def hungarian_iou(pred: np.ndarray, true: np.ndarray) -> float:
    """One image's instance mIoU: its ground-truth regions (background one of them) matched one to
    one to its predicted segments by the assignment of largest total IoU
    (`scipy.optimize.linear_sum_assignment`), then the mean IoU of its foreground instances with
    their match (0 for an instance left unmatched). NaN when the image has no foreground instance.
    Background takes part in the matching, so a prediction that puts every patch in one segment
    loses that segment to the background and scores 0."""
    t_ids, t_inv = np.unique(true, return_inverse=True)
    p_ids, p_inv = np.unique(pred, return_inverse=True)
    fg = t_ids != BACKGROUND
    if not fg.any():
        return float("nan")
    joint = np.zeros((len(t_ids), len(p_ids)), np.int64)
    np.add.at(joint, (t_inv.ravel(), p_inv.ravel()), 1)
    sizes_t, sizes_p = joint.sum(1), joint.sum(0)
    iou = joint / (sizes_t[:, None] + sizes_p[None, :] - joint)
    rows, cols = linear_sum_assignment(iou, maximize=True)
    matched = np.zeros(len(t_ids))
    matched[rows] = iou[rows, cols]
    return float(matched[fg].mean())


def adjusted_rand_index(true: np.ndarray, pred: np.ndarray) -> float:
    """The adjusted Rand index of two labelings of the same points, from their contingency table
    (as `sklearn.metrics.adjusted_rand_score` computes it, its special cases included: identical
    partitions, one cluster each or every point alone, score 1; sklearn is no dependency here)."""
    _, t_inv = np.unique(true, return_inverse=True)
    _, p_inv = np.unique(pred, return_inverse=True)
    n = int(t_inv.size)
    joint = np.zeros((int(t_inv.max(initial=-1)) + 1, int(p_inv.max(initial=-1)) + 1), np.int64)
    np.add.at(joint, (t_inv.ravel(), p_inv.ravel()), 1)
    squares = int((joint.astype(np.float64) ** 2).sum())
    n_true, n_pred = joint.sum(1), joint.sum(0)
    # the pair confusion matrix over ordered pairs of distinct points
    tp = squares - n
    fp = int((joint @ n_pred).sum()) - squares
    fn = int((joint.T @ n_true).sum()) - squares
    tn = n * n - fp - fn - squares
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


def instance_scores(pred: np.ndarray, true: np.ndarray, *, n_boot: int = 1000, seed: int = 0,
                    level: float = 0.95) -> dict[str, Any]:
    """`instance_miou` (`hungarian_iou`) and `instance_ari` (`adjusted_rand_index` over the image's
    foreground patches), each the mean over test images that hold a foreground instance, with
    `_lo`/`_hi` from one resampling of those images, and those images' values in order
    (`scene_instance_miou`, `scene_instance_ari`: which images count depends on the ground truth
    alone, so two backbones' lists align and `bench compare` pairs on them)."""
    per_image = [(hungarian_iou(p, t), adjusted_rand_index(t[t != BACKGROUND], p[t != BACKGROUND]))
                 for p, t in zip(pred, true) if (t != BACKGROUND).any()]
    if not per_image:
        return {f"{name}{end}": None for name in ("instance_miou", "instance_ari") for end in ("", "_lo", "_hi")}
    matrix = np.asarray(per_image, np.float64)
    boot = bootstrap_means(matrix, n_boot, seed)
    return {**interval("instance_miou", float(matrix[:, 0].mean()), boot[:, 0], level),
            **interval("instance_ari", float(matrix[:, 1].mean()), boot[:, 1], level),
            "scene_instance_miou": matrix[:, 0].tolist(), "scene_instance_ari": matrix[:, 1].tolist()}


def interval(name: str, point: float, replicates: np.ndarray, level: float) -> dict[str, float | None]:
    """`name`, `name_lo`, `name_hi`: the point value and the percentile interval of its finite
    bootstrap replicates (None where there is none)."""
    finite = replicates[np.isfinite(replicates)]
    tail = (1 - level) / 2 * 100
    lo, hi = (np.percentile(finite, [tail, 100 - tail]) if len(finite) else (None, None))
    return {name: point if np.isfinite(point) else None, f"{name}_lo": None if lo is None else float(lo),
            f"{name}_hi": None if hi is None else float(hi)}
