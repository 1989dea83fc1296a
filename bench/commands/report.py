"""Report commands: `bench toys-analysis` (the identical-objects experiment) and `bench report`
(one self-contained HTML page of every task's results, plus PNG figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench import api
from bench.commands.common import Format, echo, render_table, stderr


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("toys-analysis")(toys_analysis)
    app.command("report")(report)
    app.command("site")(site)


def toys_analysis(
    model: str = typer.Option(..., "--model", "-m", help="Backbone spec (see `bench models`)."),
    dataset: Path = typer.Option(..., "--dataset", "-d", help="A `toys` dataset (bench generate toys)."),
    train_dataset: Optional[Path] = typer.Option(
        None, "--train-dataset", help="Train the probe on this dataset's train/val splits (default: the toys')."),
    probe: str = typer.Option("quadratic", "--probe", help="Pairwise probe: linear, diag-quadratic, quadratic, "
                              "pointwise-identity, cosine, dot, distance."),
    layers: str = typer.Option("all", "--layers", help="all, last, mid, a fraction like 0.5, or indices 0,4,8."),
    split: str = typer.Option("test", "--split", help="Toy split whose pairs are scored."),
    out: str = typer.Option("toy-analysis", "--out", "-o", metavar="DIR", help="Directory for toy_analysis.json and .png."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, bf16 or fp16 forward passes."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Probe epochs (default 30, early stopping on val)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use at most this many scenes per split."),
    heatmap_scenes: int = typer.Option(3, "--heatmap-scenes", help="Scenes whose full score maps go to the report."),
    fmt: Format = typer.Option(Format.table, "--format", help="table, markdown, csv or json."),
) -> None:
    """Score patch pairs of identical-object toy scenes by pair category, per layer."""
    done = api.toys_analysis(model, dataset, train_dataset=train_dataset, probe=probe, layers=layers, split=split,
                             out=out, device=device, dtype=dtype, epochs=epochs, limit=limit,
                             heatmap_scenes=heatmap_scenes)
    echo(render_table(done.rows, done.columns, fmt, title=f"IsSameObject scores by pair category — {model}"))
    stderr.print(f"wrote {done.json_path} and {done.png}")


def report(
    results_dir: Optional[Path] = typer.Argument(
        None, help="Results directory (binding and issameobject rows are drawn; default: results, when it exists)."),
    analysis: list[Path] = typer.Option([], "--analysis", "-a", help="A `bench toys-analysis` output directory (repeatable)."),
    out: str = typer.Option("report.html", "--out", "-o", metavar="FILE", help="The HTML file (self-contained); copies of its PNG figures go into STEM_files/ beside it."),
    metric: str = typer.Option("accuracy", "--metric", help="IsSameObject metric: accuracy, balanced_accuracy or auroc."),
    fingerprint: Optional[str] = typer.Option(
        None, "--fingerprint", help="Show the measurement on this dataset fingerprint (a prefix) instead of the newest."),
    include_limited: bool = typer.Option(
        False, "--include-limited", help="Also show --limit runs, each as its own dataset `NAME (limit N)`."),
) -> None:
    """Write a self-contained HTML report (opens from disk, no server, no network)."""
    if results_dir is None and Path("results").is_dir():
        results_dir = Path("results")
    paths = api.report(results_dir, out, analyses=analysis, metric=metric, fingerprint=fingerprint,
                       include_limited=include_limited,
                       say=lambda line: stderr.print(line, soft_wrap=True, markup=False, highlight=False))
    echo(str(paths[0]))
    for p in paths[1:]:
        stderr.print(f"figure: {p}")


def site(
    results_dirs: list[Path] = typer.Argument(..., help="Results folders (the newest row per key wins across them)."),
    out: str = typer.Option(..., "--out", "-o", metavar="DIR",
                            help="The site's folder (index.html and the pages beside it): new, empty, or a site's."),
    datasets: list[Path] = typer.Option(
        [], "--datasets", help="A dataset folder, or a folder of them, to show cards and preview sheets (repeatable)."),
    analysis: list[Path] = typer.Option([], "--analysis", "-a", help="A `bench toys-analysis` output directory (repeatable)."),
    include_limited: bool = typer.Option(
        False, "--include-limited", help="Also show every --limit run, each as its own dataset `NAME (limit N)`."),
) -> None:
    """Build a static leaderboard site (opens from disk, no server, no network): a board per dataset x task x
    metric, a page per backbone and per dataset, the paired comparisons and the provenance."""
    paths = api.site(results_dirs, out, datasets=datasets, analyses=analysis, include_limited=include_limited,
                     say=lambda line: stderr.print(line, soft_wrap=True, markup=False, highlight=False))
    echo(str(paths[0]))
