"""`bench compare`: two backbones' paired difference per dataset, probe column and metric, with
its bootstrap interval over the test scenes both were measured on. It pairs the rows of the task
whose record names what compare reports (`Task.compare_metrics`, bench/core/tasks.py)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from bench.core.errors import BenchError
from bench.core.tasks import DEFAULT_TASK, TASKS
from leaderboards.board import build_leaderboard, paired_cells, verdict

COMPARE_COLUMNS = ("dataset", "probe", "tokens", "metric", "a", "a_layer", "b", "b_layer", "difference", "lo", "hi",
                   "verdict")


def compare_backbones(rows: Iterable[dict[str, Any]], a: str, b: str, *, metrics: Sequence[str] = (),
                      dataset: str | None = None, probes: Sequence[str] = (), tokens: Sequence[str] = (),
                      layer: str | int = "best") -> list[dict[str, Any]]:
    """metric(a) − metric(b) per dataset, probe column and metric, with the paired bootstrap
    interval over the test scenes both were measured on (BenchError when either backbone has no
    rows, or the two were not measured on the same scenes)."""
    paired = [name for name, t in TASKS.items() if t.compare_metrics]  # the default task's, when it has some
    task = DEFAULT_TASK if DEFAULT_TASK in paired else paired[0]
    rows = [r for r in rows if r["task"] == task and r.get("control") is None]
    present = sorted({r["backbone"] for r in rows})
    for name in (a, b):
        if name not in present:
            raise BenchError(f"backbone: no {task} results for {name!r}; present: {', '.join(present) or 'none'}")
    out = []
    for metric in metrics or TASKS.get(task).compare_metrics:
        board = build_leaderboard(rows, dataset=dataset, task=task, metric=metric, probes=probes, tokens=tokens,
                                  layer=layer)
        for ds in board.datasets:
            mine = {r.backbone: r for r in board.rows if r.dataset == ds and r.backbone in (a, b)}
            if len(mine) < 2:
                continue
            for col in board.columns:
                ca, cb = mine[a].cells[col], mine[b].cells[col]
                if ca is None or cb is None or ca.status != "ok" or cb.status != "ok":
                    continue
                paired = paired_cells(ca, cb, board.metric)
                if paired is None:
                    raise BenchError(f"compare: {a} and {b} on {ds} were not measured on the same test scenes with "
                                     "per-scene bits (results from before this BindingBench, or different data)")
                diff, lo, hi = paired
                side = verdict(lo, hi, board.metric)
                said = f"{a} better" if side > 0 else f"{b} better" if side < 0 else "no difference beyond noise"
                out.append({"dataset": ds, "probe": col[0], "tokens": col[1], "metric": board.metric.name,
                            "a": ca.value, "a_layer": ca.layer, "b": cb.value, "b_layer": cb.layer,
                            "difference": diff, "lo": lo, "hi": hi, "verdict": said})
    if not out:
        raise BenchError(f"compare: {a} and {b} share no finished cell (dataset, probe, tokens); "
                         "evaluate both on the same dataset with the same probes")
    return out
