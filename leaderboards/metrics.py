"""The metric catalogue: every number a leaderboard can rank, by results column, with its printed
label, task, unit and direction (each task's record lists its own, `Task.metrics`), and what each ‡
check means. Tables, plots, the report and the site read names and labels from here (`METRICS` is
a registry: plugins add metrics through it)."""

from __future__ import annotations

import re
from dataclasses import replace

from bench.core.errors import BenchError
from bench.core.registry import Registry
from bench.core.tasks import TASKS, Metric

__all__ = ["METRICS", "Metric", "CHECK_MEANINGS", "metrics_help", "resolve_metric"]


def _task_metrics() -> None:
    """Every registered task's metrics (`Task.metrics`), under their task's name."""
    for name, task in TASKS.items():
        for m in task.metrics:
            METRICS.register(m.name, m if m.task == name else replace(m, task=name))


#: Every metric a leaderboard ranks: the tasks' (registered by their records), then any plugin's.
METRICS: Registry[Metric] = Registry("metric", builtins=(_task_metrics,))


def metrics_help() -> str:
    """`bench leaderboard --metric` help: every registered metric per task, the default first."""
    per_task = {t: [m.name for _, m in METRICS.items() if m.task == t] for t in TASKS.names()}
    return ("beta_star (β* from prior-anchored probes, default), beta_star_paper (the paper's two-probe estimator); "
            + "; ".join(f"{t}: {', '.join(names)}" for t, names in per_task.items()) + ".")


def resolve_metric(name: str | None, task: str) -> Metric:
    """A metric by results-column name or printed label (β*, β*_paper, L_O|F, ...), checked against the task."""
    if name is None:
        return METRICS.get(TASKS.get(task).metric)
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
