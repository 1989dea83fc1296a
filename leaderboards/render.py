"""Rendering a board as text: the terminal table, Markdown, and the tidy records CSV and JSON carry,
with the notes that explain each mark; the HTML views (`leaderboards.report`, `leaderboards.site`)
take their cell texts and notes from here too."""

from __future__ import annotations

from typing import Any, Sequence

from rich.markup import escape

from bench.core.console import Format, render_table, wrap
from bench.core.numbers import fixed, plus_minus
from bench.core.tasks import DEFAULT_TASK, TASKS
from leaderboards.board import Cell, Leaderboard
from leaderboards.compare import COMPARE_COLUMNS
from leaderboards.metrics import CHECK_MEANINGS, Metric


TIDY_COLUMNS = ("rank", "dataset", "backbone", "label", "control", "probe", "tokens", "metric", "value", "lo", "hi",
                "half_width", "layer", "layer_chosen_on", "n_layers", "n_seeds", "status", "checks", "prior",
                "sensitivity", "sensitivity_lo", "sensitivity_hi", "n_F_eff", "source", "estimator", "error")


def column_name(col: tuple[str, str]) -> str:
    return f"{col[0]} / {col[1]}"


def tidy_records(board: Leaderboard) -> list[dict[str, Any]]:
    """One record per (backbone, column): raw numbers, what CSV and JSON carry. `n_F_eff` is the
    dataset's effective number of test F codes (the smallest, if its rows disagree)."""
    out = []
    for row in board.rows:
        n_eff = board.n_F_eff.get(row.dataset) or (None,)
        for col, c in row.cells.items():
            c = c or Cell("missing")
            out.append({
                "rank": row.rank, "dataset": row.dataset, "backbone": row.backbone, "label": row.label, "control": row.control,
                "probe": col[0], "tokens": col[1], "metric": board.metric.name, "value": c.value, "lo": c.lo,
                "hi": c.hi, "half_width": c.half_width, "layer": c.layer, "layer_chosen_on": c.chosen_on,
                "n_layers": c.n_layers, "n_seeds": c.n_seeds, "status": c.status,
                "checks": "; ".join(c.checks) or None, "prior": c.prior, "sensitivity": c.sensitivity,
                "sensitivity_lo": c.sensitivity_lo, "sensitivity_hi": c.sensitivity_hi,
                "n_F_eff": n_eff[0] if row.reference is None else None,
                "source": row.reference.source if row.reference else None,
                "estimator": row.reference.estimator if row.reference else None, "error": c.error,
            })
    return out


def render_leaderboard(board: Leaderboard, fmt: Format, width: int | None = None) -> str:
    """Text in a format: table/markdown show `value ± half-interval`; CSV/JSON are tidy records.
    A table and its notes fit `width` characters (None: the table's natural width)."""
    return render_leaderboards([board], fmt, width)


def render_leaderboards(boards: Sequence[Leaderboard], fmt: Format, width: int | None = None) -> str:
    """Several boards (e.g. one metric each) as one text: tables one after another, each note
    printed once, under the first board that needs it; CSV/JSON one tidy table (records name
    their metric)."""
    if fmt in (Format.csv, Format.json):
        return render_table([r for board in boards for r in tidy_records(board)], TIDY_COLUMNS, fmt)
    markdown = fmt == Format.markdown
    parts, shown = [], set()
    for board in boards:
        notes = [n for n in board_notes(board) if n not in shown]
        shown.update(notes)
        table = _render_board(board, markdown, fmt, width)
        if markdown:
            parts.append("\n".join([table, *(f"\n_{n}_" for n in notes)]))
        else:
            parts.append("\n".join([table, *(wrap(n, width) if width else n for n in notes)]))
    return "\n\n".join(parts)


def _render_board(board: Leaderboard, markdown: bool, fmt: Format, width: int | None = None) -> str:
    names = [column_name(c) for c in board.columns]
    multi = len(board.datasets) > 1
    header = ["rank", *(["dataset"] if multi else []), "backbone", *names]
    lines = []
    for row in board.rows:
        line = {"rank": "" if row.rank is None else str(row.rank), "dataset": row.dataset,
                "backbone": row.label if markdown else escape(row.label)}
        for col, name in zip(board.columns, names):
            line[name] = format_cell(row.cells[col], board.metric, markdown)
        lines.append(line)
    return render_table(lines, header, fmt, title=title(board), width=width)


#: A `bench compare` table's columns after the context that varies: the answer first, then the two
#: backbones' own values and layers (what a table too narrow leaves out first).
COMPARE_ANSWER = ("metric", "difference", "lo", "hi", "verdict", "a", "b", "a_layer", "b_layer")


def render_compare(records: Sequence[dict[str, Any]], a: str, b: str, fmt: Format, width: int | None = None) -> str:
    """`compare_backbones`' records as text. CSV and JSON carry every record whole. A table (or
    Markdown) leads with the answer: one table per dataset, each metric's difference, its interval
    and the verdict first; the context every row shares (dataset, and the probe and tokens choice
    where they do not vary) said once, in the title. Its verdict reads `a better` or `b better`,
    the title saying which backbone each is, so that no backbone's name widens the verdict column
    out of a table `width` wide."""
    if fmt in (Format.csv, Format.json):
        return render_table(records, COMPARE_COLUMNS, fmt)
    short = {f"{a} better": "a better", f"{b} better": "b better"}
    parts = []
    for task, ds in dict.fromkeys((r.get("task", DEFAULT_TASK), r["dataset"]) for r in records):
        mine = [r for r in records if r.get("task", DEFAULT_TASK) == task and r["dataset"] == ds]
        varying = [c for c in ("probe", "tokens") if len({r[c] for r in mine}) > 1]
        context = ", ".join([f"task {task}", f"dataset {ds}",
                             *(f"{c} {mine[0][c]}" for c in ("probe", "tokens") if c not in varying)])
        over = "test F codes" if TASKS.get(task).per_scene else "test scenes"
        title = f"a − b on {context}\n(paired, 95% interval over {over})\na = {a}\nb = {b}"
        lines = [{**r, "verdict": short.get(r["verdict"], r["verdict"])} for r in mine]
        parts.append(render_table(lines, [*varying, *COMPARE_ANSWER], fmt, title=title, width=width))
    return "\n\n".join(parts)


FOOTNOTE = ("rank: each backbone by its best sound cell among the columns selected (--probe, --tokens; also those a "
            "table too narrow leaves out) (empty, error and failed-check "
            "cells neither rank nor unrank it): 1 + the number of backbones better beyond doubt, i.e. whose paired "
            "difference on the same test scenes (bootstrap over F codes) has a 95% interval wholly above 0; ± is half "
            "the bootstrap 95% interval; L12 after a value: the layer it comes from (hidden state 12, 0 = "
            "embeddings), under --layer best chosen on validation; s after a value whose interval holds 0: the "
            "probe's sensitivity, the share of a planted binding of known size it recovers on this dataset at this "
            "size; control rows (O redrawn from p(O|F), true value 0) are never ranked; empty = not run or incomplete")
HEADLINE_MEANING = ("β* = 1 − L_O|F / H(O|F) comes from probes that start at the generator's exact prior: "
                    "0 = nothing beyond the prior, ≤ 1 always, below 0 only by test noise")
PAPER_MEANING = ("β*_paper = 1 − (L_O − L_F) / H(O|F) is the paper's difference of two unanchored probes, "
                 "shown to compare with published numbers; it leaves [0, 1] when the two probes are unequally good")
UNANCHORED_NOTE = ("† unanchored (prior: none): {label} from probes that learned the prior themselves; "
                   "not comparable with anchored rows, so ranked only among themselves")
EMPIRICAL_MEANING = ("on imported real images (prior: empirical) the probes start at p = 1/2 and H(O|F) is the "
                     "blind reference probe's L^ref_O|F, so L_O|F > H(O|F) means the probe coded the test objects "
                     "worse than that reference")
EMPIRICAL_NOTE = ("† prior: empirical (imported real images, no exact prior): {label} against a reference probe of "
                  "the same family given F but not the image, H(F) the test split's plug-in entropy; not comparable "
                  "with exact-prior rows, so ranked only among themselves")


def board_notes(board: Leaderboard) -> list[str]:
    """The footnotes a board needs: intervals and ranks, n_F_eff, and the † and ‡ marks it uses."""
    notes = [FOOTNOTE]
    if board.n_F_eff:
        notes.append(n_f_eff_note(board))
    if board.has_unanchored_cells:
        kinds = {p for c in board._cells() if c.unanchored for p in c.prior.split(",") if p != "exact"}
        if kinds - {"empirical"}:
            notes.append(UNANCHORED_NOTE.format(label=board.metric.label))
        if "empirical" in kinds:
            notes.append(EMPIRICAL_NOTE.format(label=board.metric.label))
    if board.has_failed_cells:
        notes.append(checked_note(board))
    if board.references:
        notes.append(published_note(board))
    return notes


def published_note(board: Leaderboard) -> str:
    """What the (published) rows are: each paper's own numbers, where from, by which estimator."""
    by_source: dict[str, list] = {}
    for ref in board.references:
        by_source.setdefault(ref.source, []).append(ref)
    parts = []
    for source, refs in by_source.items():
        extra = sorted({f"{r.probe}: {r.notes}" for r in refs if r.notes})
        peaks = [f"{r.backbone} {r.values['peak_layer']:.2f}" for r in refs if "peak_layer" in r.values]
        parts.append(f"{source} on {refs[0].dataset} ({refs[0].estimator}"
                     + (f"; peak layer, normalised to [0, 1]: {', '.join(peaks)}" if peaks else "")
                     + (f"; {'; '.join(extra)}" if extra else "") + ")")
    return ("(published): the papers' own numbers, measured on their data with their estimators, shown to read "
            "these rows against and never ranked: " + "; ".join(parts))


def n_f_eff_note(board: Leaderboard) -> str:
    """Intervals resample whole test F codes: how many there effectively are, per dataset."""
    def shown(values: tuple[float, ...]) -> str:
        if not values:
            return "unknown"
        return f"{values[0]:.1f}" if len(values) == 1 else f"{values[0]:.1f}–{values[-1]:.1f}"

    per = [f"{ds} {shown(v)}" if len(board.n_F_eff) > 1 else shown(v) for ds, v in sorted(board.n_F_eff.items())]
    return ("intervals resample whole test F codes; effective number of test F codes "
            f"(n_F_eff = 1/ΣP(f)²): {', '.join(per)}")


def checked_note(board: Leaderboard) -> str:
    """The ‡ note: what the metric means and which checks fired on this board."""
    fired = "; ".join(f"{k} ({CHECK_MEANINGS[k]})" if k in CHECK_MEANINGS else k for k in board.fired_checks)
    meaning = PAPER_MEANING if board.metric.paper else HEADLINE_MEANING
    if not board.metric.paper and any(c.prior == "empirical" for c in board._cells()):
        meaning += f"; {EMPIRICAL_MEANING}"
    return (f"‡ not read as binding. {meaning}. A ‡ cell's row broke a check: {fired}. A ‡ cell never ranks "
            "a backbone or wins a best layer; --format csv names each cell's checks")


def title(board: Leaderboard) -> str:
    m = board.metric
    unit = f" ({m.unit})"
    where = ", ".join(board.datasets) or "no results"
    chosen = {c.chosen_on for c in board._cells() if c.chosen_on}
    on = "on test: these rows have no validation numbers" if chosen == {"test"} else \
        "on validation; on test where a row has none" if "test" in chosen else "on validation"
    layer = {"best": f"best layer per cell ({on})", "last": "last layer"}.get(board.layer, f"layer {board.layer}")
    return f"{m.label}{unit} — {where} — {layer}"


def format_cell(cell: Cell | None, m: Metric, markdown: bool = False) -> str:
    """`value ± half-interval`, the layer in small print (Markdown <sub>, terminal dim), then
    † for an unanchored run (headline metrics) and ‡ for a failed check."""
    if cell is None or cell.status == "incomplete":
        return ""
    if cell.status == "error":
        return "error" if markdown else "[red]error[/red]"
    scale, digits = scale_digits(m)
    text = plus_minus(cell.value, cell.lo, cell.hi, scale, digits)
    if cell.n_layers:  # oracles and pixels have only layer 0: nothing to note
        text += f" <sub>L{cell.layer}</sub>" if markdown else f" [dim]L{cell.layer}[/dim]"
    if cell.holds_zero and cell.sensitivity is not None:  # what this 0 is worth
        sens = f"s {fixed(cell.sensitivity * 100, 0)}%"
        text += f" <sub>{sens}</sub>" if markdown else f" [dim]{sens}[/dim]"
    for mark in cell_marks(cell, m):
        text += f" {mark}" if markdown else f" [{MARK_COLOURS[mark]}]{mark}[/{MARK_COLOURS[mark]}]"
    return text


MARK_COLOURS = {"†": "cyan", "‡": "yellow"}


def cell_marks(cell: Cell, m: Metric) -> list[str]:
    """† for an unanchored run (headline metrics), ‡ for a failed check: what every view prints after a value."""
    return (["†"] if cell.unanchored and not m.paper else []) + (["‡"] if cell.checks else [])


def scale_digits(m: Metric) -> tuple[float, int]:
    """How a metric's values print: ratios as percentages with one decimal, bits with two, others (a loss) with three."""
    return (100.0, 1) if m.unit == "%" else (1.0, 2) if m.unit == "bits" else (1.0, 3)
