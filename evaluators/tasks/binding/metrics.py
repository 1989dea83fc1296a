"""Binding metrics from per-scene probe code lengths (docs/explanation/architecture.md §3).

All quantities are in bits per scene. F is a function of O, so by the chain rule
H(O|Z) = H(F|Z) + H(O|F,Z), and the headline estimator needs only two probes, both
anchored on the exact prior (an F-probe, and an O-probe given the true F):

    B_F = H(F) - L_F                      β_F = B_F / H(F)
    B*  = H(O|F) - L_{O|F}                β*  = B* / H(O|F)      (headline, ranked)
    L_O = L_F + L_{O|F}                   B_O = H(O) - L_O = B_F + B*,  β_O = B_O / H(O)

β* ≤ 1 always, and it is exactly 0 when the representation adds nothing to the prior.
The references are the test scenes' own prior code lengths — the mean of their
-log2 P(f) and H(O|F=f) — not the split's expectations, so an anchored probe that
stays at its prior reads B = 0 scene by scene; without per-scene references (a card
without exact priors) the split's analytic entropies stand in.

The paper's estimator is kept beside it for comparison with published numbers, from a
direct, unanchored O-probe and an unanchored F-probe:

    B*_paper = H(O|F) - (L_O,paper - L_F,paper)     β*_paper = B*_paper / H(O|F)

It is a difference of two bounds, so it leaves [0, 1] when the probes are unequally
good; `metric_checks` names the rows where the numbers show that.

Values are raw: an estimate below zero is reported below zero. Intervals are seeded
percentile bootstraps, resampling all per-scene arrays together (whole F codes when
`groups` is given) so paired differences keep their correlation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bench.core.groups import group_labels

#: Per-scene statistics; every metric is a function of their means.
_STATS = ("L_F", "L_O_given_F", "L_O_paper", "L_F_paper", "h_F", "h_O_given_F", "bit_accuracy", "exact_accuracy")
#: Bits by which a bound must be broken to count: per-scene code lengths are float32 sums
#: (~1e-5 bits of round-off on 30-bit codes), and a probe at its prior is not a failure.
CHECK_TOLERANCE = 1e-3
#: Probe targets whose per-scene bits `binding_metrics` reads.
TARGET_STATS = {"F": "L_F", "O|F": "L_O_given_F", "O_paper": "L_O_paper", "F_paper": "L_F_paper"}


@dataclass(frozen=True)
class Priors:
    """Analytic entropies (bits) of the evaluated split."""

    H_O: float
    H_F: float
    H_O_given_F: float

    @classmethod
    def from_split_info(cls, info: dict[str, Any]) -> "Priors":
        return cls(float(info["H_O"]), float(info["H_F"]), float(info["H_O_given_F"]))


def _ratio(num: np.ndarray | None, den: np.ndarray | float | None) -> np.ndarray | None:
    if num is None or den is None or np.any(np.asarray(den) <= 0):
        return None
    return num / den


def _diff(a: np.ndarray | float | None, b: np.ndarray | None) -> np.ndarray | None:
    return None if a is None or b is None else a - b


def _derived(p: Priors, m: dict[str, np.ndarray | None]) -> dict[str, np.ndarray | None]:
    """Metrics from (bootstrapped) means of the per-scene statistics."""
    h_f = p.H_F if m["h_F"] is None else m["h_F"]
    h_of = p.H_O_given_F if m["h_O_given_F"] is None else m["h_O_given_F"]
    h_o = h_f + h_of
    l_f, l_of, lo_p, lf_p = m["L_F"], m["L_O_given_F"], m["L_O_paper"], m["L_F_paper"]
    l_o = None if l_f is None or l_of is None else l_f + l_of
    b_f, b_star, b_o = _diff(h_f, l_f), _diff(h_of, l_of), _diff(h_o, l_o)
    b_f_p, b_o_p = _diff(h_f, lf_p), _diff(h_o, lo_p)
    b_star_p = None if lo_p is None or lf_p is None else h_of - (lo_p - lf_p)
    out = {k: v for k, v in m.items() if not k.startswith("h_")}
    return {
        **out, "H_F": h_f, "H_O_given_F": h_of, "H_O": h_o, "L_O": l_o,
        "B_F": b_f, "beta_F": _ratio(b_f, h_f),
        "B_star": b_star, "beta_star": _ratio(b_star, h_of),
        "B_O": b_o, "beta_O": _ratio(b_o, h_o),
        "B_F_paper": b_f_p, "B_O_paper": b_o_p, "beta_O_paper": _ratio(b_o_p, h_o),
        "B_star_paper": b_star_p, "beta_star_paper": _ratio(b_star_p, h_of),
    }


def binding_metrics(
    priors: Priors,
    bits: Mapping[str, np.ndarray | None],
    *,
    ref_F: np.ndarray | None = None,
    ref_O_given_F: np.ndarray | None = None,
    correct: np.ndarray | None = None,
    n_bits: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    groups: np.ndarray | None = None,
) -> dict[str, float | None]:
    """Every binding metric with `<name>_lo` / `<name>_hi` bootstrap bounds.

    `bits` maps probe targets ("F", "O|F", "O_paper", "F_paper"; see `TARGET_STATS`) to
    per-test-scene code lengths, aligned; a missing or None entry leaves the metrics that
    need it None. `ref_F` / `ref_O_given_F` are the scenes' own prior code lengths,
    -log2 P(f) and H(O|F=f) (None: the split's analytic entropies from `priors`).
    `correct` counts teacher-forced correct O bits per scene out of `n_bits` (from the
    O-given-F probe): bit accuracy is their mean share, exact match the share of scenes
    with all bits right (greedy decoding's exact match too: with every conditional right
    given the true prefix, decoding reproduces the true code). `groups` (each scene's F
    code, one row per scene) makes the bootstrap resample whole groups.
    """
    unknown = set(bits) - set(TARGET_STATS)
    if unknown:
        raise ValueError(f"binding_metrics: unknown probe targets {sorted(unknown)}")
    per_scene: dict[str, np.ndarray | None] = {TARGET_STATS[t]: b for t, b in bits.items()}
    per_scene.update({
        "h_F": ref_F, "h_O_given_F": ref_O_given_F,
        "bit_accuracy": None if correct is None else correct / n_bits,
        "exact_accuracy": None if correct is None else (correct == n_bits).astype(np.float64),
    })
    present = [k for k in _STATS if per_scene.get(k) is not None]
    if not any(k.startswith("L_") for k in present):
        raise ValueError("binding_metrics needs at least one probe's per-scene bits")
    matrix = np.stack([np.asarray(per_scene[k], dtype=np.float64) for k in present], axis=1)
    point = _derived(priors, _columns(matrix.mean(axis=0), present))
    boot = _derived(priors, _columns(bootstrap_means(matrix, n_boot, seed, groups), present))
    tail = (1 - level) / 2 * 100
    # every metric's bounds in one call: one np.percentile per metric and side was 3,276 calls
    # (0.16 s) of a 26-row-set fit's host work
    sampled = [name for name, samples in boot.items() if samples is not None and not name.startswith("H_")]
    bounds = dict(zip(sampled, np.percentile(
        np.stack([np.broadcast_to(boot[name], (n_boot,)) for name in sampled], axis=1), [tail, 100 - tail], axis=0
    ).T)) if sampled else {}
    out: dict[str, float | None] = {}
    for name, value in point.items():
        if name.startswith("H_"):  # references: no interval
            out[name] = float(value)
            continue
        out[name] = None if value is None else float(value)
        lo, hi = bounds.get(name, (None, None))
        out[f"{name}_lo"] = None if lo is None else float(lo)
        out[f"{name}_hi"] = None if hi is None else float(hi)
    return out


def paired_difference(a: Mapping[str, np.ndarray | None], b: Mapping[str, np.ndarray | None], metric: str, *,
                      groups: np.ndarray | None = None, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float] | None:
    """metric(a) − metric(b) on the same test scenes, with a paired bootstrap interval.

    `a` and `b` map per-scene statistics (`_STATS` names: "L_F", "L_O_given_F", ..., "h_F",
    "h_O_given_F") to arrays over the same scenes in the same order. Both are resampled with
    the same weights — whole `groups` (each scene's F code) at a time — so what the two
    share (which scenes are hard, which F codes the test split drew) cancels, and the
    interval is that of the difference, far narrower than two overlapping marginal ones.
    None when the metric cannot be computed for both.
    """
    names = [k for k in _STATS if a.get(k) is not None and b.get(k) is not None]
    if not names:
        return None
    left = np.stack([np.asarray(a[k], dtype=np.float64) for k in names], axis=1)
    right = np.stack([np.asarray(b[k], dtype=np.float64) for k in names], axis=1)
    if left.shape != right.shape:
        raise ValueError(f"paired_difference: {left.shape[0]} and {right.shape[0]} scenes; pairs need the same scenes")
    both = np.concatenate([left, right], axis=1)
    point = _columns(both.mean(axis=0), names + [f"b:{k}" for k in names])
    boot = _columns(bootstrap_means(both, n_boot, seed, groups), names + [f"b:{k}" for k in names])
    fallback = Priors(math.nan, math.nan, math.nan)

    def value(means: Mapping[str, Any], side: str) -> np.ndarray | None:
        stats = {k: means.get(f"{side}{k}") for k in _STATS}
        return _derived(fallback, stats).get(metric)

    diff, samples = value(point, ""), value(boot, "")
    other, other_samples = value(point, "b:"), value(boot, "b:")
    if diff is None or other is None or samples is None or other_samples is None:
        return None
    d = samples - other_samples
    tail = (1 - level) / 2 * 100
    return float(diff - other), float(np.percentile(d, tail)), float(np.percentile(d, 100 - tail))


def paired_mean_difference(a: np.ndarray, b: np.ndarray, *, groups: np.ndarray | None = None, n_boot: int = 1000,
                           seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """mean(a) − mean(b) of per-scene values on the same scenes, with the paired bootstrap interval
    `paired_difference` gives binding metrics (the same resampling, whole `groups` at a time): what
    `bench compare` pairs a task's rows on when its metric is a mean over test scenes."""
    both = np.stack([np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)], axis=1)
    means = bootstrap_means(both, n_boot, seed, groups)
    d = means[:, 0] - means[:, 1]
    tail = (1 - level) / 2 * 100
    return float(both[:, 0].mean() - both[:, 1].mean()), float(np.percentile(d, tail)), float(np.percentile(d, 100 - tail))


def paired_ratio_difference(a: Sequence[np.ndarray], b: Sequence[np.ndarray],
                            statistic: Callable[[np.ndarray], np.ndarray], *, n_boot: int = 1000, seed: int = 0,
                            level: float = 0.95) -> tuple[float, float, float] | None:
    """statistic(a) − statistic(b) of two measurements on the same N scenes whose metric is no mean of
    per-scene values but a function of per-scene sums (a ratio of sums: mIoU, a loss per element),
    with the paired bootstrap interval: every replicate draws the same scenes for both
    (`bootstrap_means`) and recomputes each side's metric on them. `a` and `b` hold one (N, k)
    matrix per seed (a side's metric is the mean over its seeds'); `statistic` maps column sums,
    (..., k), to the metric and must not change when they are scaled (the point is its value on the
    sums, each replicate's on the drawn scenes' means). None when no replicate has a finite difference."""
    mats = [np.asarray(m, dtype=np.float64) for m in (*a, *b)]
    cuts = np.cumsum([m.shape[1] for m in mats])[:-1]
    parts = np.split(bootstrap_means(np.concatenate(mats, axis=1), n_boot, seed), cuts, axis=1)
    points = [float(statistic(m.sum(0))) for m in mats]
    replicates = [statistic(p) for p in parts]
    n = len(a)
    diff = float(np.mean(points[:n]) - np.mean(points[n:]))
    d = np.mean(replicates[:n], axis=0) - np.mean(replicates[n:], axis=0)
    d = d[np.isfinite(d)]
    if not np.isfinite(diff) or not len(d):
        return None
    tail = (1 - level) / 2 * 100
    return diff, float(np.percentile(d, tail)), float(np.percentile(d, 100 - tail))


def metric_checks(m: Mapping[str, Any], metric: str = "beta_star") -> list[str]:
    """The inequalities a row's probes break, so that its `metric` cannot be read as binding;
    empty when nothing shows a failure. `m` is a results row or `binding_metrics` output.

    True entropies obey H(F|Z) ≤ H(F), H(O|F,Z) ≤ H(O|F), H(O|Z) ≤ H(O) and
    H(F|Z) ≤ H(O|Z) (F is a function of O). A check fires only when the whole 95% interval
    is on the impossible side, so noise around a bound is not flagged.
    - Headline metrics (anchored probes): "L_F > H(F)" or "L_O|F > H(O|F)" — a probe that
      codes its test targets worse than the prior it started from (it was selected on
      validation F codes that were easier than the test's).
    - `*_paper` metrics: "L_F > H(F)", "L_O > H(O)" (a probe worse than the prior) and
      "L_O < L_F" (β*_paper > 1): on test F codes it never saw, an unanchored probe can be
      confidently wrong for tens of bits per scene, which sends the difference anywhere.
      β* < 0 alone is not checked: it is the raw reading "no binding found".
    - Every metric: "not converged" when one of its probes stopped before its validation
      plateau or had its best epoch in the last 10% of the epoch budget (`converged`, or
      `converged_paper` for the paper's probes, False): more training might change it.
    """
    def below_zero(key: str) -> bool:
        value = m.get(key)
        return value is not None and bool(np.isfinite(value)) and value < -CHECK_TOLERANCE

    checks = []
    if metric.endswith("_paper"):
        if below_zero("B_F_paper_hi"):
            checks.append("L_F > H(F)")
        if below_zero("B_O_paper_hi"):
            checks.append("L_O > H(O)")
        value = m.get("beta_star_paper_lo")
        if value is not None and bool(np.isfinite(value)) and value > 1:
            checks.append("L_O < L_F")
    else:
        if below_zero("B_F_hi"):
            checks.append("L_F > H(F)")
        if below_zero("B_star_hi"):
            checks.append("L_O|F > H(O|F)")
    if m.get("converged_paper" if metric.endswith("_paper") else "converged") is False:
        checks.append("not converged")
    return checks


def row_checks(m: Mapping[str, Any]) -> list[str]:
    """Every check a binding row breaks, as its `checks` column stores them: the headline's
    (`metric_checks(m)`), then the paper estimator's own inequalities prefixed "β*_paper: " (its
    "not converged" is left out: the headline's convergence is what the row's own probes report)."""
    return metric_checks(m) + [f"β*_paper: {c}" for c in metric_checks(m, "beta_star_paper") if c != "not converged"]


#: A row's validation statistics (`val_*` columns) by the per-scene statistic they average.
VALIDATION_STATS = {"L_F": "val_L_F", "L_O_given_F": "val_L_O_given_F", "L_O_paper": "val_L_O_paper",
                    "L_F_paper": "val_L_F_paper", "h_F": "val_H_F", "h_O_given_F": "val_H_O_given_F"}


def validation_metric(row: Mapping[str, Any], name: str) -> float | None:
    """A results row's metric `name` measured on validation instead of test (None where the row
    lacks what it needs): layers are chosen on it, so the test number reported for the chosen
    layer is not the maximum of several noisy test numbers. A row that stores the metric on
    validation itself (`val_<name>`, e.g. IsSameObject's accuracy) gives it; a binding metric
    is derived from the row's validation code lengths and references."""
    if row.get(f"val_{name}") is not None:
        return float(row[f"val_{name}"])
    means = {stat: row.get(col) for stat, col in VALIDATION_STATS.items()}
    if all(means[k] is None for k in ("L_F", "L_O_given_F", "L_O_paper", "L_F_paper")):
        return None
    means.update(bit_accuracy=None, exact_accuracy=None)
    values = {k: (None if v is None else np.asarray(float(v))) for k, v in means.items()}
    h_f, h_of = values["h_F"], values["h_O_given_F"]
    if h_f is None or h_of is None:
        return None
    value = _derived(Priors(float(h_f + h_of), float(h_f), float(h_of)), values).get(name)
    return None if value is None else float(value)


def _columns(means: np.ndarray, present: list[str]) -> dict[str, np.ndarray | None]:
    """Means (m,) or bootstrap means (n_boot, m) keyed by statistic (None where absent); names
    in `present` beyond the statistics (a paired bootstrap's second side) are kept as given."""
    out = {k: (means[..., present.index(k)] if k in present else None) for k in _STATS}
    out.update({k: means[..., i] for i, k in enumerate(present) if k not in out})
    return out


def bootstrap_means(matrix: np.ndarray, n_boot: int, seed: int, groups: np.ndarray | None = None,
                    chunk: int = 256) -> np.ndarray:
    """n_boot x m means of scenes resampled with replacement (multinomial weights): the one
    resampling of test scenes every task's intervals use (binding's bits, segmentation's per-image
    counts and scores), so their intervals are drawn alike.

    With `groups` (one label per scene) whole groups are resampled: test scenes that share
    an F code are not independent draws (every probe meets that code for the first time),
    and an interval over scenes alone would ignore which F codes the test split happened
    to hold.

    Summed in one fixed order (`_fixed_order_sums`), not by a BLAS product: numpy's BLAS rounds a
    product by the kernel it picks for the processor and by its threads, so an interval's last bits
    depended on the machine."""
    labels = group_labels(groups, len(matrix))
    g = int(labels.max()) + 1 if len(labels) else 0
    sums = np.zeros((g, matrix.shape[1]))
    np.add.at(sums, labels, matrix)  # each group's scenes in scene order
    sizes = np.bincount(labels, minlength=g).astype(np.float64)[:, None]
    out = [_fixed_order_sums(draws, sums) / _fixed_order_sums(draws, sizes)
           for draws in _group_draws(g, n_boot, seed, chunk)]
    return np.concatenate(out) if out else np.zeros((0, matrix.shape[1]))


def _fixed_order_sums(weights: np.ndarray, values: np.ndarray, block_bytes: int = 2**24) -> np.ndarray:
    """weights (r x g) times values (g x m), each output summed over g in index order, whatever the
    processor (numpy adds along a leading axis row after row), a block of rows of ~16 MiB at a time."""
    rows = max(1, block_bytes // (8 * max(values.size, 1)))
    return np.concatenate([np.add.reduce(weights[i : i + rows, :, None] * values[None], axis=1)
                           for i in range(0, len(weights), rows)])


def _group_draws(g: int, n_boot: int, seed: int, chunk: int) -> tuple[np.ndarray, ...]:
    """How often each of `g` groups is drawn in each of `n_boot` resamples (chunks of resamples x
    groups, read-only): the same for every probe, family and row set of a run (one seed, one test
    split), drawn once (drawn per call, 26 row sets' 156 draws took 0.2 s of an H200's fit)."""
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, n_boot, chunk):
        draws = rng.multinomial(g, np.full(g, 1.0 / g), size=min(chunk, n_boot - start)).astype(np.int32)
        draws.flags.writeable = False
        out.append(draws)
    return tuple(out)
