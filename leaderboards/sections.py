"""The built-in tasks' sections of `bench report` (`leaderboards.report`), each named by its task's
record (`Task.report_section`, bench/core/tasks.py), so the report asks the record, not the name.

A section says first which figures it draws (`figures`: keys, each drawn to `<key>.png`, claimed
in the report's figures folder before any is drawn), then fills the page's context (`context`).
Keys and context names start with the task's name, which the report template reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from leaderboards import html
from leaderboards.board import build_leaderboard
from leaderboards.plots import layer_curves, probe_bars

#: One curves figure per group, four panels at most, so each stays readable.
PROBE_GROUPS = {
    "probes": ("linear", "diag-quadratic", "quadratic", "pointwise-identity"),
    "baselines": ("cosine", "dot", "distance", "majority"),
}
#: The pair metrics a report can draw (`bench report --metric`: the first three) and show.
METRIC_KEYS = ("accuracy", "balanced_accuracy", "auroc", "majority_accuracy")

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Section:
    """`figures(task, rows) -> keys`; `context(task, rows, figures, metric) -> page context`."""

    figures: Callable[[str, Rows], list[str]]
    context: Callable[[str, Rows, dict[str, Path], str], dict[str, Any]]


def _board_figures(task: str, rows: Rows) -> list[str]:
    return [*([f"{task}_layers"] if any(r["n_layers"] for r in rows) else []), f"{task}_bars"]


def _board_context(task: str, rows: Rows, figures: dict[str, Path], metric: str) -> dict[str, Any]:
    """The headline leaderboard, its metric by depth (when some backbone has layers to compare)
    and by probe family."""
    board = build_leaderboard(rows, task=task)
    if f"{task}_layers" in figures:
        layer_curves(rows, figures[f"{task}_layers"], formats=("png",), task=task)
    probe_bars(board, figures[f"{task}_bars"], formats=("png",))
    return {task: html.board_view(board, anchor=task), "boards_script": True,
            f"{task}_figures": [html.data_uri(p) for k, p in figures.items() if k.startswith(f"{task}_")]}


def _groups(rows: Rows) -> dict[str, list[str]]:
    return {group: present for group, probes in PROBE_GROUPS.items()
            if (present := [p for p in probes if any(r["probe"] == p for r in rows)])}


def _curves_figures(task: str, rows: Rows) -> list[str]:
    return [f"{task}_{group}" for group in _groups(rows)]


def _curves_context(task: str, rows: Rows, figures: dict[str, Path], metric: str) -> dict[str, Any]:
    """Per-layer curves of `metric`, one figure per probe group, and per backbone and probe the
    board's layer with its test number beside the baselines."""
    groups = _groups(rows)
    pngs = [figures[f"{task}_{group}"] for group in groups]
    for group, png in zip(groups, pngs):
        layer_curves(rows, png, formats=("png",), task=task, metric=metric, probes=groups[group])
    lines = html.issameobject_view(build_leaderboard(rows, task=task, metric=metric))
    return {task: lines, f"{task}_metric": metric, f"{task}_figures": [html.data_uri(p) for p in pngs],
            f"{task}_any_test": any(x["on_test"] for x in lines),
            f"{task}_errors": sum(r["status"] != "ok" for r in rows)}


binding_section = Section(_board_figures, _board_context)
issameobject_section = Section(_curves_figures, _curves_context)
