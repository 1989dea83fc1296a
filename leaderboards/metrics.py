"""The metric catalogue: every number a leaderboard can rank, by results column, with its printed
label, task, unit and direction, and what each ‡ check means. Tables, plots, the report and the
site read names and labels from here (`METRICS` is a registry: plugins add metrics through it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.core.errors import BenchError
from bench.core.registry import Registry


@dataclass(frozen=True)
class Metric:
    name: str  # the results column
    label: str  # how tables and plots title it
    task: str
    unit: str  # "%" (ratios shown x100) or "bits"
    higher_is_better: bool = True
    screened: bool = False  # cells are ‡-screened with metric_checks(row, name)

    @property
    def paper(self) -> bool:
        """The paper's two-probe estimator (unanchored direct O- and F-probes)."""
        return self.name.endswith("_paper")


def _binding(name: str, label: str, unit: str, higher_is_better: bool = True) -> Metric:
    return Metric(name, label, "binding", unit, higher_is_better, screened=True)


METRICS: Registry[Metric] = Registry("metric")
for _m in [
    # headline: the chain rule on prior-anchored probes
    _binding("beta_star", "β*", "%"),
    _binding("beta_star_paper", "β*_paper", "%"),
    _binding("B_star", "B*", "bits"),
    _binding("B_star_paper", "B*_paper", "bits"),
    _binding("beta_O", "β_O", "%"),
    _binding("beta_O_paper", "β_O_paper", "%"),
    _binding("B_O", "B_O", "bits"),
    _binding("B_O_paper", "B_O_paper", "bits"),
    _binding("beta_F", "β_F", "%"),
    _binding("B_F", "B_F", "bits"),
    _binding("B_F_paper", "B_F_paper", "bits"),
    _binding("L_F", "L_F", "bits", higher_is_better=False),
    _binding("L_O_given_F", "L_O|F", "bits", higher_is_better=False),
    _binding("L_O", "L_O", "bits", higher_is_better=False),
    _binding("L_O_paper", "L_O_paper", "bits", higher_is_better=False),
    _binding("L_F_paper", "L_F_paper", "bits", higher_is_better=False),
    _binding("bit_accuracy", "bit accuracy", "%"),
    _binding("exact_accuracy", "exact-match accuracy", "%"),
    Metric("accuracy", "IsSameObject accuracy", "issameobject", "%"),
    Metric("balanced_accuracy", "balanced accuracy", "issameobject", "%"),
    Metric("auroc", "AUROC", "issameobject", "%"),
]:
    METRICS.register(_m.name, _m)
DEFAULT_METRIC = {"binding": "beta_star", "issameobject": "accuracy"}
TASKS = tuple(DEFAULT_METRIC)


def metrics_help() -> str:
    """`bench leaderboard --metric` help: every registered metric per task, the default first."""
    per_task = {t: [m.name for _, m in METRICS.items() if m.task == t] for t in TASKS}
    return ("beta_star (β* from prior-anchored probes, default), beta_star_paper (the paper's two-probe estimator); "
            + "; ".join(f"{t}: {', '.join(names)}" for t, names in per_task.items()) + ".")


def resolve_metric(name: str | None, task: str) -> Metric:
    """A metric by results-column name or printed label (β*, β*_paper, L_O|F, ...), checked against the task."""
    if name is None:
        return METRICS.get(DEFAULT_METRIC[task])
    wanted = _norm(name)
    for _, m in METRICS.items():
        if wanted in (_norm(m.name), _norm(m.label)):
            if m.task != task:
                raise BenchError(f"metric: {m.name!r} belongs to task {m.task!r}, not {task!r}")
            return m
    allowed = ", ".join(f"{m.name} ({m.label})" for _, m in METRICS.items() if m.task == task)
    raise BenchError(f"metric: unknown {name!r} for task {task!r}; allowed: {allowed}")


def _norm(name: str) -> str:
    """Spelling-insensitive key: "β*_paper", "beta_star_paper" and "B* paper"-style names meet."""
    name = name.lower().replace("β", "beta").replace("*", "star").replace("|", "given")
    return re.sub(r"[\s_]", "", name)


#: What each `metric_checks` reason means, in the order the ‡ note lists them.
CHECK_MEANINGS = {
    "L_F > H(F)": "the F-probe coded the test F codes in more bits than their prior",
    "L_O|F > H(O|F)": "the O|F-probe coded the test objects in more bits than the exact prior it started from",
    "L_O > H(O)": "the direct O-probe coded the test objects in more bits than their prior",
    "L_O < L_F": "the direct O-probe beat the F-probe, so β*_paper > 1, impossible since F is a function of O",
    "not converged": "a probe's best epoch lay in the last 10% of its epoch budget, or it stopped before its validation plateau, so more training could still move it",
}
