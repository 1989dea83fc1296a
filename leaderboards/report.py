"""`bench report`: one self-contained static HTML page of every task in the results.

Everything the page shows is inside the file (figures as base64 PNG, data as inline
JSON, a few lines of plain JavaScript): it opens from disk, with no server and no
network, and can be mailed or archived as one file. It is a reader's first stop, in order:

1. binding: the headline β* leaderboard (each cell at the layer chosen on validation, its
   test value with its 95% interval, `s NN%` sensitivity beside a 0, its notes), then β* by
   depth as small multiples and by probe family;
2. IsSameObject: per-layer accuracy curves, one panel per probe, one line per backbone
   (trained probes and baselines apart), and per backbone and probe the layer chosen on
   validation with its test number, beside the baselines measured on the same dataset
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

from bench.core.dataset import replacing, write_text_atomic  # noqa: E402
from bench.core.errors import BenchError  # noqa: E402
from bench.core.outdir import remove_stale_outputs  # noqa: E402
from leaderboards.plots import MAX_PNG_WIDTH, layer_curves, probe_bars  # noqa: E402
from leaderboards.store import load_selected  # noqa: E402
from leaderboards.board import Leaderboard, build_leaderboard  # noqa: E402
from leaderboards.render import board_notes, column_name, format_cell, title  # noqa: E402

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
    folded = [f"{name} ({why})" for name, why in empty.items() if why]
    for n in [*notes, *(["not shown: " + "; ".join(folded)] if folded else [])]:
        if say is not None:
            say(n)
    figures: list[Path] = []
    intro = ("<p class='muted'>Each number is a test-split value at the layer chosen on validation (a table "
             "says so where its rows carry no validation numbers), with its 95% bootstrap interval; the last "
             "section says which data, versions and commands made them.</p>")
    intro += "".join(f"<p class='muted'>{html.escape(n)}</p>" for n in notes)
    if folded:
        intro += f"<p class='muted folded'>Not shown: {html.escape('; '.join(folded))}.</p>"
    sections = [intro]
    if binding:
        board = build_leaderboard(binding, task="binding")
        pngs = _binding_figures(binding, board, out)
        figures += pngs
        sections.append(_binding_section(board, pngs))
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
        _fit_png(fig, copy)
        figures.append(copy)
        sections.append(_analysis_section(analysis, copy, k))
    if all_rows:
        sections.append(_provenance_section(all_rows))
    page = _PAGE.format(
        title="BindingBench report",
        style=_STYLE,
        body="\n".join(sections),
        data=_script_json({"analyses": [_heatmap_data(a) for a, _ in loaded], "colormap": _colormap()}),
        script=_SCRIPT,
    )
    write_text_atomic(page, out)
    stale = remove_stale_outputs(out, [out, *figures], prefix=f"{out.stem}_")
    if stale and say is not None:
        say(f"removed {len(stale)} figure(s) the last report drew and this one does not: "
            + ", ".join(p.name for p in stale))
    return [out, *figures]


def _binding_figures(rows: list[dict[str, Any]], board: Leaderboard, out: Path) -> list[Path]:
    """β* by depth (when some backbone has layers to compare) and by probe family."""
    pngs = []
    if any(r["n_layers"] for r in rows):
        pngs.append(layer_curves(rows, out.with_name(f"{out.stem}_binding_layers"), task="binding")[0])
    pngs.append(probe_bars(board, out.with_name(f"{out.stem}_binding_bars"))[0])
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
        lead = ["" if row.rank is None else str(row.rank), *([row.dataset] if multi else []), row.label]
        body.append("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in lead)
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    thead = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    notes = "".join(f"<p class='footnote'>{html.escape(n)}</p>" for n in board_notes(board))
    return (
        "<section><h2>Binding: β* by backbone</h2>"
        f"<h3>{html.escape(title(board))}</h3>"
        f"<div class='scroll'><table><thead><tr>{thead}</tr></thead><tbody>{''.join(body)}</tbody></table></div>{notes}"
        + "".join(_img(p, "binding figure") for p in pngs) + "</section>"
    )


def _fit_png(src: Path, dst: Path) -> None:
    """Copy a figure, scaled down to MAX_PNG_WIDTH px where it is wider (an analysis drawn before
    figures were capped)."""
    from PIL import Image

    with Image.open(src) as im, replacing(dst) as tmp:
        if im.width <= MAX_PNG_WIDTH:
            shutil.copyfile(src, tmp)
            return
        im.resize((MAX_PNG_WIDTH, round(im.height * MAX_PNG_WIDTH / im.width)), Image.LANCZOS).save(tmp, format="PNG")


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
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _chosen_layers(rows: list[dict[str, Any]], metric: str) -> dict[tuple, tuple[int, str, list[dict]]]:
    """Per (dataset, backbone, probe): the layer whose validation metric (mean over seeds) is best,
    "validation", and its rows; "test" where the rows carry no validation numbers (older runs)."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get(metric) is not None:
            groups.setdefault((r["dataset"], r["backbone"], r["probe"]), {}).setdefault(r["layer"], []).append(r)
    chosen = {}
    for key, layers in groups.items():
        val = {layer: [x.get(f"val_{metric}") for x in rs] for layer, rs in layers.items()}
        on = "validation" if all(v is not None for vs in val.values() for v in vs) else "test"
        score = {layer: sum(x[f"val_{metric}"] if on == "validation" else x[metric] for x in rs) / len(rs)
                 for layer, rs in layers.items()}
        best = max(sorted(score), key=score.get)
        chosen[key] = (best, on, layers[best])
    return chosen


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r.get(key) for r in rows]
    return None if any(v is None for v in values) else sum(values) / len(values)


def _curves_section(rows: list[dict[str, Any]], pngs: list[Path], metric: str) -> str:
    """The curves figures and, per (backbone, probe), the layer chosen on validation with its test
    value, beside pixels under the same probe, the majority class and the attention correlation."""
    chosen = _chosen_layers(rows, metric)
    table = []
    for (dataset, backbone, probe), (layer, on, rs) in sorted(chosen.items()):
        value, lo, hi = _mean(rs, metric), _mean(rs, f"{metric}_lo"), _mean(rs, f"{metric}_hi")
        pixels = chosen.get((dataset, "pixels", probe)) if backbone != "pixels" else None
        r, p = _mean(rs, "attention_r"), _mean(rs, "attention_p")
        table.append((dataset, backbone, probe, layer if on == "validation" else f"{layer} (on test)",
                      _interval(value, lo, hi), None if pixels is None else _mean(pixels[2], metric),
                      _mean(rs, "majority_accuracy"),
                      None if r is None else f"{r:.2f} (p {p:.3f})" if p is not None else f"{r:.2f}"))
    errors = sum(r["status"] != "ok" for r in rows)
    note = f"<p class='muted'>{errors} failed row(s) not shown.</p>" if errors else ""
    any_test = any(on == "test" for _, on, _ in chosen.values())
    return (
        f"<section><h2>IsSameObject {html.escape(metric)} by layer</h2>"
        + "".join(_img(p, "accuracy curves") for p in pngs)
        + "<h3>Per backbone and probe: the layer chosen on validation, its test value</h3>"
        + _table(["dataset", "backbone", "probe", "layer", f"{metric} [95% interval]", "pixels, same probe",
                  "majority", "attention r (p)"], table)
        + "<p class='footnote'>pixels: the raw-patch baseline under the same probe on the same dataset (— where it "
          "was not run); majority: always answering the commoner class; attention r: Pearson r of the probe's "
          "pair scores with the model's own attention at that layer, with its permutation p-value."
        + (" A layer marked (on test) comes from rows without validation numbers: it is optimistic." if any_test else "")
        + "</p>" + note + "</section>"
    )


def _interval(value: float | None, lo: float | None, hi: float | None) -> str | None:
    if value is None:
        return None
    return f"{value:.3f}" + ("" if lo is None or hi is None else f" [{lo:.3f}, {hi:.3f}]")


def _provenance_section(rows: list[dict[str, Any]]) -> str:
    """Per dataset: fingerprint, sizes and priors; per run: when, versions, device, and its command."""
    datasets: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            datasets.setdefault((r["dataset"], r["dataset_fingerprint"]), []).append(r)
    card = []
    for (name, fp), rs in sorted(datasets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        binding = [r for r in rs if r["task"] == "binding"]
        first = binding[0] if binding else rs[0]
        card.append((name, (fp or "")[:12], ", ".join(sorted({r["task"] for r in rs})), first.get("n_train"),
                     first.get("n_test"), first.get("limit"), first.get("prior"), first.get("n_F_eff"),
                     _mean(binding, "H_F") if binding else None, _mean(binding, "H_O_given_F") if binding else None))
    runs: dict[str, dict] = {}
    for r in rows:
        runs.setdefault(r["run_id"], r)
    run_rows = []
    for run_id, r in sorted(runs.items()):
        try:
            versions = json.loads(r.get("package_versions") or "{}")
        except ValueError:
            versions = {}
        shown = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if k in _KEY_PACKAGES)
        run_rows.append((run_id, r.get("created_at"), f"bench {r.get('bench_version')}" + (f", {shown}" if shown else ""),
                         r.get("device"), r.get("command") or "(from Python)"))
    return (
        "<section><h2>Datasets and provenance</h2>"
        "<h3>Datasets (the fingerprint is the test split's; H(F), H(O|F): the test scenes' mean prior bits)</h3>"
        + _table(["dataset", "fingerprint", "tasks", "n_train", "n_test", "limit", "prior", "n_F_eff", "H(F)", "H(O|F)"],
                 card)
        + "<h3>Runs: versions, device and the command that made each</h3>"
        + _table(["run", "created (UTC)", "versions", "device", "command"], run_rows)
        + "</section>"
    )


#: Package versions the provenance table names (every row keeps all of them in `package_versions`).
_KEY_PACKAGES = ("torch", "transformers", "timm", "open_clip_torch", "numpy")


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
body { font-family: system-ui, sans-serif; font-size: 15px; margin: 2em auto; max-width: 1200px; padding: 0 1em;
       color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: .2em; }
img.figure { max-width: 100%; display: block; margin: 1em 0; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1.5em; }
th, td { border: 1px solid #ddd; padding: .2em .6em; text-align: right; }
th { background: #f4f4f4; }
.muted { color: #666; }
.folded { font-size: .9em; }
.scroll { max-width: 100%; overflow-x: auto; }
td:last-child code, td { overflow-wrap: anywhere; }
.footnote { color: #555; font-size: .85em; max-width: 70em; }
.heatmap { display: flex; gap: 1.5em; align-items: flex-start; flex-wrap: wrap; }
.heatmap canvas { border: 1px solid #999; cursor: crosshair; image-rendering: pixelated; }
.controls { font-size: .9em; min-width: 260px; }
.heatmap canvas { max-width: 100%; }
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
  if (PARAMS.has("measure")) {
    if (document.readyState === "complete") measure(); else window.addEventListener("load", measure);
  }
  document.body.dataset.ready = "1";
}

// ?measure: what a reader's window shows, written into the page for a headless browser's --dump-dom
function measure() {
  const px = (e) => parseFloat(getComputedStyle(e).fontSize);
  const text = [...document.querySelectorAll("p, td, th, li, label, h1, h2, h3")].filter((e) => e.textContent.trim());
  const out = {
    innerWidth: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    bodyFontPx: px(document.body),
    minTextPx: Math.min(...text.map(px)),
    images: [...document.images].map((i) => ({rendered: i.getBoundingClientRect().width, natural: i.naturalWidth})),
  };
  const pre = el("pre", {id: "measure"}, JSON.stringify(out));
  document.body.appendChild(pre);
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
