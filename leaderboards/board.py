"""The board: one row per backbone, one column per probe family x tokens choice, built once from the
result rows and read by every view (`bench leaderboard`, `compare`, `plot`, `report`, `site`).

A cell is the metric at one layer, averaged over seeds, with the bootstrap 95% interval
(the envelope of the seeds' intervals, so seed-to-seed spread is never hidden). These
rules keep the table honest:
- ranks come from paired comparisons: two backbones measured on the same test scenes differ
  by a paired difference with a bootstrap interval over the same F codes, and a backbone's
  rank is 1 + the number of others whose difference from it lies wholly beyond 0, so a lead
  within the noise earns nothing (rows without per-scene bits fall back to comparing the
  two marginal intervals);
- a control null (`control` "resampled-o": O redrawn from p(O|F), true β* = 0) is shown as a
  row of its own and never ranked, and so is a backbone that reads the scene's ground truth (an
  `intervene:inject=...` spec: it is handed the objects' masks);
- a cell whose interval holds 0 shows its probe's sensitivity beside it: the share of a planted,
  known binding the same probe recovers on that dataset at that size, so a reader knows what
  a 0 means;
- a cell is empty unless every seed run for that column finished (no partial means);
- a backbone is ranked by its best unflagged cell among the columns selected (shown or not): empty, error
  and ‡ cells neither rank it nor unrank it (an oracle that cannot run one probe still
  ranks on the others), and a backbone with no such cell is unranked;
- backbones without layers (oracles, pixels) show their one layer whatever layer is asked;
- a binding cell whose own rows break a check (`evaluators.tasks.binding.metrics.metric_checks` for that
  metric: a probe coded its target worse than the prior, the paper's two probes contradict
  each other, or a probe had not converged) is marked ‡ and never ranks a backbone or wins
  a `best` layer: its value is a probe's failure, not binding;
- a cell from an unanchored run (`prior` "none": probes that learned the prior themselves)
  or from imported real images (`prior` "empirical": measured against a blind reference probe)
  is marked † and ranked only among such backbones: its β* is not comparable with anchored rows;
- binding intervals resample whole test F codes, so the notes give each dataset's effective
  number of test F codes (`n_F_eff`), the intervals' real sample size;
- `best` layer is chosen per cell on validation (`evaluators.tasks.binding.metrics.validation_metric`) and
  the test number of that layer is reported, so the choice does not pick the luckiest of
  several noisy test numbers; rows without validation numbers (written before they were
  kept) choose on test, and the title says so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import numpy as np

from bench.core.errors import BenchError
from bench.core.intervention_specs import reads_ground_truth
from bench.core.tasks import DEFAULT_TASK, TASKS
from evaluators.probes.families import TOKEN_CHOICES
from evaluators.tasks.binding.metrics import metric_checks, paired_difference, validation_metric
from leaderboards.metrics import CHECK_MEANINGS, Metric, resolve_metric
from leaderboards.published import Reference, references_for


def parse_layer(layer: str) -> str | int:
    """`best`, `last` or a hidden-states index (0 = embeddings)."""
    if layer in ("best", "last"):
        return layer
    try:
        n = int(layer)
    except ValueError:
        raise BenchError(f"layer: expected best, last or a layer index, got {layer!r}") from None
    if n < 0:
        raise BenchError(f"layer: must be ≥ 0, got {n}")
    return n


@dataclass(frozen=True)
class Cell:
    """One (backbone, probe, tokens) measurement at one layer, over seeds."""

    status: str  # ok | error | incomplete
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    layer: int | None = None
    n_layers: int | None = None
    n_seeds: int = 0
    error: str | None = None
    checks: tuple[str, ...] = ()  # why the value is a failed probe's, not binding
    prior: str | None = None  # the rows' `prior`: "exact", "none" (unanchored), several joined by ","
    #: the probe's sensitivity on this dataset (share of a planted binding it recovers), over seeds
    sensitivity: float | None = None
    sensitivity_lo: float | None = None
    sensitivity_hi: float | None = None
    #: "validation" when `best` chose this layer on validation numbers, "test" when it had none
    chosen_on: str | None = None
    #: per-scene statistics averaged over seeds (`evaluators.tasks.binding.metrics` names) and the scenes'
    #: F-code groups: what a paired comparison with another cell on the same scenes needs
    per_scene: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)
    groups: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: the result rows the cell averages (one per seed, at its layer): the views that show a
    #: row's other columns beside the metric (the report's attention correlation) read them here
    rows: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)

    @property
    def holds_zero(self) -> bool:
        """Whether 0 lies in the cell's interval (no binding found beyond noise)."""
        return self.lo is not None and self.hi is not None and self.lo <= 0 <= self.hi

    @property
    def unanchored(self) -> bool:
        """Probes that learned the prior themselves (any prior but "exact"; None = not recorded)."""
        return self.prior is not None and self.prior != "exact"

    @property
    def half_width(self) -> float | None:
        if self.lo is None or self.hi is None:
            return None
        return (self.hi - self.lo) / 2


@dataclass
class BoardRow:
    dataset: str
    backbone: str
    cells: dict[tuple[str, str], Cell | None]
    rank: int | None = None
    score: Cell | None = None  # the cell the rank is based on
    control: str | None = None  # a control null's rows (never ranked)
    reads_ground_truth: bool = False  # its backbone is handed the scene's ground truth (never ranked)
    reference: Reference | None = None  # a paper's published row (never ranked)

    @property
    def label(self) -> str:
        """The row's name in every view: a control and a published row say what they are."""
        if self.reference is not None:
            return f"{self.backbone} (published)"
        if self.reads_ground_truth:
            return f"{self.backbone} (reads ground truth)"
        return self.backbone if self.control is None else f"{self.backbone} (control: {self.control})"


@dataclass
class Leaderboard:
    task: str
    metric: Metric
    layer: str | int
    columns: list[tuple[str, str]]
    rows: list[BoardRow] = field(default_factory=list)
    #: Per dataset shown: the effective numbers of test F codes its rows report (binding only).
    n_F_eff: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def datasets(self) -> list[str]:
        """The measured datasets (a published row's dataset is the paper's, named in its notes)."""
        return sorted({r.dataset for r in self.rows if r.reference is None})

    @property
    def references(self) -> list[Reference]:
        """The published rows' sources, one per row shown."""
        return [r.reference for r in self.rows if r.reference is not None]

    @property
    def has_values(self) -> bool:
        """Whether any cell holds a number (a metric the rows never computed leaves none)."""
        return any(c.status == "ok" for c in self._cells())

    @property
    def has_failed_cells(self) -> bool:
        """Whether any cell is marked ‡ (tables and plots then explain the mark)."""
        return bool(self.fired_checks)

    @property
    def fired_checks(self) -> list[str]:
        """Every check some cell breaks, in the order `metric_checks` names them."""
        fired = {k for c in self._cells() for k in c.checks}
        return [k for k in CHECK_MEANINGS if k in fired] + sorted(fired - set(CHECK_MEANINGS))

    @property
    def has_unanchored_cells(self) -> bool:
        """Whether any cell is marked †: an unanchored run's, under a headline metric (the
        `*_paper` estimator is unanchored for every row, so it marks none)."""
        return not self.metric.paper and any(c.unanchored for c in self._cells())

    @property
    def unanchored_backbones(self) -> set[tuple[str, str]]:
        """(dataset, label) of the rows with † cells: ranked apart, labelled in plots."""
        return {(r.dataset, r.label) for r in self.rows if _unanchored_row(r, self.metric)}

    def _cells(self) -> Iterable[Cell]:
        return (c for r in self.rows for c in r.cells.values() if c is not None)


def build_leaderboard(
    rows: Iterable[dict[str, Any]],
    *,
    dataset: str | None = None,
    task: str | None = None,
    metric: str | None = None,
    probes: Sequence[str] = (),
    tokens: Sequence[str] = (),
    layer: str | int = "best",
    reference: bool = False,
    ranked: bool = True,
) -> Leaderboard:
    """The leaderboard of deduplicated result rows (see `leaderboards.store.latest`); with
    `reference`, the papers' published rows for this metric below them, never ranked. `ranked`
    False leaves every rank empty: a view that reads only cells (a metric-by-layer table, a
    curve) skips the paired bootstraps ranks cost."""
    rows = list(rows)
    task = _pick_task(rows, task)
    m = resolve_metric(metric, task)
    layer = parse_layer(layer) if isinstance(layer, str) else layer
    rows = [r for r in rows if r["task"] == task]
    rows = _filter(rows, "dataset", [dataset] if dataset else [])
    rows = _filter(rows, "probe", probes)
    rows = _filter(rows, "tokens", tokens)
    order = probe_order(task)
    columns = sorted({(r["probe"], r["tokens"]) for r in rows}, key=lambda col: _column_order(col, order))
    # Seeds a column was run with, over all backbones: a cell short of them is incomplete.
    expected = defaultdict(set)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        expected[(r["dataset"], r["probe"], r["tokens"])].add(r["seed"])
        groups[(r["dataset"], r["backbone"], r.get("control"), r["probe"], r["tokens"])].append(r)
    board = Leaderboard(task, m, layer, columns)
    if TASKS.get(task).per_scene:
        for ds in sorted({r["dataset"] for r in rows}):
            board.n_F_eff[ds] = tuple(sorted({float(r["n_F_eff"]) for r in rows if r["dataset"] == ds
                                              and r.get("n_F_eff") is not None and math.isfinite(r["n_F_eff"])}))
    truth = {r["backbone"] for r in rows if reads_ground_truth(r.get("spec") or r["backbone"])}
    for ds, backbone, control in sorted({(r["dataset"], r["backbone"], r.get("control")) for r in rows},
                                        key=lambda k: (k[0], k[1], k[2] or "")):
        cells = {
            col: _cell(groups.get((ds, backbone, control, *col), []), m, layer, expected[(ds, *col)]) for col in columns
        }
        board.rows.append(BoardRow(ds, backbone, cells, control=control, reads_ground_truth=backbone in truth))
    if ranked:
        _rank(board)
    if reference:
        _add_references(board, probes, tokens)
    return board


def _add_references(board: Leaderboard, probes: Sequence[str], tokens: Sequence[str]) -> None:
    """The published rows of the board's metric (within its --probe / --tokens selection), one
    board row per (paper, table, backbone), after every measured row; their columns join the board's."""
    refs = [r for r in references_for(board.metric)
            if (not probes or r.probe in probes) and (not tokens or r.tokens in tokens)]
    grouped: dict[tuple, list[Reference]] = defaultdict(list)
    for ref in refs:
        grouped[(ref.paper, ref.table, ref.backbone)].append(ref)
    order = probe_order(board.task)
    board.columns = sorted({*board.columns, *((r.probe, r.tokens) for r in refs)},
                           key=lambda col: _column_order(col, order))
    for row in board.rows:
        row.cells = {col: row.cells.get(col) for col in board.columns}
    for group in grouped.values():
        cells: dict[tuple[str, str], Cell | None] = {col: None for col in board.columns}
        for ref in group:
            cells[(ref.probe, ref.tokens)] = Cell("ok", ref.value(board.metric))
        board.rows.append(BoardRow(group[0].dataset, group[0].backbone, cells, reference=group[0]))


def _pick_task(rows: list[dict], task: str | None) -> str:
    """`task`, checked (an unknown one is one line listing the tasks; one the rows do not hold, one
    line naming those they do), else the default task when the rows hold it or nothing, else the
    first task present."""
    present = {r["task"] for r in rows}
    if task is not None:
        TASKS.get(task)
        if present and task not in present:
            raise BenchError(f"task: no results for {task!r}; present: {', '.join(sorted(present))}")
        return task
    return DEFAULT_TASK if DEFAULT_TASK in present or not present else sorted(present)[0]


def _filter(rows: list[dict], column: str, allowed: Sequence[str]) -> list[dict]:
    if not allowed:
        return rows
    present = {r[column] for r in rows}
    missing = [a for a in allowed if a not in present]
    if missing:
        raise BenchError(f"{column}: no results for {', '.join(map(repr, missing))}; present: {', '.join(sorted(present)) or 'none'}")
    return [r for r in rows if r[column] in allowed]


def probe_order(task: str) -> tuple[str, ...]:
    """Column order: the task's probes in registration order, which reads left to right from
    weakest to strongest reader, as the paper's table does (plugins' probes come last)."""
    return TASKS.get(task).probe_registry.names()


def _column_order(col: tuple[str, str], order: Sequence[str]) -> tuple:
    """Pooled views before spatial ones, then probes in `order`, then views in registration order."""
    probe, tokens = col
    token_choices = TOKEN_CHOICES.names()
    p = order.index(probe) if probe in order else len(order)
    t = token_choices.index(tokens) if tokens in token_choices else len(token_choices)
    spatial = tokens in TOKEN_CHOICES and TOKEN_CHOICES.get(tokens).spatial
    return (spatial, p, probe, t, tokens)


def _cell(rows: list[dict], m: Metric, layer: str | int, seeds: set[int]) -> Cell | None:
    """The cell at the requested layer; `best` picks among layers whose every seed succeeded."""
    if not rows:
        return None
    by_layer: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_layer[r["layer"]].append(r)
    if layer == "last":
        n_layers = max(r["n_layers"] for r in rows)
        candidates = [n_layers] if n_layers in by_layer else []
    elif layer == "best":
        candidates = sorted(by_layer)
    elif max(r["n_layers"] for r in rows) == 0:  # oracles and pixels: their one layer stands at any depth
        candidates = [0]
    else:
        candidates = [layer] if layer in by_layer else []
    cells = [_layer_cell(by_layer[c], m, seeds) for c in candidates]
    ok = [c for c in cells if c.status == "ok"]
    if ok:
        sign = 1 if m.higher_is_better else -1
        if layer != "best" or len(ok) == 1:
            return max(ok, key=lambda c: (not c.checks, sign * c.value, -c.layer))
        on_val = {c.layer: _validation_value(by_layer[c.layer], m) for c in ok}
        if all(v is not None for v in on_val.values()):
            best = max(ok, key=lambda c: (not c.checks, sign * on_val[c.layer], -c.layer))
            return replace(best, chosen_on="validation")
        return replace(max(ok, key=lambda c: (not c.checks, sign * c.value, -c.layer)), chosen_on="test")
    errors = [c for c in cells if c.status == "error"]
    return errors[0] if errors else (cells[0] if cells else None)


def _validation_value(rows: list[dict], m: Metric) -> float | None:
    """The metric on validation at one layer, averaged over seeds (None without validation numbers)."""
    values = [validation_metric(r, m.name) for r in rows]
    return None if any(v is None for v in values) else sum(values) / len(values)


#: Per-scene result columns by the `evaluators.tasks.binding.metrics` statistic they hold.
PER_SCENE_STATS = {"L_F": "scene_bits_F", "L_O_given_F": "scene_bits_O_given_F", "L_O_paper": "scene_bits_O_paper",
                   "L_F_paper": "scene_bits_F_paper", "h_F": "scene_ref_F", "h_O_given_F": "scene_ref_O_given_F"}


def _per_scene(rows: list[dict]) -> tuple[dict[str, np.ndarray] | None, np.ndarray | None]:
    """Per-scene statistics averaged over the rows' seeds, and the scenes' groups (None if absent)."""
    groups = rows[0].get("scene_groups")
    if groups is None or any(r.get("scene_groups") is None or len(r["scene_groups"]) != len(groups) for r in rows):
        return None, None
    stats = {}
    for stat, column in PER_SCENE_STATS.items():
        arrays = [r.get(column) for r in rows]
        if all(a is not None and len(a) == len(groups) for a in arrays):
            stats[stat] = np.mean([np.asarray(a, dtype=np.float64) for a in arrays], axis=0)
    return stats or None, np.asarray(groups)


def _layer_cell(rows: list[dict], m: Metric, seeds: set[int]) -> Cell:
    layer, n_layers = rows[0]["layer"], rows[0]["n_layers"]
    failed = [r for r in rows if r["status"] == "error"]
    if failed:
        return Cell("error", layer=layer, n_layers=n_layers, n_seeds=len(rows), error=failed[0]["error"])
    values = [r[m.name] for r in rows]
    if {r["seed"] for r in rows} != seeds or any(v is None or math.isnan(v) for v in values):
        return Cell("incomplete", layer=layer, n_layers=n_layers, n_seeds=len(rows))
    los = [r[f"{m.name}_lo"] for r in rows]
    his = [r[f"{m.name}_hi"] for r in rows]
    lo = min(los) if None not in los else None
    hi = max(his) if None not in his else None
    checks = tuple(dict.fromkeys(c for r in rows for c in metric_checks(r, m.name))) if m.screened else ()
    priors = sorted({r["prior"] for r in rows if r.get("prior") is not None})
    sens = [r.get("sensitivity") for r in rows]
    task = TASKS.get(m.task)
    has_sens = task.sensitivity and all(v is not None and math.isfinite(v) for v in sens)
    per_scene, groups = _per_scene(rows) if task.per_scene else (None, None)
    return Cell("ok", sum(values) / len(values), lo, hi, layer, n_layers, len(rows), checks=checks,
                prior=",".join(priors) or None,
                sensitivity=sum(sens) / len(sens) if has_sens else None,
                sensitivity_lo=min(r["sensitivity_lo"] for r in rows) if has_sens else None,
                sensitivity_hi=max(r["sensitivity_hi"] for r in rows) if has_sens else None,
                per_scene=per_scene, groups=groups, rows=tuple(rows))


def _rank(board: Leaderboard) -> None:
    """Rank backbones per dataset by their best unflagged cell among the columns selected: rank =
    1 + the number of others better beyond doubt (`beats`); a backbone without such a cell,
    every control row and every row that reads ground truth, is unranked.

    Backbones with unanchored (†) cells are ranked among themselves, below the anchored ones:
    their headline numbers are not comparable with anchored rows."""
    sign = 1 if board.metric.higher_is_better else -1
    apart = {id(r): _unanchored_row(r, board.metric) for r in board.rows}
    for ds in board.datasets:
        for unanchored in (False, True):
            rows = [r for r in board.rows if r.dataset == ds and apart[id(r)] == unanchored and r.control is None
                    and not r.reads_ground_truth]
            ranked = [r for r in rows if _rankable(r)]
            for r in ranked:
                r.score = max(_rankable(r), key=lambda c: sign * c.value)
            for r in ranked:
                r.rank = 1 + sum(beats(o.score, r.score, board.metric) for o in ranked if o is not r)
    board.rows.sort(key=lambda r: (r.dataset, r.control is not None or r.reads_ground_truth, apart[id(r)], r.rank is None, r.rank or 0,
                                   -sign * r.score.value if r.score else 0.0, r.backbone, r.control or ""))


def beats(a: Cell, b: Cell, m: Metric, *, n_boot: int = 1000, seed: int = 0) -> bool:
    """Whether cell `a` is better than `b` beyond doubt: their paired difference's 95% interval
    lies wholly on `a`'s side of 0 (both measured on the same scenes with per-scene bits), else
    `a`'s whole interval lies beyond `b`'s."""
    paired = paired_cells(a, b, m, n_boot=n_boot, seed=seed)
    if paired is not None:
        _, lo, hi = paired
        return verdict(lo, hi, m) > 0
    a_lo, a_hi = (a.lo if a.lo is not None else a.value), (a.hi if a.hi is not None else a.value)
    b_lo, b_hi = (b.lo if b.lo is not None else b.value), (b.hi if b.hi is not None else b.value)
    return a_lo > b_hi if m.higher_is_better else a_hi < b_lo


def paired_cells(a: Cell, b: Cell, m: Metric, *, n_boot: int = 1000,
                 seed: int = 0) -> tuple[float, float, float] | None:
    """metric(a) − metric(b) with its paired bootstrap interval, None when the two cells were not
    measured on the same scenes or lack per-scene statistics for the metric."""
    if a.per_scene is None or b.per_scene is None or a.groups is None or b.groups is None \
            or len(a.groups) != len(b.groups) or not np.array_equal(a.groups, b.groups):
        return None
    return paired_difference(a.per_scene, b.per_scene, m.name, groups=a.groups, n_boot=n_boot, seed=seed)


def verdict(lo: float, hi: float, m: Metric) -> int:
    """Of a paired difference a − b with interval [lo, hi]: 1 when a is better beyond doubt, −1
    when b is, 0 when the interval holds 0 (what `beats`, `bench compare` and the site's matrix say)."""
    if lo > 0 if m.higher_is_better else hi < 0:
        return 1
    if hi < 0 if m.higher_is_better else lo > 0:
        return -1
    return 0


def _rankable(row: BoardRow) -> list[Cell]:
    """The cells a backbone may be ranked by: finished, and marked by no check."""
    return [c for c in row.cells.values() if c is not None and c.status == "ok" and not c.checks]


def _unanchored_row(row: BoardRow, m: Metric) -> bool:
    """Whether a backbone's cells are unanchored (the `*_paper` estimator is unanchored for every row)."""
    return not m.paper and any(c is not None and c.unanchored for c in row.cells.values())
