"""How `bench compare` pairs two backbones' `objective_loss` (the task's `Task.paired` hook): the loss
is a ratio of sums over val scenes (the masked model's squared error over a scene's hidden patches,
whose number varies), so the pairing resamples the same scenes for both and recomputes each loss.
numpy only, so the leaderboard imports no torch."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from evaluators.tasks.binding.metrics import paired_ratio_difference


def scene_columns(sums: np.ndarray, counts: np.ndarray) -> dict[str, list]:
    """A row's per-val-scene columns (`scene_losses` output, in the split's order): each scene's loss
    (its sum over its count; 0 for a scene with nothing to average) and that count."""
    loss = np.divide(sums, counts, out=np.zeros_like(sums, dtype=np.float64), where=counts > 0)
    return {"scene_objective_loss": loss.tolist(), "scene_objective_count": counts.astype(np.int32).tolist()}


def paired_objective_loss(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
                          ) -> tuple[float, float, float] | None:
    """`objective_loss`(a) − `objective_loss`(b) of two backbones' rows on the same val scenes (Σ loss·count
    over Σ count on each replicate's scenes, the same scenes for both), with the paired bootstrap interval.
    None when a row lacks the per-scene columns or the two did not average the same elements per scene
    (other scenes, or other mask draws)."""
    sides, counts = [], None
    for rows in (a, b):
        mats = []
        for r in rows:
            loss, count = r.get("scene_objective_loss"), r.get("scene_objective_count")
            if loss is None or count is None or len(loss) != len(count):
                return None
            count = np.asarray(count, dtype=np.float64)
            if counts is not None and not np.array_equal(count, counts):
                return None
            counts = count
            mats.append(np.stack([np.asarray(loss, dtype=np.float64) * count, count], axis=1))
        if not mats:
            return None
        sides.append(mats)
    return paired_ratio_difference(sides[0], sides[1], _loss)


def _loss(sums: np.ndarray) -> np.ndarray:
    """Σ loss·count / Σ count from the column sums (..., 2); NaN where nothing was counted."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[..., 0] / sums[..., 1]
