"""Figures of the results (matplotlib, Agg: no display needed), each saved as PNG and SVG.

- `layer_curves`: the metric against normalised depth (layer / n_layers), one line per
  backbone with its interval band; backbones without layers (oracles, pixels) are
  horizontal dashed references, since they are the bounds a real backbone sits between.
- `probe_bars`: the leaderboard as grouped bars with interval whiskers.
- `sweep_curve`: the metric against a dataset-level quantity (camera height, mean
  visibility, objects per scene), read from each dataset's card, one line per backbone
  and probe column.
All three draw cells exactly as the leaderboard computes them (same seeds rule, same
layer choice, the table's ‡ as crosses or hatched bars and its † as "† unanchored" or, for
imported real images, "† empirical" after the backbone's name), so a figure never disagrees
with the table beside it.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend first)
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from bench.core.dataset import CARD_NAME, replacing  # noqa: E402
from bench.core.errors import BenchError  # noqa: E402
from bench.core.labels import drawn_as_written  # noqa: E402
from bench.core.paths import output_path  # noqa: E402
from leaderboards.board import Leaderboard, build_leaderboard  # noqa: E402
from leaderboards.render import column_name  # noqa: E402

FORMATS = ("png", "svg")
#: Appended to a backbone whose run was unanchored (the table's †): not comparable with anchored ones.
UNANCHORED_MARK = " † unanchored"
#: The same mark for a backbone measured on imported real images (prior: empirical), ranked apart as well.
EMPIRICAL_MARK = " † empirical"
#: Sweep axes: where each dataset card holds the x value (config key, else test-split key).
SWEEP_AXES: dict[str, tuple[str, str]] = {
    "camera-height": ("camera_height", "camera height"),
    "visibility": ("mean_visibility", "mean object visibility"),
    "objects": ("n_objects", "objects per scene"),
}


class NothingToDraw(BenchError):
    """The selection holds no finished value to draw (none measured, or every one NaN): a page that
    shows many figures (`bench site`) says so in the figure's place and goes on; `bench plot` stops."""

    def __init__(self) -> None:
        super().__init__("plot: no results to draw for this selection")


def _mark(board: Leaderboard, label: str, dataset: str | None = None) -> str:
    """The † label after a row's label (of `dataset`, or of any): "† empirical" when every
    † cell is an imported dataset's, "† unanchored" otherwise, "" when no cell is marked."""
    priors = {c.prior for r in board.rows if r.label == label and dataset in (None, r.dataset)
              and (r.dataset, r.label) in board.unanchored_backbones
              for c in r.cells.values() if c is not None and c.unanchored}
    if not priors:
        return ""
    return EMPIRICAL_MARK if priors == {"empirical"} else UNANCHORED_MARK


def figure_paths(out: str | os.PathLike, formats: Sequence[str] = FORMATS) -> list[Path]:
    """The files a figure drawn to `out` is saved as: `out` as .png and .svg, or the `formats`
    given (a given .png/.svg suffix is replaced); an empty `out` is refused."""
    stem = output_path(out, "out")
    if stem.suffix.lower() in tuple(f".{f}" for f in FORMATS):
        stem = stem.with_suffix("")
    return [stem.with_name(f"{stem.name}.{f}") for f in formats]


def save_figure(fig: plt.Figure, out: str | os.PathLike, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the figure as `figure_paths(out, formats)`; close it."""
    paths = figure_paths(out, formats)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    try:
        for p in paths:
            with replacing(p) as tmp:  # a full disk leaves the old figure, not half a new one
                if p.suffix == ".png":
                    save_png(fig, tmp)
                else:
                    fig.savefig(tmp, dpi=150, bbox_inches="tight", format=p.suffix[1:])
    finally:
        plt.close(fig)
    return paths


#: The widest PNG a figure is written at: a laptop screen's width, so no figure needs scrolling.
MAX_PNG_WIDTH = 1280


def save_png(fig: plt.Figure, path: Path, max_width: int = MAX_PNG_WIDTH) -> None:
    """Save at 150 dpi, or at the dpi that keeps the image (its tight box, legend included) at most
    `max_width` pixels wide; the tight box moves a little with the dpi, so it is checked after."""
    from PIL import Image

    width = fig.get_tightbbox(fig.canvas.get_renderer()).width + 0.2  # inches; savefig's pad, both sides
    dpi = min(150.0, (max_width - 2) / width)
    for _ in range(4):
        fig.savefig(path, dpi=dpi, bbox_inches="tight", format="png")
        with Image.open(path) as im:
            if im.width <= max_width:
                return
            dpi *= (max_width - 2) / im.width


def _scale(board: Leaderboard) -> float:
    return 100.0 if board.metric.unit == "%" else 1.0


def _ylabel(board: Leaderboard) -> str:
    return f"{board.metric.label} ({board.metric.unit})"


Point = tuple  # (x, value, lo, hi, failed); x None for a backbone without layers; failed = the table's ‡


def layer_series(rows: Sequence[dict[str, Any]], **selection: Any) -> tuple[Leaderboard, dict[tuple, list[Point]]]:
    """Per (dataset, row label, column) (a control row's label names its control): (layer / n_layers, value, lo, hi) at every layer run.

    `selection`: build_leaderboard's filters (dataset, task, metric, probes, tokens).
    """
    first = build_leaderboard(rows, layer="best", ranked=False, **selection)
    series: dict[tuple, list[Point]] = defaultdict(list)
    for layer in sorted({r["layer"] for r in rows}):
        for r in build_leaderboard(rows, layer=layer, ranked=False, **selection).rows:
            for col, c in r.cells.items():
                if c is not None and c.status == "ok" and c.layer == layer:
                    series[(r.dataset, r.label, col)].append(
                        (c.layer / c.n_layers if c.n_layers else None, c.value, c.lo, c.hi, bool(c.checks)))
    return first, dict(series)


#: Panels a row in a layer-curves figure.
PANELS_PER_ROW = 3


@drawn_as_written
def layer_curves(rows: Sequence[dict[str, Any]], out: str | os.PathLike, formats: Sequence[str] = FORMATS,
                 **selection: Any) -> list[Path]:
    """Metric vs normalised depth per backbone, one panel per probe x tokens column (PNG and SVG,
    or the `formats` given: a page that shows the PNG needs no SVG)."""
    board, series = layer_series(rows, **selection)
    if not series:
        raise NothingToDraw()
    scale = _scale(board)
    # small multiples: at most PANELS_PER_ROW panels a row, so a figure stays readable at a
    # laptop's width however many probe x tokens columns there are
    n = len(board.columns)
    n_cols = min(n, PANELS_PER_ROW)
    n_rows = -(-n // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.4 * n_cols, 2.9 * n_rows), squeeze=False, sharey=True)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    colors = _colors([key[1] for key in series])
    for ax, col in zip(axes.flat, board.columns):
        for (ds, backbone, c), points in sorted(series.items()):
            if c == col:
                label = backbone if len(board.datasets) == 1 else f"{backbone} ({ds})"
                label += _mark(board, backbone, ds)
                _draw_series(ax, points, scale, colors[backbone], label)
        ax.set_title(column_name(col))
        ax.set_xlabel("layer / n_layers")
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel(_ylabel(board))
    fig.suptitle(f"{board.metric.label} by depth — {', '.join(board.datasets)}")
    fig.tight_layout()
    _legend(fig, axes)
    return save_figure(fig, out, formats)


def _draw_series(ax: plt.Axes, points: list[tuple], scale: float, color: Any, label: str) -> None:
    """A line with its band; a layer-less backbone (depth None) as a dashed reference."""
    if all(p[0] is None for p in points):
        _, v, lo, hi, failed = points[0]
        ax.axhline(v * scale, color=color, ls="--" if not failed else ":", lw=1.2, label=label + " ‡" * failed)
        if lo is not None and hi is not None:
            ax.axhspan(lo * scale, hi * scale, color=color, alpha=0.12, lw=0)
        return
    points = sorted(p for p in points if p[0] is not None)
    x = np.array([p[0] for p in points])
    v = np.array([p[1] for p in points]) * scale
    ax.plot(x, v, marker="o", ms=3, color=color, label=label)
    if all(p[2] is not None and p[3] is not None for p in points):
        ax.fill_between(x, [p[2] * scale for p in points], [p[3] * scale for p in points], color=color, alpha=0.2, lw=0)
    _mark_failed(ax, points, scale)


def _mark_failed(ax: plt.Axes, points: list[tuple], scale: float) -> None:
    """A cross over every point whose probe failed (‡ in the table): its value is not binding."""
    failed = [p for p in points if p[4]]
    if failed:
        label = "‡ a probe failed"
        ax.scatter([p[0] for p in failed], [p[1] * scale for p in failed], marker="x", s=40, color="black", zorder=3,
                   label=None if label in ax.get_legend_handles_labels()[1] else label)


@drawn_as_written
def probe_bars(board: Leaderboard, out: str | os.PathLike, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Grouped bars: backbones along x, one bar per probe x tokens column, 95% whiskers (PNG and
    SVG, or the `formats` given)."""
    if not board.rows or not board.columns:
        raise NothingToDraw()
    scale = _scale(board)
    n_cols = len(board.columns)
    width = 0.8 / n_cols
    # at most 8.5 in wide (1,280 px at 150 dpi), so the labels stay readable on a laptop's screen
    fig, ax = plt.subplots(figsize=(min(8.5, max(5.0, 1.3 * len(board.rows) * max(1, n_cols / 2))), 3.8))
    x = np.arange(len(board.rows))
    cmap = plt.get_cmap("tab10")
    for j, col in enumerate(board.columns):
        cells = [r.cells.get(col) for r in board.rows]
        ok = [c is not None and c.status == "ok" for c in cells]
        vals = np.array([c.value * scale if good else np.nan for c, good in zip(cells, ok)])
        err = np.array([
            [(c.value - c.lo) * scale, (c.hi - c.value) * scale] if good and c.lo is not None else [0.0, 0.0]
            for c, good in zip(cells, ok)
        ]).T
        bars = ax.bar(x + (j - (n_cols - 1) / 2) * width, vals, width, yerr=err, capsize=2,
                      color=cmap(j % 10), label=column_name(col))
        for bar, c, good in zip(bars, cells, ok):
            if good and c.checks:  # a failed probe's number: drawn faint and hatched, as the table marks it ‡
                bar.set_alpha(0.35)
                bar.set_hatch("//")
    if board.has_failed_cells:
        ax.bar([np.nan], [np.nan], color="white", edgecolor="black", hatch="//", label="‡ a probe failed: not binding")
    labels = [(r.label if len(board.datasets) == 1 else f"{r.label}\n({r.dataset})")
              + _mark(board, r.label, r.dataset) for r in board.rows]
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_ylabel(_ylabel(board))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(f"{board.metric.label} by probe family — {', '.join(board.datasets)}")
    return save_figure(fig, out, formats)


def sweep_values(datasets: Iterable[str], root: str | os.PathLike, axis: str) -> dict[str, float]:
    """Each dataset's x value for a sweep axis, from its card under `root` (or `root` itself)."""
    if axis not in SWEEP_AXES:
        raise BenchError(f"x: unknown {axis!r}; allowed: {', '.join(SWEEP_AXES)}")
    key, _ = SWEEP_AXES[axis]
    root = Path(root)
    out = {}
    for name in datasets:
        card_path = next((p for p in (root / name / CARD_NAME, root / CARD_NAME)
                          if p.exists() and (p.parent.name == name)), None)
        if card_path is None:
            raise BenchError(f"plot: no dataset card for {name!r} under {root}; pass --datasets DIR holding the sweep's datasets")
        card = json.loads(card_path.read_text())
        value = card.get("config", {}).get(key, card.get("splits", {}).get("test", {}).get(key))
        if not isinstance(value, (int, float)):
            raise BenchError(f"plot: dataset {name!r} has no {key!r} in its card, so it is not on a {axis} sweep")
        out[name] = float(value)
    return out


def sweep_series(rows: Sequence[dict[str, Any]], x_values: dict[str, float],
                 **selection: Any) -> tuple[Leaderboard, dict[tuple, list[Point]]]:
    """Per (row label, column): (x, value, lo, hi) over the sweep's datasets, sorted by x."""
    board = build_leaderboard([r for r in rows if r["dataset"] in x_values], **selection)
    series: dict[tuple, list[Point]] = defaultdict(list)
    for r in board.rows:
        for col, c in r.cells.items():
            if c is not None and c.status == "ok":
                series[(r.label, col)].append((x_values[r.dataset], c.value, c.lo, c.hi, bool(c.checks)))
    return board, {k: sorted(v) for k, v in series.items()}


@drawn_as_written
def sweep_curve(rows: Sequence[dict[str, Any]], x_values: dict[str, float], axis: str,
                out: str | os.PathLike, **selection: Any) -> list[Path]:
    """Metric vs a dataset-level quantity; each dataset of the sweep is one point."""
    board, series = sweep_series(rows, x_values, **selection)
    if not series:
        raise BenchError("plot: no results for the sweep's datasets")
    scale = _scale(board)
    colors = _colors([b for b, _ in series])
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for (backbone, col), points in sorted(series.items()):
        x = np.array([p[0] for p in points])
        ls = styles[board.columns.index(col) % len(styles)]
        mark = _mark(board, backbone)
        ax.plot(x, np.array([p[1] for p in points]) * scale, marker="o", ms=3, ls=ls,
                color=colors[backbone], label=f"{backbone}{mark} — {column_name(col)}")
        if all(p[2] is not None and p[3] is not None for p in points):
            ax.fill_between(x, [p[2] * scale for p in points], [p[3] * scale for p in points],
                            color=colors[backbone], alpha=0.15, lw=0)
        _mark_failed(ax, points, scale)
    ax.set_xlabel(SWEEP_AXES[axis][1])
    if all(float(v).is_integer() for v in x_values.values()):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(_ylabel(board))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(f"{board.metric.label} vs {SWEEP_AXES[axis][1]}")
    return save_figure(fig, out)


def _colors(names: Iterable[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {n: cmap(i % 10) for i, n in enumerate(dict.fromkeys(sorted(names)))}


def _legend(fig: plt.Figure, axes: np.ndarray) -> None:
    """One legend for all panels (a backbone may be missing from some of them)."""
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="center left", bbox_to_anchor=(1.0, 0.5),
               frameon=False, fontsize=8)
