"""Binding metrics from per-scene probe code lengths (DESIGN §8).

All quantities are in bits per scene. The entropies are the test split's analytic
priors (from the dataset card); the L's are mean test code lengths of probes:

    B_O = H(O) - L_O                    β_O = B_O / H(O)
    B_F = H(F) - L_F                    β_F = B_F / H(F)
    B*  = H(O|F) - (L_O - L_F)          β*  = B* / H(O|F)      (the paper's estimator)
    B*_cond = H(O|F) - L_{O|F}          β*_cond = B*_cond / H(O|F)

Values are raw: an estimate below zero is reported below zero. Intervals are seeded
percentile bootstraps over test scenes, resampling all per-scene arrays together so
paired differences (L_O - L_F) keep their correlation.

β* is a difference of two probes' code lengths, so it is only as good as the worse
probe; `beta_star_checks` names the rows where the numbers themselves show that one
of them failed (B*_cond, a lower bound from a single probe, needs no such check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

#: Statistics averaged over scenes; every metric is a function of their means.
_STATS = ("L_O", "L_F", "L_O_given_F", "bit_accuracy", "exact_accuracy")


@dataclass(frozen=True)
class Priors:
    """Analytic entropies (bits) of the evaluated split."""

    H_O: float
    H_F: float
    H_O_given_F: float

    @classmethod
    def from_split_info(cls, info: dict[str, Any]) -> "Priors":
        return cls(float(info["H_O"]), float(info["H_F"]), float(info["H_O_given_F"]))


def _ratio(num: np.ndarray | None, den: float) -> np.ndarray | None:
    return None if num is None or den <= 0 else num / den


def _derived(p: Priors, m: dict[str, np.ndarray | None]) -> dict[str, np.ndarray | None]:
    """Metrics from (bootstrapped) means of the per-scene statistics."""
    lo, lf, lof = m["L_O"], m["L_F"], m["L_O_given_F"]
    b_o = None if lo is None else p.H_O - lo
    b_f = None if lf is None else p.H_F - lf
    b_star = None if lo is None or lf is None else p.H_O_given_F - (lo - lf)
    b_cond = None if lof is None else p.H_O_given_F - lof
    return {
        **m,
        "B_O": b_o, "beta_O": _ratio(b_o, p.H_O),
        "B_F": b_f, "beta_F": _ratio(b_f, p.H_F),
        "B_star": b_star, "beta_star": _ratio(b_star, p.H_O_given_F),
        "B_star_cond": b_cond, "beta_star_cond": _ratio(b_cond, p.H_O_given_F),
    }


def binding_metrics(
    priors: Priors,
    bits_O: np.ndarray | None,
    bits_F: np.ndarray | None = None,
    bits_O_given_F: np.ndarray | None = None,
    correct_O: np.ndarray | None = None,
    n_bits_O: int | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    groups: np.ndarray | None = None,
) -> dict[str, float | None]:
    """Every binding metric with `<name>_lo` / `<name>_hi` bootstrap bounds.

    `bits_*` are per-test-scene code lengths (aligned; any may be None when that probe
    failed). `correct_O` counts teacher-forced correct O bits per scene: bit accuracy is
    their mean share, exact match the share of scenes with all bits right (which is
    also greedy decoding's exact match: with every conditional right given the true
    prefix, decoding reproduces the true code bit by bit). `groups` (e.g. each scene's F
    code, one row per scene) makes the bootstrap resample whole groups.
    """
    per_scene: dict[str, np.ndarray | None] = {
        "L_O": bits_O, "L_F": bits_F, "L_O_given_F": bits_O_given_F,
        "bit_accuracy": None if correct_O is None else correct_O / n_bits_O,
        "exact_accuracy": None if correct_O is None else (correct_O == n_bits_O).astype(np.float64),
    }
    present = [k for k in _STATS if per_scene[k] is not None]
    if not present:
        raise ValueError("binding_metrics needs at least one per-scene array")
    matrix = np.stack([np.asarray(per_scene[k], dtype=np.float64) for k in present], axis=1)
    point = _derived(priors, _columns(matrix.mean(axis=0), present))
    boot = _derived(priors, _columns(_bootstrap_means(matrix, n_boot, seed, groups), present))
    out: dict[str, float | None] = {"H_O": priors.H_O, "H_F": priors.H_F, "H_O_given_F": priors.H_O_given_F}
    tail = (1 - level) / 2 * 100
    for name, value in point.items():
        out[name] = None if value is None else float(value)
        samples = boot[name]
        out[f"{name}_lo"] = None if samples is None else float(np.percentile(samples, tail))
        out[f"{name}_hi"] = None if samples is None else float(np.percentile(samples, 100 - tail))
    return out


def beta_star_checks(m: Mapping[str, Any]) -> list[str]:
    """The inequalities this row's probes break, so that its β* (and B*) cannot be read as
    binding: "L_F > H(F)", "L_O > H(O)" (a probe worse than the prior), "L_O < L_F" (β* > 1).
    Empty when nothing shows a failure.

    True entropies obey H(F|Z) ≤ H(F), H(O|Z) ≤ H(O) and H(F|Z) ≤ H(O|Z) (F is a
    function of O), so a probe coding its target in more bits than the prior, or an
    O-probe beating the F-probe (β* > 1), has failed rather than measured: on test F codes
    it never saw, a weak backbone's F-probe can be confidently wrong for tens of bits per
    scene, which sends β* anywhere. A check fires only when the whole 95% interval is on
    the impossible side, so noise around a bound is not flagged. β* < 0 is not checked:
    it is the raw reading "no binding found" that the estimator is specified to report.
    `m` is a results row or `binding_metrics` output (needs the B_F, B_O and β* bounds).
    """
    def bound(key: str) -> float:
        value = m.get(key)
        return float(value) if value is not None and np.isfinite(value) else float("nan")

    checks = []
    if bound("B_F_hi") < 0:
        checks.append("L_F > H(F)")
    if bound("B_O_hi") < 0:
        checks.append("L_O > H(O)")
    if bound("beta_star_lo") > 1:
        checks.append("L_O < L_F")
    return checks


def _columns(means: np.ndarray, present: list[str]) -> dict[str, np.ndarray | None]:
    """Means (m,) or bootstrap means (n_boot, m) keyed by statistic (None where absent)."""
    return {k: (means[..., present.index(k)] if k in present else None) for k in _STATS}


def _bootstrap_means(matrix: np.ndarray, n_boot: int, seed: int, groups: np.ndarray | None = None,
                     chunk: int = 256) -> np.ndarray:
    """n_boot x m means of scenes resampled with replacement (multinomial weights).

    With `groups` (one label per scene) whole groups are resampled: test scenes that share
    an F code are not independent draws (every probe meets that code for the first time),
    and an interval over scenes alone would ignore which F codes the test split happened
    to hold.
    """
    rng = np.random.default_rng(seed)
    labels = np.arange(len(matrix)) if groups is None else np.unique(np.asarray(groups), return_inverse=True, axis=0)[1]
    labels = labels.reshape(-1)
    g = int(labels.max()) + 1 if len(labels) else 0
    out = []
    for start in range(0, n_boot, chunk):
        weights = rng.multinomial(g, np.full(g, 1.0 / g), size=min(chunk, n_boot - start))[:, labels].astype(np.float64)
        out.append(weights @ matrix / weights.sum(axis=1, keepdims=True))
    return np.concatenate(out)
