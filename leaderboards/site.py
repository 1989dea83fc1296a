"""`bench site`: a static leaderboard site of one or more results folders, from the same templates
and the same board as `bench report`.

The folder opens from disk with no server and nothing fetched from a network (styles and the
few lines of script are inside each page, figures are files beside them):
- `index.html`: one leaderboard per dataset x task x metric (binding: β*, β*_paper, β_O, β_F;
  IsSameObject: accuracy, balanced accuracy, AUROC), sortable by any column and filterable by
  probe family and tokens choice in the page, the papers' published rows beside the boards they
  belong to (marked, never ranked);
- `backbone-NAME.html`: per dataset and task, the headline metric by layer for each probe
  family x tokens choice (the board's chosen layer in bold), each column's sensitivity and checks at
  that layer, and the metric-by-depth figure;
- `dataset-NAME.html`: the dataset's card and priors, with its generator's settings and a
  preview sheet when its folder is given (`--datasets DIR`; a damaged folder: what is wrong with
  it instead), else where to find it; with intervened backbones, each task's headline metric
  against intervention strength (`leaderboards.ablation`);
- `compare.html`: the paired difference of every pair of backbones on each dataset and probe
  column (bootstrap over shared test F codes) as a matrix with 95% intervals;
- `provenance.html`: per dataset its fingerprint and sizes, per run its versions, device and
  command; `toys.html` when toy analyses are given (`-a`, as the report takes them).

Rows come from `leaderboards.store.load_folders`: the newest row per key across the folders, a
dataset measured on two fingerprints as two datasets, `--limit` runs kept apart. The site's folder
is new, empty, or one a site was built in: every file the site writes is listed in its manifest
(`.index.html.files.json`) before it is written, a folder holding anything else (a user's page, a
link, a damaged manifest) is refused, and a rebuild removes only files the last build listed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from bench.core.dataset import write_text_atomic
from bench.core.errors import BenchError
from bench.core.intervention_specs import is_intervened
from bench.core.numbers import plus_minus
from bench.core.outdir import WrittenFiles
from bench.core.paths import output_path
from leaderboards import html
from leaderboards.ablation import ablation_curves, ablation_series
from leaderboards.board import Leaderboard, build_leaderboard, paired_cells, verdict
from bench.core.tasks import TASKS
from leaderboards.metrics import resolve_metric
from leaderboards.plots import NothingToDraw, figure_paths, layer_curves
from leaderboards.render import column_name, scale_digits
from leaderboards.report import fit_png, read_analysis
from leaderboards.store import load_folders

INDEX = "index.html"


@dataclass
class DatasetFolder:
    """A dataset folder given with `--datasets`: what its page shows, matched to results rows by a
    split's fingerprint. `preview` writes its preview sheet (a PNG) to the path it is given;
    `damage` is what `bench info` says of a damaged folder, which its page shows instead."""

    path: Path
    name: str
    fingerprints: set[str]
    card: dict[str, Any]
    preview: Callable[[Path], None] | None = field(default=None, repr=False)
    damage: str | None = None


def build_site(results_dirs: Sequence[str | os.PathLike], out: str | os.PathLike, *,
               datasets: Sequence[DatasetFolder] = (), analyses: Sequence[str | os.PathLike] = (),
               include_limited: bool = False, figures: bool = True,
               say: Callable[[str], None] | None = None) -> list[Path]:
    """Write the site into `out` (made if missing) and return the files written, `index.html`
    first. `say` hears what was set aside; `figures` False leaves the per-backbone plots out."""
    if not results_dirs:
        raise BenchError("site: give at least one results folder")
    for d in results_dirs:
        if not Path(d).is_dir():
            raise BenchError(f"results: {d} is not a directory")
    out = output_path(out, "out")
    files = WrittenFiles(out / INDEX, "out")
    files.check_folder("site")  # new, empty, or a site's own (its manifest lists everything in it)
    selected = load_folders(results_dirs, include_limited=include_limited)
    rows = selected.rows
    loaded = [read_analysis(Path(a)) for a in analyses]
    if not rows:
        aside = f"; {selected.note}" if selected.note else ""
        raise BenchError(f"site: no result rows in {', '.join(map(str, results_dirs))}{aside}")
    if selected.note and say is not None:
        say(selected.note)
    t0 = time.perf_counter()
    site = _Site(files, rows, datasets, loaded, figures, notes=[selected.note] if selected.note else [],
                 sources=[str(d) for d in results_dirs])
    written = site.build()
    stale = files.finish(written, prefix="")
    if say is not None:
        say(f"wrote {len(written)} files to {out} in {time.perf_counter() - t0:.1f} s"
            + (f"; removed {len(stale)} the last build wrote and this one does not" if stale else ""))
    return written


#: The longest slug kept whole; a longer one is cut and ends in a hash of the whole name.
MAX_SLUG = 48


def slug(name: str) -> str:
    """A file-name-safe, short form of a backbone or dataset name (`facebook/dinov2-small` ->
    `facebook-dinov2-small`). A long name (a spec's path; an older results folder can hold any
    label) keeps its first 40 characters and ends in 8 hex digits of its SHA-256, so its page
    name stays short, stable from build to build and apart from other names."""
    short = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "x"
    if len(short) <= MAX_SLUG:
        return short
    return f"{short[:40].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _unique(names: Iterable[str], prefix: str) -> dict[str, str]:
    """Each name's page file, `PREFIX-SLUG.html`, numbered where two names share a slug."""
    pages: dict[str, str] = {}
    taken: set[str] = set()
    for name in sorted(set(names)):
        base = f"{prefix}-{slug(name)}"
        page, k = f"{base}.html", 2
        while page in taken:
            page, k = f"{base}-{k}.html", k + 1
        taken.add(page)
        pages[name] = page
    return pages


class _Site:
    def __init__(self, files: WrittenFiles, rows: list[dict[str, Any]], folders: Sequence[DatasetFolder],
                 analyses: list[tuple[dict[str, Any], Path]], figures: bool, notes: list[str],
                 sources: list[str]) -> None:
        self.files, self.out = files, files.folder
        self.rows, self.folders, self.analyses = rows, folders, analyses
        self.figures, self.notes, self.sources = figures, notes, sources
        self.written: list[Path] = []
        self.by_key: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            self.by_key.setdefault((r["dataset"], r["task"]), []).append(r)
        self.datasets = sorted({ds for ds, _ in self.by_key})
        self.backbone_pages = _unique((r["backbone"] for r in rows), "backbone")
        self.dataset_pages = _unique(self.datasets, "dataset")
        self.nav = [(INDEX, "Leaderboards"), ("compare.html", "Paired comparisons"),
                    ("provenance.html", "Provenance")] + ([("toys.html", "Identical objects (toys)")] if analyses else [])
        #: (dataset, task) -> the headline board (its cells, layers and ranks feed every page)
        self.headline: dict[tuple[str, str], Leaderboard] = {}
        self.layer_boards: dict[tuple[str, str], dict[int, Leaderboard]] = {}

    def build(self) -> list[Path]:
        index = self._index()
        for name, page in self.backbone_pages.items():
            self._page(page, "backbone.html", page_title=f"Backbone: {name}", **self._backbone(name))
        for name, page in self.dataset_pages.items():
            self._page(page, "dataset.html", page_title=f"Dataset: {name}", **self._dataset(name))
        self._page("compare.html", "compare.html", page_title="Paired comparisons", matrices=self._matrices())
        self._page("provenance.html", "provenance.html", page_title="Provenance", provenance=html.provenance(self.rows),
                   sources=self.sources)
        if self.analyses:
            self._toys()
        self._page(INDEX, "index.html", page_title="BindingBench leaderboards", boards_script=True, **index)
        self.written.insert(0, self.written.pop())  # index first
        return self.written

    def _page(self, filename: str, template: str, **context: Any) -> None:
        context.setdefault("boards_script", False)
        path = self.out / filename
        self.files.claim([path])
        write_text_atomic(html.render(template, nav=self.nav, **context), path)
        self.written.append(path)

    # -- index ------------------------------------------------------------------------------

    def _index(self) -> dict[str, Any]:
        sections = []
        probes, tokens = set(), set()
        for ds in self.datasets:
            for task, entry in TASKS.items():  # the boards of the index: each task's `board_metrics`
                rows = self.by_key.get((ds, task))
                if not rows:
                    continue
                boards = []
                for metric in entry.board_metrics or (entry.metric,):
                    board = build_leaderboard(rows, task=task, metric=metric, reference=True)
                    if metric == entry.metric:
                        self.headline[(ds, task)] = board
                    view = html.board_view(board, anchor=f"{slug(ds)}--{task}--{metric}")
                    if not any(x["kind"] != "published" and x["value"] is not None for x in view["lines"]):
                        continue  # the rows never computed this metric
                    probes.update(view["probes"])
                    tokens.update(view["tokens"])
                    boards.append(view)
                sections.append({"dataset": ds, "task": task, "boards": boards,
                                 "dataset_page": self.dataset_pages[ds]})
        return {"sections": sections, "probes": sorted(probes), "tokens": sorted(tokens), "notes": self.notes,
                "links": self.backbone_pages, "backbones": sorted(self.backbone_pages.items()),
                "datasets": sorted(self.dataset_pages.items())}

    # -- backbone pages -----------------------------------------------------------------------

    def _backbone(self, name: str) -> dict[str, Any]:
        parts = []
        for (ds, task), rows in sorted(self.by_key.items()):
            mine = [r for r in rows if r["backbone"] == name]
            if not mine:
                continue
            board = self.headline[(ds, task)]
            m = board.metric
            scale, digits = scale_digits(m)
            layers = sorted({r["layer"] for r in mine})
            by_layer = self._by_layer(ds, task, layers) if len(layers) > 1 else {}
            for row in (r for r in board.rows if r.backbone == name and r.reference is None):
                columns = [col for col in board.columns if row.cells.get(col) is not None]
                table = []
                for layer in layers if by_layer else []:
                    at = next(r for r in by_layer[layer].rows if r.label == row.label)
                    line = []
                    for col in columns:
                        c = at.cells.get(col)
                        ok = c is not None and c.status == "ok" and c.layer == layer
                        line.append({"text": "" if not ok else
                                     f"{fixed_pm(c, scale, digits)}{' ‡' if c.checks else ''}",
                                     "chosen": row.cells[col].layer == layer and row.cells[col].status == "ok"})
                    table.append({"layer": layer, "cells": line})
                chosen = []
                for col in columns:
                    c = row.cells[col]
                    chosen.append([column_name(col), c.status, c.layer if c.n_layers else None,
                                   c.chosen_on, None if c.status != "ok" else fixed_pm(c, scale, digits),
                                   _sensitivity(c),
                                   "; ".join(c.checks) or (c.error if c.status == "error" else None) or "none",
                                   row.rank])
                parts.append({"dataset": ds, "task": task, "label": row.label, "metric": f"{m.label} ({m.unit})",
                              "columns": [column_name(c) for c in columns], "table": table, "chosen": chosen,
                              "dataset_page": self.dataset_pages[ds], "anchor": f"{slug(ds)}--{task}--{m.name}"})
            if self.figures and len(layers) > 1:
                stem = self.out / f"fig-{self.backbone_pages[name][:-5]}-{slug(ds)}-{task}"
                self.files.claim(figure_paths(stem, ("png",)))
                try:
                    paths = layer_curves(mine, stem, formats=("png",), task=task, metric=m.name)
                except NothingToDraw:  # every value NaN or unfinished: a line in the figure's place
                    parts[-1]["no_figure"] = f"No figure: no layer of {name} has a {m.label} value to draw on {ds}."
                else:
                    self.written += paths
                    parts[-1]["figure"] = paths[0].name
        return {"parts": parts, "name": name}

    def _by_layer(self, ds: str, task: str, layers: list[int]) -> dict[int, Leaderboard]:
        """The headline board of (dataset, task) at each layer, unranked, built once for every backbone page."""
        cache = self.layer_boards.setdefault((ds, task), {})
        for layer in layers:
            if layer not in cache:
                cache[layer] = build_leaderboard(self.by_key[(ds, task)], task=task, layer=layer, ranked=False)
        return cache

    # -- dataset pages ------------------------------------------------------------------------

    def _ablations(self, name: str) -> list[dict[str, str]]:
        """Per task measured on dataset `name` with intervened backbones: its headline metric
        against intervention strength (`bench plot ablation`), a PNG beside the page."""
        out = []
        for task in TASKS.names():
            rows = self.by_key.get((name, task), [])
            if not self.figures or not any(is_intervened(r.get("spec") or r["backbone"]) for r in rows):
                continue
            stem = self.out / f"fig-{self.dataset_pages[name][:-5]}-ablation-{task}"
            try:
                board, series = ablation_series(rows, task=task)
            except BenchError as e:  # no intervened value finished: a line in the figure's place
                out.append({"task": task, "no_figure": f"No ablation figure: {e}"})
                continue
            self.files.claim(figure_paths(stem, ("png",)))
            paths = ablation_curves(board, series, stem, formats=("png",))
            self.written += paths
            out.append({"task": task, "figure": paths[0].name, "metric": board.metric.label})
        return out

    def _dataset(self, name: str) -> dict[str, Any]:
        rows = [r for (ds, _), rs in self.by_key.items() if ds == name for r in rs]
        card = html.dataset_cards(rows)[0] if any(r["status"] == "ok" for r in rows) else None
        fps = {r["dataset_fingerprint"] for r in rows}
        folder = next((f for f in self.folders if f.fingerprints & fps), None)
        preview = None
        if folder is not None and folder.preview is not None:
            path = self.out / f"fig-{self.dataset_pages[name][:-5]}-preview.png"
            self.files.claim([path])
            folder.preview(path)
            self.written.append(path)
            preview = path.name
        boards = [{"task": task, "anchor": f"{slug(name)}--{task}--{entry.metric}",
                   "metric": resolve_metric(None, task).label} for task, entry in TASKS.items()
                  if (name, task) in self.by_key]
        generator = (folder.card.get("generator") or {}) if folder else {}
        return {"name": name, "card": card, "fingerprints": sorted(fps), "folder": folder, "ablations": self._ablations(name),
                "generator": generator.get("name") if isinstance(generator, dict) else generator,
                "config": _pretty(folder.card.get("config")) if folder and not folder.damage else None,
                "preview": preview, "boards": boards}

    # -- paired comparisons -------------------------------------------------------------------

    def _matrices(self) -> list[dict[str, Any]]:
        """Per dataset and probe column of the headline binding board: every pair's paired
        difference (row − column) with its interval; "—" where the two were not measured on the
        same scenes with per-scene bits."""
        out = []
        for (ds, task), board in sorted(self.headline.items()):
            rows = [r for r in board.rows if r.control is None and r.reference is None]
            if not TASKS.get(task).per_scene or len(rows) < 2:
                continue
            m = board.metric
            scale, digits = scale_digits(m)
            for col in board.columns:
                present = [r for r in rows if r.cells.get(col) is not None and r.cells[col].status == "ok"]
                if len(present) < 2:
                    continue
                found: dict[tuple[int, int], tuple[float, float, float] | None] = {}
                for i, a in enumerate(present):
                    for j in range(i + 1, len(present)):
                        found[(i, j)] = paired_cells(a.cells[col], present[j].cells[col], m)
                grid = []
                for i, a in enumerate(present):
                    line = []
                    for j in range(len(present)):
                        if i == j:
                            line.append({"text": "", "cls": ""})
                            continue
                        d = found[(min(i, j), max(i, j))]
                        if d is None:
                            line.append({"text": "—", "cls": ""})
                            continue
                        diff, lo, hi = d if i < j else (-d[0], -d[2], -d[1])
                        side = verdict(lo, hi, m)
                        line.append({"text": f"{diff * scale:+.{digits}f} [{lo * scale:+.{digits}f}, "
                                             f"{hi * scale:+.{digits}f}]",
                                     "cls": "better" if side > 0 else "worse" if side < 0 else ""})
                    grid.append({"label": a.label, "cells": line})
                out.append({"dataset": ds, "column": column_name(col), "metric": f"{m.label} ({m.unit})",
                            "labels": [r.label for r in present], "grid": grid,
                            "unpaired": any(v is None for v in found.values())})
        return out

    # -- toys ---------------------------------------------------------------------------------

    def _toys(self) -> None:
        views = []
        for k, (analysis, fig) in enumerate(self.analyses):
            path = self.out / f"fig-toys-{k}.png"
            self.files.claim([path])
            fit_png(fig, path)
            self.written.append(path)
            views.append(html.analysis_view(analysis, k, path.name))
        data = html.script_json({"analyses": [html.heatmap_data(a) for a, _ in self.analyses],
                                 "colormap": html.colormap()})
        self._page("toys.html", "toys.html", page_title="Identical objects (toys)", analyses=views, heatmap_data=data)


def fixed_pm(c: Any, scale: float, digits: int) -> str:
    return plus_minus(c.value, c.lo, c.hi, scale, digits)


def _sensitivity(c: Any) -> str | None:
    if c.sensitivity is None:
        return None
    if c.sensitivity_lo is None or c.sensitivity_hi is None:
        return f"{c.sensitivity:.0%}"
    return f"{c.sensitivity:.0%} [{c.sensitivity_lo:.0%}, {c.sensitivity_hi:.0%}]"


def _pretty(obj: Any) -> str | None:
    return None if obj is None else json.dumps(obj, indent=2, sort_keys=True, default=str)
