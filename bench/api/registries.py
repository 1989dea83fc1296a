"""Help texts read from the registries (tasks, probe families, tokens choices, metrics), plugins' entries
included: the CLI shows them when `--help` is asked for, so only then do plugins load."""

from __future__ import annotations


def tasks_help() -> str:
    """`--task`: every registered task (its record's summary)."""
    from bench.core.tasks import TASKS

    return "; ".join(f"{name} ({task.summary})" for name, task in TASKS.items()) + "."


def layers_help() -> str:
    """`--layers`: the forms, and each registered task's default."""
    from bench.core.tasks import TASKS

    defaults = "; ".join(f"{name}: {task.default_layers}" for name, task in TASKS.items())
    return f"Hidden states: all, last, mid, integers or fractions like 0.5, comma-separated [{defaults}]."


def probes_help() -> str:
    """`--probes`: every probe family of the task it serves, with its defaults."""
    from evaluators.probes.families import probes_help as text

    return text()


def tokens_help() -> str:
    """`--tokens` of `bench evaluate`: the tokens choices a probe can read."""
    from evaluators.probes.families import tokens_help as text

    return text()


def tokens_filter_help() -> str:
    """`--tokens` of the views of results (leaderboard, compare, plot): the tokens choices to keep."""
    from evaluators.probes.families import tokens_filter_help as text

    return text()


def metrics_help() -> str:
    """`--metric`: the metrics a leaderboard ranks by (reading it loads numpy and the metrics)."""
    from leaderboards.metrics import metrics_help as text

    return text()
