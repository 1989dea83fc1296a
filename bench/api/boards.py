"""Views of a results folder: the ranked table, a paired comparison, figures, the one-page report
and the static site."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from bench.api.arguments import PathLike, Say
from bench.core.errors import BenchError

#: The figures `plot` draws.
PLOT_KINDS = ("layers", "bars", "sweep", "ablation")


def leaderboard_table(results: PathLike, *, dataset: str | None = None, task: str | None = None,
                      metric: str | None = None, probes: Sequence[str] = (), tokens: Sequence[str] = (),
                      layer: str | int = "best", fingerprint: str | None = None, include_limited: bool = False,
                      show_old: bool = False, reference: bool = False, fmt: str = "table",
                      width: int | None = None, say: Say = None) -> str:
    """The leaderboard of the results folder `results` rendered as `fmt` (table, markdown, csv,
    json), as `bench leaderboard` prints it: one row per backbone, a column per probe family x
    tokens choice, tables `width` columns wide (None: as wide as they need). `say` hears what the
    selection set aside and, with `reference`, why no published row is shown."""
    from bench.core.console import Format
    from leaderboards.published import none_published
    from leaderboards.render import render_leaderboard
    from leaderboards.selected import load_board

    _, board = load_board(results, fingerprint=fingerprint, include_limited=include_limited, show_old=show_old,
                          say=say, dataset=dataset, task=task, metric=metric, probes=probes, tokens=tokens,
                          layer=layer, reference=reference)
    text = render_leaderboard(board, Format(fmt), width)
    why = none_published(board.metric) if reference else None
    if why and say is not None:
        from bench.core.console import wrap

        say(wrap(why))
    return text


def compare(results: PathLike, a: str, b: str | None = None, *, metrics: Sequence[str] = (), dataset: str | None = None,
            probes: Sequence[str] = (), tokens: Sequence[str] = (), layer: str | int = "best",
            fingerprint: str | None = None, include_limited: bool = False, fmt: str = "table",
            width: int | None = None, say: Say = None) -> str:
    """Backbone `a` − backbone `b` on the same test scenes of `results`, each task's and metric's
    paired difference with its 95% interval and the layers used, rendered as `fmt` (as `bench
    compare`); `b` None: the base of the intervened backbone `a`. `say` hears what the selection
    set aside."""
    from bench.core.console import Format
    from leaderboards.compare import base_backbone, compare_backbones
    from leaderboards.render import render_compare
    from leaderboards.selected import selected_rows

    rows = selected_rows(results, fingerprint=fingerprint, include_limited=include_limited, say=say)
    b = base_backbone([r for r in rows if r.get("control") is None], a) if b is None else b
    records = compare_backbones(rows, a, b, metrics=metrics, dataset=dataset, probes=probes, tokens=tokens,
                                layer=layer)
    return render_compare(records, a, b, Format(fmt), width)


def plot(kind: str, results: PathLike, out: PathLike | None = None, *, dataset: str | None = None,
         task: str | None = None, metric: str | None = None, probes: Sequence[str] = (),
         tokens: Sequence[str] = (), layer: str | int = "best", x: str = "objects",
         datasets: PathLike | None = None, fingerprint: str | None = None, include_limited: bool = False,
         say: Say = None) -> list[Path]:
    """Draw `results` as PNG + SVG (`out` a file stem, default plots/KIND) and return the files, as
    `bench plot`: `layers` (metric vs depth), `bars` (probe families at `layer`), `sweep` (metric
    vs the dataset quantity `x`, read from the cards of the sweep's datasets under `datasets`) or
    `ablation` (metric vs intervention strength at `layer`, intervened backbones beside their base).
    Files of the user's at `out` are refused before the results are read; `say` hears what the
    selection set aside."""
    from bench.core.outdir import WrittenFiles
    from leaderboards import plots
    from leaderboards.selected import load_board, selected_rows

    if kind not in PLOT_KINDS:
        raise BenchError(f"kind: unknown {kind!r}; one of {', '.join(PLOT_KINDS)}")
    figure = plots.figure_paths(Path("plots") / kind if out is None else out)
    files = WrittenFiles(figure[0], "out")
    files.check(figure)  # a file of the user's there is refused before the results are read
    selection: dict[str, Any] = dict(dataset=dataset, task=task, metric=metric, probes=probes, tokens=tokens)
    chosen: dict[str, Any] = dict(fingerprint=fingerprint, include_limited=include_limited, say=say)
    if kind == "layers":
        rows, _ = load_board(results, **chosen, **selection)
        files.claim(figure)
        paths = plots.layer_curves(rows, figure[0], **selection)
    elif kind == "ablation":
        from leaderboards.ablation import ablation_series, ablation_curves

        board, series = ablation_series(selected_rows(results, required=True, **chosen), layer=layer, **selection)
        files.claim(figure)
        paths = ablation_curves(board, series, figure[0])
    elif kind == "bars":
        _, board = load_board(results, layer=layer, **chosen, **selection)
        files.claim(figure)
        paths = plots.probe_bars(board, figure[0])
    else:
        if datasets is None:
            raise BenchError("datasets: a sweep plot needs --datasets DIR (the sweep's dataset cards hold each x value)")
        rows, board = load_board(results, layer=layer, **chosen, **selection)
        x_values = plots.sweep_values(board.datasets, datasets, x)
        files.claim(figure)
        paths = plots.sweep_curve(rows, x_values, x, figure[0], layer=layer, **selection)
    files.finish(paths)
    return paths


def report(results: PathLike | None, out: PathLike = "report.html", *, analyses: Sequence[PathLike] = (),
           metric: str = "accuracy", fingerprint: str | None = None, include_limited: bool = False,
           say: Say = None) -> list[Path]:
    """Write the single-page report of a results folder (and/or toy analyses) as `bench report`
    does; returns [page, *figures]. `metric`: the IsSameObject metric drawn; `say(line)` hears
    what was set aside and which sections are empty."""
    from leaderboards.report import build_report

    return build_report(results, analyses, out, metric=metric, fingerprint=fingerprint,
                        include_limited=include_limited, say=say)


def site(results: PathLike | Sequence[PathLike], out: PathLike, *, datasets: Sequence[PathLike] = (),
         analyses: Sequence[PathLike] = (), include_limited: bool = False, figures: bool = True,
         say: Say = None) -> list[Path]:
    """Build the static leaderboard site of one or more results folders into `out` (as `bench site`
    does: a new or empty folder, or one a site was built in; anything else is refused) and return
    the files written, `index.html` first. `datasets`: folders holding the
    datasets the results were measured on (each a dataset, or a folder of them), so each dataset's
    page shows its generator's settings and a preview sheet; `analyses`: `bench toys-analysis`
    outputs; `say(line)` hears what was set aside and what was written."""
    from leaderboards.site import build_site

    dirs = [results] if isinstance(results, (str, os.PathLike)) else list(results)
    return build_site(dirs, out, datasets=_dataset_folders(datasets, say), analyses=analyses,
                      include_limited=include_limited, figures=figures, say=say)


#: Scenes on a dataset page's preview sheet, and its columns (3 keep it under 1,280 px wide).
PREVIEW_SCENES, PREVIEW_COLUMNS = 6, 3


def _dataset_folders(paths: Sequence[PathLike], say: Say = None) -> list[Any]:
    """Every dataset under the given folders (a folder that is a dataset, else its sub-folders that
    are), with its card, each split's fingerprint and its preview sheet writer. Each is checked as
    `bench info` checks it: a damaged one is said in one line (`say`) and kept with its damage, so
    its page says so rather than show it as sound; one whose card cannot be read is left out (its
    fingerprints, which match it to the results, are in that card)."""
    from bench.core.dataset import CARD_NAME, Dataset
    from generators.preview import contact_sheet
    from leaderboards.site import DatasetFolder

    found = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise BenchError(f"datasets: {p} is not a directory")
        candidates = [p] if (p / CARD_NAME).exists() else sorted(d for d in p.iterdir() if (d / CARD_NAME).exists())
        if not candidates:
            raise BenchError(f"datasets: {p} holds no dataset ({CARD_NAME} in it or in a sub-folder)")
        for d in candidates:
            try:
                ds = Dataset(d)
            except BenchError as e:
                if say is not None:
                    say(f"bench: warning: {e}; left out of the site")
                continue
            try:
                ds.verify()
            except BenchError as e:
                if say is not None:
                    say(f"bench: warning: {e}; its page says it is damaged")
                found.append(DatasetFolder(d, ds.name, {ds.fingerprint(s) for s in ds.splits}, ds.card,
                                           damage=str(e)))
                continue

            def preview(dst: Path, ds: Any = ds) -> None:
                split = "test" if "test" in ds.splits else ds.splits[0]
                contact_sheet(ds, split, PREVIEW_SCENES, cols=PREVIEW_COLUMNS).save(dst, format="PNG")

            found.append(DatasetFolder(d, ds.name, {ds.fingerprint(s) for s in ds.splits}, ds.card, preview))
    return found
