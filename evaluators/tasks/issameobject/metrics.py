"""IsSameObject metrics of scored pairs: accuracy, balanced accuracy, AUROC and the majority baseline,
with bootstrap intervals over images (package docstring, `evaluators.tasks.issameobject`)."""

from __future__ import annotations

import numpy as np


def weighted_auroc(scores: np.ndarray, same: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC (ties count 1/2) under pair weights; `weights` is (P,) or (B, P) -> scalar or (B,).

    P(score_pos > score_neg) + P(tie)/2 with positives and negatives weighted: the exact
    Mann-Whitney statistic, vectorised over bootstrap replicates.
    """
    w = np.atleast_2d(weights).astype(np.float64)
    order = np.argsort(scores, kind="stable")
    s, y, w = scores[order], same[order], w[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    pos = np.add.reduceat(np.where(y, w, 0.0), starts, axis=1)
    neg = np.add.reduceat(np.where(y, 0.0, w), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (pos * (below + 0.5 * neg)).sum(1) / (pos.sum(1) * neg.sum(1))
    return auc if np.ndim(weights) == 2 else auc[0]


def _pair_stats(scores, same, majority, w) -> dict[str, np.ndarray]:
    """Each metric under pair weights w (B, P)."""
    pred = scores >= 0.5
    tot = w.sum(1)
    pos, neg = (w * same).sum(1), (w * ~same).sum(1)
    tp, tn = (w * (pred & same)).sum(1), (w * (~pred & ~same)).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "accuracy": (tp + tn) / tot,
            "balanced_accuracy": 0.5 * (tp / pos + tn / neg),
            "auroc": weighted_auroc(scores, same, w),
            "majority_accuracy": (pos if majority else neg) / tot,
        }


def pair_metrics(
    scores: np.ndarray,
    same: np.ndarray,
    images: np.ndarray,
    majority: bool,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, float | None]:
    """accuracy, balanced_accuracy, auroc, majority_accuracy (+ `_lo`/`_hi`) of test pairs.

    `majority` is the training majority class (True = "same"). Intervals resample test
    images with replacement (all pairs of a drawn image come along). Metrics a sample
    cannot define (one class absent) are None.
    """
    scores = np.asarray(scores, np.float64)
    same = np.asarray(same, bool)
    _, img = np.unique(images, return_inverse=True)
    point = _pair_stats(scores, same, majority, np.ones((1, len(same))))
    rng = np.random.default_rng(seed)
    n_img = int(img.max()) + 1 if len(img) else 0
    samples: dict[str, list[np.ndarray]] = {k: [] for k in point}
    for start in range(0, n_boot, 128):
        counts = rng.multinomial(n_img, np.full(n_img, 1.0 / n_img), size=min(128, n_boot - start))
        for k, v in _pair_stats(scores, same, majority, counts[:, img].astype(np.float64)).items():
            samples[k].append(v)
    tail = (1 - level) / 2 * 100
    out: dict[str, float | None] = {}
    for k, v in point.items():
        out[k] = _finite(v[0])
        boot = np.concatenate(samples[k])
        boot = boot[np.isfinite(boot)]
        out[f"{k}_lo"] = float(np.percentile(boot, tail)) if len(boot) else None
        out[f"{k}_hi"] = float(np.percentile(boot, 100 - tail)) if len(boot) else None
    return out


#: The metrics a row also keeps on validation pairs, as `val_<name>`: layers are chosen on them.
VALIDATION_METRICS = ("accuracy", "balanced_accuracy", "auroc")


def validation_metrics(scores: np.ndarray, same: np.ndarray, majority: bool) -> dict[str, float | None]:
    """`val_accuracy`, `val_balanced_accuracy` and `val_auroc` of the validation pairs (point values:
    they choose a layer, they are not reported)."""
    point = _pair_stats(np.asarray(scores, np.float64), np.asarray(same, bool), majority, np.ones((1, len(same))))
    return {f"val_{k}": _finite(point[k][0]) for k in VALIDATION_METRICS}


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None
