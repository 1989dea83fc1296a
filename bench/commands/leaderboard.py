"""Results commands: `bench leaderboard` and `bench plot`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.text import Text

from bench.commands.common import TABLE_WIDTH, Format, echo, registry_help, stderr, wrap
from bench.core.errors import BenchError
from bench.core.paths import output_path


def register(app: typer.Typer) -> None:
    from bench.api import tokens_filter_help

    app.command("leaderboard", cls=registry_help({"metric": _metrics_help, "tokens": tokens_filter_help}))(leaderboard)
    app.command("compare", cls=registry_help({"tokens": tokens_filter_help}))(compare)
    app.command("plot", cls=registry_help({"tokens": tokens_filter_help}))(plot)


def _metrics_help() -> str:
    from bench.api import metrics_help  # only when help is shown: tables load numpy and the metrics

    return metrics_help()


_RESULTS = typer.Argument(Path("results"), help="Results directory (every *.parquet in it).")
_DATASET = typer.Option(None, "--dataset", help="Only this dataset (name as in the results).")
_TASK = typer.Option(None, "--task", help="binding | issameobject (default: binding when present).")
_METRIC = typer.Option(
    None, "--metric",
    help="Metric (listed by `--help` from the registry).")
_PROBE = typer.Option([], "--probe", help="Only these probe families (repeatable).")
_TOKENS = typer.Option([], "--tokens", help="Only these token views (listed by `--help` from the registry).")
_LAYER = typer.Option("best", "--layer", help="best (per cell), last, or a layer index (0 = embeddings).")
_FINGERPRINT = typer.Option(
    None, "--fingerprint",
    help="Show the measurement on this dataset fingerprint (a prefix) instead of the newest on whole splits.")
_INCLUDE_LIMITED = typer.Option(
    False, "--include-limited", help="Also show --limit runs, each as its own dataset `NAME (limit N)`.")
_SHOW_OLD = typer.Option(
    False, "--show-old",
    help="Also show rows of a backbone's older weights or probe settings, as `NAME (weights|probe FINGERPRINT)`.")
_WIDE = typer.Option(False, "--wide", help="A table as wide as its columns need (default: 100 columns, cells wrapped).")


def _board(results_dir: Path, *, fingerprint: str | None = None, include_limited: bool = False,
           show_old: bool = False, **selection: Any) -> tuple[list[dict[str, Any]], Any]:
    """The selected, deduplicated rows (`leaderboards.store.load_selected`) and their leaderboard
    (BenchError when there are none); what the selection set aside goes to stderr in one line."""
    from bench.api import build_leaderboard, load_selected

    selected = load_selected(results_dir, fingerprint=fingerprint, include_limited=include_limited, show_old=show_old)
    if not selected.rows:
        aside = f"; {selected.note}" if selected.note else ""
        raise BenchError(f"results: no runs in {results_dir} (run `bench evaluate` or `bench demo` first){aside}")
    if selected.note:
        stderr.print(wrap(selected.note), soft_wrap=True, markup=False, highlight=False)
    return selected.rows, build_leaderboard(selected.rows, **selection)


def leaderboard(
    results_dir: Path = _RESULTS,
    dataset: Optional[str] = _DATASET,
    task: Optional[str] = _TASK,
    metric: Optional[str] = _METRIC,
    probe: list[str] = _PROBE,
    tokens: list[str] = _TOKENS,
    layer: str = _LAYER,
    fingerprint: Optional[str] = _FINGERPRINT,
    include_limited: bool = _INCLUDE_LIMITED,
    show_old: bool = _SHOW_OLD,
    fmt: Format = typer.Option(Format.table, "--format", help="table (terminal), markdown, csv or json (tidy records)."),
    out: Optional[str] = typer.Option(None, "--out", metavar="FILE", help="Write to this file instead of stdout."),
    wide: bool = _WIDE,
    reference: bool = typer.Option(
        False, "--reference",
        help="Add the papers' published rows for this task and metric (marked published, never ranked)."),
) -> None:
    """Rank backbones: one row each, a column per probe family x token view, `value ± half-interval`."""
    from bench.api import render_leaderboard
    from bench.core.outdir import WrittenFiles

    files = None
    if out is not None:  # a file of the user's there is refused before the results are read
        files = WrittenFiles(output_path(out, "out"), "out")
        files.check([files.main])
    _, board = _board(results_dir, fingerprint=fingerprint, include_limited=include_limited, show_old=show_old,
                      dataset=dataset,
                      task=task, metric=metric, probes=probe, tokens=tokens, layer=layer, reference=reference)
    text = render_leaderboard(board, fmt, None if wide else TABLE_WIDTH)
    if reference:
        from bench.api import none_published

        why = none_published(board.metric)
        if why:
            stderr.print(wrap(why), soft_wrap=True, markup=False, highlight=False)
    if files is None:
        echo(text)
        return
    from bench.core.dataset import write_text_atomic

    files.claim([files.main])
    write_text_atomic(Text.from_ansi(text).plain + "\n", files.main)  # a full disk leaves the old file, not half a new one
    files.finish([files.main])
    stderr.print(f"wrote {files.main}")


def compare(
    a: str = typer.Argument(..., help="A backbone (as in the results' backbone column)."),
    b: str = typer.Argument(..., help="The backbone to compare it with."),
    results_dir: Path = typer.Option(Path("results"), "--results", help="Results directory (every *.parquet in it)."),
    dataset: Optional[str] = _DATASET,
    metric: list[str] = typer.Option([], "--metric", help="Metrics to compare (repeatable) [beta_star, B_star, beta_O, beta_F, beta_star_paper]."),
    probe: list[str] = _PROBE,
    tokens: list[str] = _TOKENS,
    layer: str = _LAYER,
    fingerprint: Optional[str] = _FINGERPRINT,
    include_limited: bool = _INCLUDE_LIMITED,
    fmt: Format = typer.Option(Format.table, "--format", help="table (terminal), markdown, csv or json."),
    wide: bool = _WIDE,
) -> None:
    """A − B on the same test scenes: each metric's paired difference with its 95% interval and the layers used."""
    from bench.api import compare_backbones, load_selected, render_compare

    selected = load_selected(results_dir, fingerprint=fingerprint, include_limited=include_limited)
    if selected.note:
        stderr.print(wrap(selected.note), soft_wrap=True, markup=False, highlight=False)
    records = compare_backbones(selected.rows, a, b, metrics=metric, dataset=dataset, probes=probe, tokens=tokens,
                                layer=layer)
    echo(render_compare(records, a, b, fmt, None if wide else TABLE_WIDTH))


class PlotKind(str, Enum):
    layers = "layers"
    bars = "bars"
    sweep = "sweep"


def plot(
    kind: PlotKind = typer.Argument(..., help="layers (metric vs depth), bars (probe families), sweep (metric vs a dataset quantity)."),
    results_dir: Path = _RESULTS,
    out: Optional[str] = typer.Option(None, "--out", "-o", metavar="STEM", help="File stem; writes STEM.png and STEM.svg (default plots/KIND)."),
    dataset: Optional[str] = _DATASET,
    task: Optional[str] = _TASK,
    metric: Optional[str] = _METRIC,
    probe: list[str] = _PROBE,
    tokens: list[str] = _TOKENS,
    layer: str = typer.Option("best", "--layer", help="For bars and sweep: best, last or a layer index."),
    x: str = typer.Option("objects", "--x", help="Sweep axis: objects, camera-height or visibility."),
    datasets: Optional[Path] = typer.Option(None, "--datasets", help="Sweep: directory holding the sweep's datasets (their cards give x)."),
    fingerprint: Optional[str] = _FINGERPRINT,
    include_limited: bool = _INCLUDE_LIMITED,
) -> None:
    """Draw results as PNG + SVG: layer-wise curves, probe-family bars, or a sweep curve."""
    from bench.api import plots
    from bench.core.outdir import WrittenFiles

    figure = plots.figure_paths(Path("plots") / kind.value if out is None else out)
    files = WrittenFiles(figure[0], "out")
    files.check(figure)  # a file of the user's there is refused before the results are read
    selection = dict(dataset=dataset, task=task, metric=metric, probes=probe, tokens=tokens)
    chosen = dict(fingerprint=fingerprint, include_limited=include_limited)
    if kind == PlotKind.layers:
        rows, _ = _board(results_dir, **chosen, **selection)
        files.claim(figure)
        paths = plots.layer_curves(rows, figure[0], **selection)
    elif kind == PlotKind.bars:
        _, board = _board(results_dir, layer=layer, **chosen, **selection)
        files.claim(figure)
        paths = plots.probe_bars(board, figure[0])
    else:
        if datasets is None:
            raise BenchError("datasets: a sweep plot needs --datasets DIR (the sweep's dataset cards hold each x value)")
        rows, board = _board(results_dir, layer=layer, **chosen, **selection)
        x_values = plots.sweep_values(board.datasets, datasets, x)
        files.claim(figure)
        paths = plots.sweep_curve(rows, x_values, x, figure[0], layer=layer, **selection)
    files.finish(paths)
    stderr.print("wrote " + ", ".join(map(str, paths)))
