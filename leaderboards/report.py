"""`bench report`: one self-contained static HTML page of every task in the results.

Everything the page shows is inside the file (figures as base64 PNG, data as inline
JSON, a few lines of plain JavaScript): it opens from disk, with no server and no
network, and can be mailed or archived as one file. It is the single-page form of `bench
site`: the same templates (`leaderboards/templates`, Jinja2, autoescaped) and the same board
(`leaderboards.board`: cells, layers chosen on validation, checks, ranks). It is a reader's
first stop, in order:

Each task's section is drawn by what its record names (`Task.report_section`, the built-ins' in
`leaderboards.sections`), in registration order:

1. binding: the headline β* leaderboard (each cell at the layer chosen on validation, its
   test value with its 95% interval, its sensitivity, its notes; sortable and filterable by
   probe family and tokens choice), then β* by depth as small multiples and by probe family;
2. IsSameObject: per-layer accuracy curves, one panel per probe, one line per backbone
   (trained probes and baselines apart), and per backbone and probe the board's layer (chosen
   on validation, with the leaderboard's all-seeds rule) with its test number, beside the baselines measured on the same dataset
   (`pixels` under the same probe, the majority class) and the attention correlation
   (attention_r, attention_p) where the rows carry it;
3. for each toy analysis (`bench toys-analysis`): its figure and table, and an
   interactive heatmap: click a patch of a scene to colour every other patch by the
   probe's P(same object) with it; a slider picks the layer;
4. datasets and provenance: per dataset its fingerprint, sizes and priors; per run the
   versions, device and the command that made it.

Sections with nothing to show are folded into one grey line saying why. No figure is wider
than 1280 px (`leaderboards.plots.MAX_PNG_WIDTH`), and the page fits a 1280-px window (wide
tables scroll inside their own box).

Rows are chosen as the leaderboard chooses them (`leaderboards.store.select_rows`); the
page says what was set aside, and which sections are empty and why.

Copies of the PNG figures, for slides or a paper, go into `PAGE_files/` beside the page (as a
browser saves a page); the page itself needs none of them. That folder is the report's own
(`bench.core.outdir.FolderFiles`: its `.files.json` lists them), so a rerun replaces its figures
there and removes those it no longer draws, and a folder of that name holding anything else, or a
link, is refused. For tests and screenshots the page accepts `?autoclick=X,Y` (fractions of the
scene image) and `&layer=K` (slider index), applied once the page has drawn.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.core.dataset import replacing, write_text_atomic
from bench.core.errors import BenchError
from bench.core.outdir import FolderFiles, WrittenFiles
from bench.core.paths import output_path
from bench.core.tasks import TASKS
from leaderboards import html
from leaderboards.plots import MAX_PNG_WIDTH
from leaderboards.sections import METRIC_KEYS
from leaderboards.store import load_selected

ANALYSIS_JSON = "toy_analysis.json"
ANALYSIS_PNG = "toy_analysis.png"


def build_report(
    results_dir: str | os.PathLike | None,
    analyses: Sequence[str | os.PathLike] = (),
    out: str | os.PathLike = "report.html",
    *,
    metric: str = "accuracy",
    fingerprint: str | None = None,
    include_limited: bool = False,
    say: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write the HTML page, and copies of its PNG figures into `PAGE_files/` beside it; returns
    [page, *figures]. `metric` is the IsSameObject metric drawn; `say` hears, one line each, what
    was set aside and which sections are empty and why (the page says the same)."""
    if metric not in METRIC_KEYS[:3]:
        raise BenchError(f"metric: unknown {metric!r}; IsSameObject metrics: {', '.join(METRIC_KEYS[:3])}")
    out = output_path(out, "out")
    files = WrittenFiles(out, "out")
    files.check([out])  # a page of the user's is refused before anything is read or drawn
    drawings = FolderFiles(out.with_name(f"{out.stem}_files"), "out")  # the figures' folder: new, empty or its own
    drawings.check_folder("report")
    selected = (load_selected(results_dir, fingerprint=fingerprint, include_limited=include_limited)
                if results_dir is not None else None)
    all_rows = selected.rows if selected else []
    # one section per task whose record names one (`Task.report_section`), in registration order
    sections = {name: (task, task.hook("report_section"), [r for r in all_rows if r["task"] == name])
                for name, task in TASKS.items() if task.report_section is not None}
    loaded = [read_analysis(Path(a)) for a in analyses]
    if not all_rows and not loaded:
        raise BenchError("report: nothing to show (no results and no --analysis directory)")
    keys = [key for name, (_, section, rows) in sections.items() if rows for key in section.figures(name, rows)]
    # every figure this report draws, by what it shows: listed in its folder before any is drawn
    figures = {key: drawings.folder / f"{key}.png" for key in [*keys, *(f"toys_{k}" for k in range(len(loaded)))]}
    files.claim([out])
    drawings.claim(figures.values())
    where = f"in {results_dir}" if results_dir is not None else "(no results directory given)"
    empty = {
        **{task.title or name: None if rows else f"no {name} rows {where}: run `bench evaluate --task {name}`"
           for name, (task, _, rows) in sections.items()},
        "Identical objects (toys)": None if loaded else
        "no --analysis directory given: run `bench toys-analysis --out DIR`, then `bench report -a DIR`",
    }
    notes = [n for n in [selected.note if selected else None] if n]
    folded = [f"{name} ({why})" for name, why in empty.items() if why]
    for n in [*notes, *(["not shown: " + "; ".join(folded)] if folded else [])]:
        if say is not None:
            say(n)
    context: dict[str, Any] = {"page_title": "BindingBench report", "nav": [], "notes": notes,
                               "folded": "; ".join(folded), **{name: None for name in sections},
                               "analyses": [], "provenance": None, "boards_script": False}
    for name, (_, section, rows) in sections.items():
        if rows:
            context.update(section.context(name, rows, {k: p for k, p in figures.items() if k.startswith(f"{name}_")},
                                           metric))
    for k, (analysis, fig) in enumerate(loaded):
        copy = figures[f"toys_{k}"]
        fit_png(fig, copy)
        context["analyses"].append(html.analysis_view(analysis, k, html.data_uri(copy)))
    if loaded:
        context["heatmap_data"] = html.script_json({"analyses": [html.heatmap_data(a) for a, _ in loaded],
                                                    "colormap": html.colormap()})
    if all_rows:
        context["provenance"] = html.provenance(all_rows)
    write_text_atomic(html.render("report.html", **context), out)
    # figures no longer drawn, and those an older report drew beside the page (in the page's list)
    stale = files.finish([out], prefix=f"{out.stem}_") + drawings.finish(list(figures.values()), prefix="")
    if stale and say is not None:
        say(f"removed {len(stale)} figure(s) the last report drew and this one does not: "
            + ", ".join(p.name for p in stale))
    return [out, *figures.values()]


def fit_png(src: Path, dst: Path) -> None:
    """Copy a figure, scaled down to MAX_PNG_WIDTH px where it is wider (an analysis drawn before
    figures were capped)."""
    from PIL import Image

    with Image.open(src) as im, replacing(dst) as tmp:
        if im.width <= MAX_PNG_WIDTH:
            shutil.copyfile(src, tmp)
            return
        im.resize((MAX_PNG_WIDTH, round(im.height * MAX_PNG_WIDTH / im.width)), Image.LANCZOS).save(tmp, format="PNG")


def read_analysis(path: Path) -> tuple[dict[str, Any], Path]:
    d = path if path.is_dir() else path.parent
    if not (d / ANALYSIS_JSON).exists() or not (d / ANALYSIS_PNG).exists():
        raise BenchError(f"report: {path} holds no {ANALYSIS_JSON} + {ANALYSIS_PNG} (run `bench toys-analysis --out {path}`)")
    return json.loads((d / ANALYSIS_JSON).read_text()), d / ANALYSIS_PNG
