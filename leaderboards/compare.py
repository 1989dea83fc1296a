"""`bench compare`: two backbones' paired difference per task, dataset, probe column and metric,
with its bootstrap interval over the test scenes both were measured on. Every task whose record
names what compare reports (`Task.compare_metrics`, bench/core/tasks.py) is paired, each on its
own rows. A task with per-scene bits (`Task.per_scene`, binding) pairs on them; any other pairs
on its rows' per-scene values of the metric (`scene_column`), whose mean is the metric, or, for a
metric that is no such mean (a ratio of sums: segmentation's semantic mIoU), through the hook its
record names (`Task.paired`), which resamples the same scenes for both and recomputes each metric.

An intervened backbone (`intervene:...`, bench.core.intervention_specs) compared with nothing
named is compared with its base backbone."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from bench.core.errors import BenchError
from bench.core.intervention_specs import is_intervened, parse_intervention
from bench.core.tasks import TASKS
from leaderboards.board import Cell, build_leaderboard, paired_cells, verdict
from leaderboards.metrics import METRICS, Metric, resolve_metric

COMPARE_COLUMNS = ("task", "dataset", "probe", "tokens", "metric", "a", "a_layer", "b", "b_layer", "difference", "lo",
                   "hi", "verdict")


def scene_column(metric: str) -> str:
    """The results column holding a row's per-test-scene values of `metric` (in the test split's
    order; the metric is their mean): what a task without per-scene bits is paired on."""
    return f"scene_{metric}"


def base_backbone(rows: Sequence[dict[str, Any]], a: str) -> str:
    """The backbone `a` is an intervention on, as the results name it (the base's spec, or the
    name of the rows whose spec it is); BenchError when `a` is not intervened or its base has no rows."""
    specs = {r.get("spec") or r["backbone"] for r in rows if r["backbone"] == a} or {a}
    spec = next((s for s in sorted(specs) if is_intervened(s)), a)
    if not is_intervened(spec):
        raise BenchError(f"b: name the backbone to compare {a!r} with (only an intervened backbone has a default: its "
                         "base)")
    base = parse_intervention(spec).base
    name = name_of({r["backbone"]: r.get("spec") or r["backbone"] for r in rows}, base)
    if name is None:
        raise BenchError(f"b: no results for {a!r}'s base backbone {base!r}; evaluate it on the same data")
    return name


def name_of(specs: Mapping[str, str], spec: str) -> str | None:
    """The rows' name (`specs`: name -> spec) of the backbone `spec`: itself when rows carry it as
    their name, else the first name given to it (`-m NAME=SPEC`); None when no rows are its."""
    names = sorted(n for n, s in specs.items() if spec in (n, s))
    return spec if spec in names else (names[0] if names else None)


def compare_backbones(rows: Iterable[dict[str, Any]], a: str, b: str | None = None, *, metrics: Sequence[str] = (),
                      dataset: str | None = None, probes: Sequence[str] = (), tokens: Sequence[str] = (),
                      layer: str | int = "best") -> list[dict[str, Any]]:
    """metric(a) − metric(b) per task, dataset, probe column and metric, with the paired bootstrap
    interval over the test scenes both were measured on (BenchError when either backbone has no
    rows, or the two were not measured on the same scenes). `b` None: `a`'s base backbone."""
    rows = [r for r in rows if r.get("control") is None]
    b = base_backbone(rows, a) if b is None else b
    wanted = _metrics_by_task(metrics)
    shared = [t for t in wanted if {a, b} <= {r["backbone"] for r in rows if r["task"] == t}]
    if not shared:
        for name in (a, b):
            present = sorted({r["backbone"] for r in rows if r["task"] in wanted})
            if name not in present:
                raise BenchError(f"backbone: no {'/'.join(wanted)} results for {name!r}; present: "
                                 f"{', '.join(present) or 'none'}")
    out = []
    for task in _selected(rows, shared, dataset, probes, tokens):
        mine = [r for r in rows if r["task"] == task]
        for metric in wanted[task]:
            out += _task_records(mine, task, metric, a, b, dataset=dataset, probes=probes, tokens=tokens, layer=layer)
    if not out:
        raise BenchError(f"compare: {a} and {b} share no finished cell (dataset, probe, tokens); "
                         "evaluate both on the same dataset with the same probes")
    return out


def _metrics_by_task(metrics: Sequence[str]) -> dict[str, list[str]]:
    """The metrics to pair by task: those named (each resolved to its task), else every task's
    `compare_metrics`."""
    if not metrics:
        return {name: list(t.compare_metrics) for name, t in TASKS.items() if t.compare_metrics}
    out: dict[str, list[str]] = {}
    for name in metrics:
        found = []
        for task in TASKS.names():
            try:
                found.append(resolve_metric(name, task))
            except BenchError:
                continue
        if not found:
            raise BenchError(f"metric: unknown {name!r}; allowed: {', '.join(METRICS.names())}")
        out.setdefault(found[0].task, []).append(found[0].name)
    return out


def _selected(rows: list[dict[str, Any]], tasks: Sequence[str], dataset: str | None, probes: Sequence[str],
              tokens: Sequence[str]) -> list[str]:
    """The tasks whose rows hold everything the selection names (a --probe of one task leaves the
    others out); all of them when none does, so the board says what is missing."""
    def holds(task: str) -> bool:
        mine = [r for r in rows if r["task"] == task]
        return all(set(want) <= {r[col] for r in mine} for col, want in
                   (("dataset", [dataset] if dataset else []), ("probe", probes), ("tokens", tokens)))

    return [t for t in tasks if holds(t)] or list(tasks)


def _task_records(rows: list[dict[str, Any]], task: str, metric: str, a: str, b: str, **selection: Any) -> list[dict]:
    """The paired records of one task and metric, a record per dataset and probe column both finished."""
    board = build_leaderboard(rows, task=task, metric=metric, ranked=False, **selection)
    out = []
    for ds in board.datasets:
        mine = {r.backbone: r for r in board.rows if r.dataset == ds and r.backbone in (a, b)}
        if len(mine) < 2:
            continue
        for col in board.columns:
            ca, cb = mine[a].cells[col], mine[b].cells[col]
            if ca is None or cb is None or ca.status != "ok" or cb.status != "ok":
                continue
            record = TASKS.get(task)
            hook = record.pairing(board.metric.name)
            paired = (paired_cells(ca, cb, board.metric) if record.per_scene
                      else hook(ca.rows, cb.rows) if hook is not None else _paired_scenes(ca, cb, board.metric))
            if paired is None:
                raise BenchError(f"compare: {a} and {b} on {ds} ({task}) were not measured on the same test scenes "
                                 "with per-scene values (results from before this BindingBench, or different data)")
            diff, lo, hi = paired
            side = verdict(lo, hi, board.metric)
            said = f"{a} better" if side > 0 else f"{b} better" if side < 0 else "no difference beyond noise"
            out.append({"task": task, "dataset": ds, "probe": col[0], "tokens": col[1], "metric": board.metric.name,
                        "a": ca.value, "a_layer": ca.layer, "b": cb.value, "b_layer": cb.layer,
                        "difference": diff, "lo": lo, "hi": hi, "verdict": said})
    return out


def _paired_scenes(a: Cell, b: Cell, m: Metric) -> tuple[float, float, float] | None:
    """a − b from the two cells' per-scene values of `m` (averaged over seeds), resampling the same
    scenes (whole `scene_groups` when the rows carry them); None when either lacks them or the
    two were measured on different scenes."""
    sides = []
    for cell in (a, b):
        values = [r.get(scene_column(m.name)) for r in cell.rows]
        if not values or any(v is None for v in values) or len({len(v) for v in values}) != 1:
            return None
        groups = cell.rows[0].get("scene_groups")
        sides.append((np.mean([np.asarray(v, dtype=np.float64) for v in values], axis=0),
                      None if groups is None else np.asarray(groups)))
    (va, ga), (vb, gb) = sides
    if len(va) != len(vb) or (ga is None) != (gb is None) or (ga is not None and not np.array_equal(ga, gb)):
        return None
    from evaluators.tasks.binding.metrics import paired_mean_difference

    return paired_mean_difference(va, vb, groups=ga)
