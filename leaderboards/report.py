"""`bench report`: one self-contained static HTML page of every task in the results.

Everything the page shows is inside the file (figures as base64 PNG, data as inline
JSON, a few lines of plain JavaScript): it opens from disk, with no server and no
network, and can be mailed or archived as one file. Sections:

1. binding: the β* leaderboard (best layer per cell, with its notes), β* by depth and by
   probe family (the figures `bench leaderboard` / `bench plot` give);
2. IsSameObject: per-layer accuracy curves, one panel per probe, one line per backbone
   (trained probes and baselines apart), and the best layer per backbone and probe;
3. for each toy analysis (`bench toys-analysis`): its figure and table, and an
   interactive heatmap: click a patch of a scene to colour every other patch by the
   probe's P(same object) with it; a slider picks the layer.

Rows are chosen as the leaderboard chooses them (`leaderboards.store.select_rows`); the
page says what was set aside, and which sections are empty and why.

The PNG figures are also written next to the page. For tests and screenshots the page
accepts `?autoclick=X,Y` (fractions of the scene image) and `&layer=K` (slider index),
applied once the page has drawn.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib

matplotlib.use("Agg")
from matplotlib import colormaps  # noqa: E402

from bench.errors import BenchError  # noqa: E402
from leaderboards.plots import layer_curves, probe_bars  # noqa: E402
from leaderboards.store import load_selected  # noqa: E402
from leaderboards.tables import Leaderboard, board_notes, build_leaderboard, column_name, format_cell, title  # noqa: E402

ANALYSIS_JSON = "toy_analysis.json"
ANALYSIS_PNG = "toy_analysis.png"
CURVES_STEM = "issameobject"
#: One curves figure per group, four panels at most, so each stays readable.
PROBE_GROUPS = {
    "probes": ("linear", "diag-quadratic", "quadratic", "pointwise-identity"),
    "baselines": ("cosine", "dot", "distance", "majority"),
}
METRIC_KEYS = ("accuracy", "balanced_accuracy", "auroc", "majority_accuracy")


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
    """Write the HTML page and its PNG figures; returns [page, *figures]. `metric` is the
    IsSameObject metric drawn; `say` hears, one line each, what was set aside and which
    sections are empty and why (the page says the same)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    selected = (load_selected(results_dir, fingerprint=fingerprint, include_limited=include_limited)
                if results_dir is not None else None)
    all_rows = selected.rows if selected else []
    binding = [r for r in all_rows if r["task"] == "binding"]
    rows = [r for r in all_rows if r["task"] == "issameobject"]
    loaded = [_read_analysis(Path(a)) for a in analyses]
    if not all_rows and not loaded:
        raise BenchError("report: nothing to show (no results and no --analysis directory)")
    where = f"in {results_dir}" if results_dir is not None else "(no results directory given)"
    empty = {
        "Binding": None if binding else f"no binding rows {where}: run `bench evaluate --task binding`",
        "IsSameObject": None if rows else f"no issameobject rows {where}: run `bench evaluate --task issameobject`",
        "Identical objects (toys)": None if loaded else
        "no --analysis directory given: run `bench toys-analysis --out DIR`, then `bench report -a DIR`",
    }
    notes = [n for n in [selected.note if selected else None] if n]
    notes += [f"{name}: empty — {why}" for name, why in empty.items() if why]
    for n in notes:
        if say is not None:
            say(n)
    figures: list[Path] = []
    sections = ["<section><h2>About this page</h2>" + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
                + "</section>"] if notes else []
    if binding:
        pngs = _binding_figures(binding, out)
        figures += pngs
        sections.append(_binding_section(build_leaderboard(binding, task="binding"), pngs))
    if rows:
        pngs = []
        for group, probes in PROBE_GROUPS.items():
            present = [p for p in probes if any(r["probe"] == p for r in rows)]
            if present:
                stem = out.with_name(f"{out.stem}_{CURVES_STEM}_{group}")
                pngs.append(layer_curves(rows, stem, task="issameobject", metric=metric, probes=present)[0])
        figures += pngs
        sections.append(_curves_section(rows, pngs, metric))
    for k, (analysis, fig) in enumerate(loaded):
        copy = out.with_name(f"{out.stem}_toys_{k}.png")
        shutil.copyfile(fig, copy)
        figures.append(copy)
        sections.append(_analysis_section(analysis, copy, k))
    page = _PAGE.format(
        title="BindingBench report",
        style=_STYLE,
        body="\n".join(sections),
        data=_script_json({"analyses": [_heatmap_data(a) for a, _ in loaded], "colormap": _colormap()}),
        script=_SCRIPT,
    )
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return [out, *figures]


def _binding_figures(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """β* by depth (when some backbone has layers to compare) and by probe family."""
    pngs = []
    if any(r["n_layers"] for r in rows):
        pngs.append(layer_curves(rows, out.with_name(f"{out.stem}_binding_layers"), task="binding")[0])
    pngs.append(probe_bars(build_leaderboard(rows, task="binding"), out.with_name(f"{out.stem}_binding_bars"))[0])
    return pngs


def _binding_section(board: Leaderboard, pngs: list[Path]) -> str:
    """The β* leaderboard as `bench leaderboard` prints it (cells, ranks, notes), then the figures."""
    multi = len(board.datasets) > 1
    head = ["rank", *(["dataset"] if multi else []), "backbone", *map(column_name, board.columns)]
    body = []
    for row in board.rows:
        cells = [format_cell(row.cells[c], board.metric, markdown=True) for c in board.columns]
        # the layer note is the one piece of markup a cell carries: keep it, escape the rest
        cells = [html.escape(c).replace("&lt;sub&gt;", "<sub>").replace("&lt;/sub&gt;", "</sub>") for c in cells]
        lead = ["" if row.rank is None else str(row.rank), *([row.dataset] if multi else []), row.backbone]
        body.append("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in lead)
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    thead = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    notes = "".join(f"<p class='footnote'>{html.escape(n)}</p>" for n in board_notes(board))
    return (
        "<section><h2>Binding: β* by backbone</h2>"
        f"<h3>{html.escape(title(board))}</h3>"
        f"<table><thead><tr>{thead}</tr></thead><tbody>{''.join(body)}</tbody></table>{notes}"
        + "".join(_img(p, "binding figure") for p in pngs) + "</section>"
    )


def _read_analysis(path: Path) -> tuple[dict[str, Any], Path]:
    d = path if path.is_dir() else path.parent
    if not (d / ANALYSIS_JSON).exists() or not (d / ANALYSIS_PNG).exists():
        raise BenchError(f"report: {path} holds no {ANALYSIS_JSON} + {ANALYSIS_PNG} (run `bench toys-analysis --out {path}`)")
    return json.loads((d / ANALYSIS_JSON).read_text()), d / ANALYSIS_PNG


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img class="figure" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _curves_section(rows: list[dict[str, Any]], pngs: list[Path], metric: str) -> str:
    """The curves figure and, per (backbone, probe), the layer with the best mean metric over seeds."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get(metric) is not None:
            groups.setdefault((r["dataset"], r["backbone"], r["probe"]), {}).setdefault(r["layer"], []).append(r)
    table = []
    for (dataset, backbone, probe), layers in sorted(groups.items()):
        mean = {layer: sum(x[metric] for x in rs) / len(rs) for layer, rs in layers.items()}
        best = max(mean, key=mean.get)
        r = layers[best][0]
        table.append((dataset, backbone, probe, best, mean[best], r.get(f"{metric}_lo"), r.get(f"{metric}_hi"),
                      r.get("majority_accuracy")))
    errors = sum(r["status"] != "ok" for r in rows)
    note = f"<p class='note'>{errors} failed row(s) not shown.</p>" if errors else ""
    return (
        f"<section><h2>IsSameObject {html.escape(metric)} by layer</h2>"
        + "".join(_img(p, "accuracy curves") for p in pngs)
        + "<h3>Best layer per backbone and probe</h3>"
        + _table(["dataset", "backbone", "probe", "layer", metric, "lo", "hi", "majority"], table)
        + note + "</section>"
    )


def _analysis_section(a: dict[str, Any], png: Path, k: int) -> str:
    cats = [c for c in a["categories"] if any(r["category"] == c and r["n"] for r in a["stats"])]
    cells = {(r["layer"], r["category"]): r for r in a["stats"] if r["n"]}
    table = [
        [layer] + [
            f"{cells[(layer, c)]['mean_score']:.2f} ({cells[(layer, c)]['frac_above_half']:.0%})" if (layer, c) in cells else None
            for c in cats
        ]
        for layer in a["layers"]
    ]
    title = f"{a['backbone']} on {a['dataset']} ({a['probe']} probe trained on {a['train_dataset']})"
    return (
        f"<section><h2>Identical objects: {html.escape(title)}</h2>{_img(png, 'toy analysis')}"
        "<h3>Mean score (share of pairs above 0.5) per layer and pair category</h3>"
        + _table(["layer", *cats], table)
        + f"<h3>Interactive: click a patch</h3><div class='heatmap' data-analysis='{k}'></div></section>"
    )


def _heatmap_data(a: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": f"{a['backbone']} — {a['dataset']}",
        "layers": a["layers"],
        "grid": a["grid"],
        "scenes": [{"id": s["scene_id"], "image": s["image_png"], "labels": s["labels"], "scores": s["scores"]}
                   for s in a["scenes"]],
    }


def _colormap() -> list[list[int]]:
    cmap = colormaps["viridis"]
    return [[round(255 * c) for c in cmap(i / 255)[:3]] for i in range(256)]


def _script_json(obj: Any) -> str:
    """JSON safe inside <script>: no `</` can close the element early."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: .2em; }
img.figure { max-width: 100%; display: block; margin: 1em 0; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1.5em; }
th, td { border: 1px solid #ddd; padding: .2em .6em; text-align: right; }
th { background: #f4f4f4; }
.note { color: #a00; }
.footnote { color: #555; font-size: .85em; }
.heatmap { display: flex; gap: 1.5em; align-items: flex-start; flex-wrap: wrap; }
.heatmap canvas { border: 1px solid #999; cursor: crosshair; image-rendering: pixelated; }
.controls { font-size: .9em; min-width: 260px; }
.controls label { display: block; margin: .6em 0; }
.controls input[type=range] { width: 220px; }
.legend { height: 12px; width: 220px; }
"""

_SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("bench-data").textContent);
const CMAP = DATA.colormap;
const PARAMS = new URLSearchParams(window.location.search);

function decodeScores(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function loadImage(b64) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("scene image failed to decode"));
    img.src = "data:image/png;base64," + b64;
  });
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

class Heatmap {
  constructor(root, analysis) {
    this.a = analysis;
    this.rows = analysis.grid[0];
    this.cols = analysis.grid[1];
    this.scene = 0;
    this.layer = analysis.layers.length - 1;
    this.selected = null;
    this.cache = new Map();
    this.canvas = el("canvas", {width: 448, height: 448});
    const controls = el("div", {class: "controls"});
    this.sceneSelect = el("select");
    analysis.scenes.forEach((s, i) => this.sceneSelect.appendChild(el("option", {value: i}, s.id)));
    this.slider = el("input", {type: "range", min: 0, max: analysis.layers.length - 1, value: this.layer, step: 1});
    this.layerText = el("span");
    this.info = el("p", {}, "Click a patch of the scene.");
    const legend = el("canvas", {class: "legend", width: 256, height: 12});
    const lctx = legend.getContext("2d");
    for (let i = 0; i < 256; i++) { lctx.fillStyle = `rgb(${CMAP[i].join(",")})`; lctx.fillRect(i, 0, 1, 12); }
    const sceneLabel = el("label", {}, "scene ");
    sceneLabel.appendChild(this.sceneSelect);
    const layerLabel = el("label", {}, "layer ");
    layerLabel.appendChild(this.layerText);
    layerLabel.appendChild(el("br"));
    layerLabel.appendChild(this.slider);
    controls.append(el("strong", {}, analysis.title), sceneLabel, layerLabel,
                    el("div", {}, "P(same object): 0 → 1"), legend, this.info);
    root.append(this.canvas, controls);
    this.canvas.addEventListener("click", (ev) => {
      const r = this.canvas.getBoundingClientRect();
      this.select((ev.clientX - r.left) / r.width, (ev.clientY - r.top) / r.height);
    });
    this.slider.addEventListener("input", () => { this.layer = Number(this.slider.value); this.draw(); });
    this.sceneSelect.addEventListener("change", () => this.setScene(Number(this.sceneSelect.value)));
  }

  async setScene(i) {
    this.scene = i;
    this.selected = null;
    this.image = await loadImage(this.a.scenes[i].image);
    this.draw();
  }

  select(fx, fy) {
    const r = Math.min(this.rows - 1, Math.max(0, Math.floor(fy * this.rows)));
    const c = Math.min(this.cols - 1, Math.max(0, Math.floor(fx * this.cols)));
    this.selected = r * this.cols + c;
    this.draw();
  }

  scores() {
    const key = `${this.scene}/${this.layer}`;
    if (!this.cache.has(key)) {
      const layer = String(this.a.layers[this.layer]);
      this.cache.set(key, decodeScores(this.a.scenes[this.scene].scores[layer]));
    }
    return this.cache.get(key);
  }

  draw() {
    const ctx = this.canvas.getContext("2d");
    const w = this.canvas.width, h = this.canvas.height;
    const pw = w / this.cols, ph = h / this.rows;
    this.layerText.textContent = `${this.a.layers[this.layer]} (${this.layer + 1} of ${this.a.layers.length})`;
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.image, 0, 0, w, h);
    if (this.selected === null) { this.canvas.dataset.selected = ""; return; }
    const t = this.rows * this.cols;
    const s = this.scores();
    const labels = this.a.scenes[this.scene].labels;
    ctx.globalAlpha = 0.6;
    for (let k = 0; k < t; k++) {
      const v = s[this.selected * t + k];
      ctx.fillStyle = `rgb(${CMAP[v].join(",")})`;
      ctx.fillRect((k % this.cols) * pw, Math.floor(k / this.cols) * ph, Math.ceil(pw), Math.ceil(ph));
    }
    ctx.globalAlpha = 1;
    ctx.strokeStyle = "#ff2d2d";
    ctx.lineWidth = 3;
    ctx.strokeRect((this.selected % this.cols) * pw, Math.floor(this.selected / this.cols) * ph, pw, ph);
    const label = labels[this.selected];
    this.canvas.dataset.selected = String(this.selected);
    this.info.textContent = `patch ${Math.floor(this.selected / this.cols)},${this.selected % this.cols} ` +
      `(label ${label < 0 ? "ignored" : label === 0 ? "background" : label})`;
  }
}

async function main() {
  const views = [];
  for (const root of document.querySelectorAll(".heatmap")) {
    const a = DATA.analyses[Number(root.dataset.analysis)];
    if (!a.scenes.length) { root.textContent = "No scenes stored in this analysis."; continue; }
    const view = new Heatmap(root, a);
    await view.setScene(0);
    views.push(view);
  }
  if (views.length && PARAMS.has("layer")) {
    const v = views[0];
    v.layer = Math.min(v.a.layers.length - 1, Math.max(0, Number(PARAMS.get("layer"))));
    v.slider.value = v.layer;
    v.draw();
  }
  if (views.length && PARAMS.has("autoclick")) {
    const [fx, fy] = PARAMS.get("autoclick").split(",").map(Number);
    views[0].select(fx, fy);
  }
  document.body.dataset.ready = "1";
}
main().catch((e) => { console.error(e); });
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
{body}
<script type="application/json" id="bench-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
