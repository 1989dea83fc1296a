"""Leaderboard views of the results: one row per backbone, one column per probe family x token view.

A cell is the metric at one layer, averaged over seeds, with the bootstrap 95% interval
(the envelope of the seeds' intervals, so seed-to-seed spread is never hidden). Three
rules keep the table honest:
- ranks tie when intervals overlap: a backbone's rank is 1 + the number of backbones
  whose whole interval lies beyond its own, so a lead within the noise earns nothing;
- a cell is empty unless every seed run for that column finished (no partial means),
  and only backbones with every cell filled are ranked;
- backbones without layers (oracles, pixels) show their one layer whatever layer is asked;
- a β* or B* cell whose own numbers show a failed probe (`evaluators.metrics.beta_star_checks`)
  is marked ‡ and never ranks a backbone or wins a `best` layer: its value is a probe's
  failure, not binding;
- `best` layer is chosen per cell on the reported (test) metric, so it is an optimistic,
  per-column choice: the layer is printed beside the value to make that visible.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rich.markup import escape

from bench.commands.common import Format, render_table
from bench.errors import BenchError
from evaluators.metrics import beta_star_checks


@dataclass(frozen=True)
class Metric:
    name: str  # the results column
    label: str  # how tables and plots title it
    task: str
    unit: str  # "%" (ratios shown x100) or "bits"
    higher_is_better: bool = True
    checked: bool = False  # screened with beta_star_checks (a difference of two probes)


_METRIC_LIST = [
    Metric("beta_star", "β*", "binding", "%", checked=True),
    Metric("beta_star_cond", "β*_cond", "binding", "%"),
    Metric("beta_O", "β_O", "binding", "%"),
    Metric("beta_F", "β_F", "binding", "%"),
    Metric("B_star", "B*", "binding", "bits", checked=True),
    Metric("B_star_cond", "B*_cond", "binding", "bits"),
    Metric("B_O", "B_O", "binding", "bits"),
    Metric("B_F", "B_F", "binding", "bits"),
    Metric("L_O", "L_O", "binding", "bits", higher_is_better=False),
    Metric("L_F", "L_F", "binding", "bits", higher_is_better=False),
    Metric("L_O_given_F", "L_O|F", "binding", "bits", higher_is_better=False),
    Metric("bit_accuracy", "bit accuracy", "binding", "%"),
    Metric("exact_accuracy", "exact-match accuracy", "binding", "%"),
    Metric("accuracy", "IsSameObject accuracy", "issameobject", "%"),
    Metric("balanced_accuracy", "balanced accuracy", "issameobject", "%"),
    Metric("auroc", "AUROC", "issameobject", "%"),
]
METRICS: dict[str, Metric] = {m.name: m for m in _METRIC_LIST}
DEFAULT_METRIC = {"binding": "beta_star", "issameobject": "accuracy"}
TASKS = tuple(DEFAULT_METRIC)
#: Column order: the paper's table reads left to right from weakest to strongest reader.
PROBE_ORDER = ("linear", "diag-quadratic", "quadratic", "quadratic-shared", "dnn", "attention",
               "pointwise-identity", "cosine", "dot", "attention-qk", "distance", "majority")
TOKEN_ORDER = ("cls", "mean", "cls+mean", "all")


def resolve_metric(name: str | None, task: str) -> Metric:
    """A metric by results-column name or printed label (β*, B*_cond, ...), checked against the task."""
    if name is None:
        return METRICS[DEFAULT_METRIC[task]]
    wanted = _norm(name)
    for m in _METRIC_LIST:
        if wanted in (_norm(m.name), _norm(m.label)):
            if m.task != task:
                raise BenchError(f"metric: {m.name!r} belongs to task {m.task!r}, not {task!r}")
            return m
    allowed = ", ".join(f"{m.name} ({m.label})" for m in _METRIC_LIST if m.task == task)
    raise BenchError(f"metric: unknown {name!r} for task {task!r}; allowed: {allowed}")


def _norm(name: str) -> str:
    """Spelling-insensitive key: "β*_cond", "beta_star_cond" and "B*cond"-style names meet."""
    name = name.lower().replace("β", "beta").replace("*", "star").replace("|", "given")
    return re.sub(r"[\s_]", "", name)


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

    @property
    def complete(self) -> bool:
        return all(c is not None and c.status == "ok" for c in self.cells.values())


@dataclass
class Leaderboard:
    task: str
    metric: Metric
    layer: str | int
    columns: list[tuple[str, str]]
    rows: list[BoardRow] = field(default_factory=list)

    @property
    def datasets(self) -> list[str]:
        return sorted({r.dataset for r in self.rows})

    @property
    def has_failed_cells(self) -> bool:
        """Whether any cell is marked ‡ (tables and plots then explain the mark)."""
        return any(c is not None and c.checks for r in self.rows for c in r.cells.values())


def build_leaderboard(
    rows: Iterable[dict[str, Any]],
    *,
    dataset: str | None = None,
    task: str | None = None,
    metric: str | None = None,
    probes: Sequence[str] = (),
    tokens: Sequence[str] = (),
    layer: str | int = "best",
) -> Leaderboard:
    """The leaderboard of deduplicated result rows (see `leaderboards.store.latest`)."""
    rows = list(rows)
    task = _pick_task(rows, task)
    m = resolve_metric(metric, task)
    layer = parse_layer(layer) if isinstance(layer, str) else layer
    rows = [r for r in rows if r["task"] == task]
    rows = _filter(rows, "dataset", [dataset] if dataset else [])
    rows = _filter(rows, "probe", probes)
    rows = _filter(rows, "tokens", tokens)
    columns = sorted({(r["probe"], r["tokens"]) for r in rows}, key=_column_order)
    # Seeds a column was run with, over all backbones: a cell short of them is incomplete.
    expected = defaultdict(set)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        expected[(r["dataset"], r["probe"], r["tokens"])].add(r["seed"])
        groups[(r["dataset"], r["backbone"], r["probe"], r["tokens"])].append(r)
    board = Leaderboard(task, m, layer, columns)
    for ds, backbone in sorted({(r["dataset"], r["backbone"]) for r in rows}):
        cells = {
            col: _cell(groups.get((ds, backbone, *col), []), m, layer, expected[(ds, *col)]) for col in columns
        }
        board.rows.append(BoardRow(ds, backbone, cells))
    _rank(board)
    return board


def _pick_task(rows: list[dict], task: str | None) -> str:
    if task is not None:
        if task not in TASKS:
            raise BenchError(f"task: unknown {task!r}; allowed: {', '.join(TASKS)}")
        return task
    present = {r["task"] for r in rows}
    return "binding" if "binding" in present or not present else sorted(present)[0]


def _filter(rows: list[dict], column: str, allowed: Sequence[str]) -> list[dict]:
    if not allowed:
        return rows
    present = {r[column] for r in rows}
    missing = [a for a in allowed if a not in present]
    if missing:
        raise BenchError(f"{column}: no results for {', '.join(map(repr, missing))}; present: {', '.join(sorted(present)) or 'none'}")
    return [r for r in rows if r[column] in allowed]


def _column_order(col: tuple[str, str]) -> tuple:
    probe, tokens = col
    p = PROBE_ORDER.index(probe) if probe in PROBE_ORDER else len(PROBE_ORDER)
    t = TOKEN_ORDER.index(tokens) if tokens in TOKEN_ORDER else len(TOKEN_ORDER)
    return (t == TOKEN_ORDER.index("all"), p, probe, t, tokens)


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
        return max(ok, key=lambda c: (not c.checks, sign * c.value, -c.layer))
    errors = [c for c in cells if c.status == "error"]
    return errors[0] if errors else (cells[0] if cells else None)


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
    checks = tuple(sorted({c for r in rows for c in beta_star_checks(r)})) if m.checked else ()
    return Cell("ok", sum(values) / len(values), lo, hi, layer, n_layers, len(rows), checks=checks)


def _rank(board: Leaderboard) -> None:
    """Rank complete backbones per dataset by their best unflagged cell; overlapping intervals tie."""
    sign = 1 if board.metric.higher_is_better else -1
    for ds in board.datasets:
        rows = [r for r in board.rows if r.dataset == ds]
        complete = [r for r in rows if r.complete and any(not c.checks for c in r.cells.values())]
        for r in complete:
            r.score = max((c for c in r.cells.values() if not c.checks), key=lambda c: sign * c.value)
        ranks = rank_with_ties([(r.score.value, r.score.lo, r.score.hi) for r in complete], board.metric.higher_is_better)
        for r, k in zip(complete, ranks):
            r.rank = k
    board.rows.sort(key=lambda r: (r.dataset, r.rank is None, r.rank or 0,
                                   -sign * r.score.value if r.score else 0.0, r.backbone))


def rank_with_ties(scores: Sequence[tuple[float, float | None, float | None]], higher_is_better: bool = True) -> list[int]:
    """Rank = 1 + how many others are better beyond doubt (their interval clears this one's).

    (value, lo, hi) triples; a missing bound counts as the value itself.
    """
    bounds = [(lo if lo is not None else v, hi if hi is not None else v) for v, lo, hi in scores]
    if higher_is_better:
        return [1 + sum(lo_j > hi_i for lo_j, _ in bounds) for _, hi_i in bounds]
    return [1 + sum(hi_j < lo_i for _, hi_j in bounds) for lo_i, _ in bounds]


# -- rendering ----------------------------------------------------------------------------

TIDY_COLUMNS = ("rank", "dataset", "backbone", "probe", "tokens", "metric", "value", "lo", "hi",
                "half_width", "layer", "n_layers", "n_seeds", "status", "checks", "error")


def column_name(col: tuple[str, str]) -> str:
    return f"{col[0]} / {col[1]}"


def tidy_records(board: Leaderboard) -> list[dict[str, Any]]:
    """One record per (backbone, column): raw numbers, what CSV and JSON carry."""
    out = []
    for row in board.rows:
        for col, c in row.cells.items():
            c = c or Cell("missing")
            out.append({
                "rank": row.rank, "dataset": row.dataset, "backbone": row.backbone, "probe": col[0],
                "tokens": col[1], "metric": board.metric.name, "value": c.value, "lo": c.lo, "hi": c.hi,
                "half_width": c.half_width, "layer": c.layer, "n_layers": c.n_layers, "n_seeds": c.n_seeds,
                "status": c.status, "checks": "; ".join(c.checks) or None, "error": c.error,
            })
    return out


def render_leaderboard(board: Leaderboard, fmt: Format) -> str:
    """Text in a format: table/markdown show `value ± half-interval`; CSV/JSON are tidy records."""
    if fmt in (Format.csv, Format.json):
        records = tidy_records(board)
        if fmt == Format.csv:  # full precision: render_table would round floats for display
            records = [{k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in records]
        return render_table(records, TIDY_COLUMNS, fmt)
    markdown = fmt == Format.markdown
    names = [column_name(c) for c in board.columns]
    multi = len(board.datasets) > 1
    header = ["rank", *(["dataset"] if multi else []), "backbone", *names]
    lines = []
    for row in board.rows:
        line = {"rank": "" if row.rank is None else str(row.rank), "dataset": row.dataset,
                "backbone": row.backbone if markdown else escape(row.backbone)}
        for col, name in zip(board.columns, names):
            line[name] = format_cell(row.cells[col], board.metric, markdown)
        lines.append(line)
    table = render_table(lines, header, fmt, title=title(board))
    notes = [FOOTNOTE, *([CHECKED_NOTE] if board.has_failed_cells else [])]
    return "\n".join([table, *(f"\n_{n}_" for n in notes)]) if markdown else "\n".join([table, *notes])


FOOTNOTE = ("± is half the bootstrap 95% interval; backbones whose intervals overlap share a rank; "
            "empty = not run or incomplete, unranked = some cell empty or failed")
CHECKED_NOTE = ("‡ a probe failed, so this is not binding: it coded its target in more bits than the prior "
                "(L_F > H(F) or L_O > H(O)), or the O-probe beat the F-probe (L_O < L_F, β* > 1); never ranked on "
                "(a backbone with only ‡ cells is unranked). Read β*_cond (--metric beta_star_cond) there; "
                "--format csv names the check")


def title(board: Leaderboard) -> str:
    m = board.metric
    unit = " (%)" if m.unit == "%" else " (bits)"
    where = ", ".join(board.datasets) or "no results"
    layer = {"best": "best layer per cell", "last": "last layer"}.get(board.layer, f"layer {board.layer}")
    return f"{m.label}{unit} — {where} — {layer}"


def format_cell(cell: Cell | None, m: Metric, markdown: bool = False) -> str:
    """`value ± half-interval`, the layer in small print (Markdown <sub>, terminal dim)."""
    if cell is None or cell.status == "incomplete":
        return ""
    if cell.status == "error":
        return "error" if markdown else "[red]error[/red]"
    scale, digits = (100.0, 1) if m.unit == "%" else (1.0, 2)
    text = f"{cell.value * scale:.{digits}f}"
    if cell.half_width is not None:
        text += f" ± {cell.half_width * scale:.{digits}f}"
    if cell.n_layers:  # oracles and pixels have only layer 0: nothing to note
        text += f" <sub>L{cell.layer}</sub>" if markdown else f" [dim]L{cell.layer}[/dim]"
    if cell.checks:
        text += " ‡" if markdown else " [yellow]‡[/yellow]"
    return text
