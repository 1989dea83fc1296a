"""Results commands: `bench leaderboard` and `bench plot`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from bench import api
from bench.commands.common import TABLE_WIDTH, Format, echo, registry_help, stderr
from bench.core.paths import output_path


def register(app: typer.Typer) -> None:
    tokens_help = api.tokens_filter_help
    app.command("leaderboard", cls=registry_help({"metric": api.metrics_help, "tokens": tokens_help,
                                                  "task": api.tasks_help}))(leaderboard)
    app.command("compare", cls=registry_help({"tokens": tokens_help}))(compare)
    app.command("plot", cls=registry_help({"tokens": tokens_help}))(plot)


_RESULTS = typer.Argument(Path("results"), help="Results directory (every *.parquet in it).")
_DATASET = typer.Option(None, "--dataset", help="Only this dataset (name as in the results).")
_TASK = typer.Option(None, "--task", help="A registered task (default: binding when present).")
_METRIC = typer.Option(
    None, "--metric",
    help="Metric (listed by `--help` from the registry).")
_PROBE = typer.Option([], "--probe", help="Only these probe families (repeatable).")
_TOKENS = typer.Option([], "--tokens", help="Only these tokens choices (listed by `--help` from the registry).")
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


def _say(line: str) -> None:
    """A note on stderr (what was set aside, why no published row), as written."""
    stderr.print(line, soft_wrap=True, markup=False, highlight=False)


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
    """Rank backbones: one row each, a column per probe family x tokens choice, `value ± half-interval`."""
    from bench.core.outdir import WrittenFiles

    files = None
    if out is not None:  # a file of the user's there is refused before the results are read
        files = WrittenFiles(output_path(out, "out"), "out")
        files.check([files.main])
    text = api.leaderboard_table(results_dir, dataset=dataset, task=task, metric=metric, probes=probe, tokens=tokens,
                                 layer=layer, fingerprint=fingerprint, include_limited=include_limited,
                                 show_old=show_old, reference=reference, fmt=fmt.value,
                                 width=None if wide else TABLE_WIDTH, say=_say)
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
    b: Optional[str] = typer.Argument(None, help="The backbone to compare it with (default for an intervened A: its base)."),
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
    """A − B on the same test scenes: each task's metrics' paired differences with their 95% intervals and the layers used."""
    echo(api.compare(results_dir, a, b, metrics=metric, dataset=dataset, probes=probe, tokens=tokens, layer=layer,
                     fingerprint=fingerprint, include_limited=include_limited, fmt=fmt.value,
                     width=None if wide else TABLE_WIDTH, say=_say))


class PlotKind(str, Enum):
    layers = "layers"
    bars = "bars"
    sweep = "sweep"
    ablation = "ablation"


def plot(
    kind: PlotKind = typer.Argument(..., help="layers (metric vs depth), bars (probe families), sweep (metric vs a dataset quantity), ablation (metric vs intervention strength)."),
    results_dir: Path = _RESULTS,
    out: Optional[str] = typer.Option(None, "--out", "-o", metavar="STEM", help="File stem; writes STEM.png and STEM.svg (default plots/KIND)."),
    dataset: Optional[str] = _DATASET,
    task: Optional[str] = _TASK,
    metric: Optional[str] = _METRIC,
    probe: list[str] = _PROBE,
    tokens: list[str] = _TOKENS,
    layer: str = typer.Option("best", "--layer", help="For bars, sweep and ablation: best, last or a layer index."),
    x: str = typer.Option("objects", "--x", help="Sweep axis: objects, camera-height or visibility."),
    datasets: Optional[Path] = typer.Option(None, "--datasets", help="Sweep: directory holding the sweep's datasets (their cards give x)."),
    fingerprint: Optional[str] = _FINGERPRINT,
    include_limited: bool = _INCLUDE_LIMITED,
) -> None:
    """Draw results as PNG + SVG: layer-wise curves, probe-family bars, or a sweep curve."""
    paths = api.plot(kind.value, results_dir, out, dataset=dataset, task=task, metric=metric, probes=probe,
                     tokens=tokens, layer=layer, x=x, datasets=datasets, fingerprint=fingerprint,
                     include_limited=include_limited, say=_say)
    stderr.print("wrote " + ", ".join(map(str, paths)))
