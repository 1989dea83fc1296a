"""What the HTML views show, built from the board: the Jinja2 environment (templates shipped in
`leaderboards/templates`, autoescaped) and the plain data each template section reads.

`bench report` (one self-contained page) and `bench site` (a folder of pages) render the same
templates with the same data: a board is one table of (backbone, probe family, tokens choice) rows,
sortable by any column and filterable by family and tokens choice in the page, each row carrying
the board's cell (value, interval, the layer chosen on validation, sensitivity, marks) and the
row's label (a control or a published row says what it is). Nothing here computes a number the
board does not: cells, layers and ranks are the board's."""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import jinja2

from bench.core.numbers import fixed
from bench.core.tasks import TASKS
from leaderboards.board import Cell, Leaderboard
from leaderboards.render import board_notes, cell_marks, scale_digits, title

#: Package versions the provenance table names (every row keeps all of them in `package_versions`).
KEY_PACKAGES = ("torch", "transformers", "timm", "open_clip_torch", "numpy")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """Templates from the package, every `{{ value }}` escaped (HTML, CSS and scripts are files of
    their own; data reaches a script only as JSON through `script_json`)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("leaderboards", "templates"),
                             autoescape=jinja2.select_autoescape(["html"], default_for_string=True),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["num"] = _num
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    return fixed(v, digits) if isinstance(v, float) else str(v)


def data_uri(path: Path) -> str:
    """A PNG inline, so a single page needs no file beside it."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def script_json(obj: Any) -> str:
    """JSON safe inside <script>: no `</` can close the element early."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def row_kind(row: Any) -> str:
    unranked = row.control is not None or row.reads_ground_truth  # shown beside the ranked rows, never ranked
    return "published" if row.reference is not None else "control" if unranked else "measured"


def board_view(board: Leaderboard, *, anchor: str = "board") -> dict[str, Any]:
    """A board as one sortable table: a line per (row, column) cell that exists (run, error or
    incomplete), in the board's order (ranked rows first), with the row's rank and label."""
    m = board.metric
    scale, digits = scale_digits(m)
    lines = []
    for row in board.rows:
        kind = row_kind(row)
        for col, c in row.cells.items():
            if c is None:
                continue
            lines.append({
                "kind": kind, "rank": row.rank, "label": row.label, "backbone": row.backbone,
                "dataset": row.dataset, "probe": col[0], "tokens": col[1], "status": c.status,
                "value": c.value if c.status == "ok" else None,
                "text": fixed(c.value * scale, digits) if c.status == "ok" else c.status,
                "half": None if c.half_width is None else fixed(c.half_width * scale, digits),
                "lo": c.lo, "hi": c.hi,
                "layer": c.layer if c.n_layers else None, "chosen_on": c.chosen_on,
                "sensitivity": c.sensitivity,
                "sensitivity_text": None if c.sensitivity is None else f"{fixed(c.sensitivity * 100, 0)}%",
                "marks": " ".join(cell_marks(c, m)) if c.status == "ok" else "",
                "score": row.score is c,
                "note": _cell_note(c, row),
            })
    return {"anchor": anchor, "title": title(board), "metric": m.label, "unit": m.unit,
            "lines": lines, "notes": board_notes(board), "probes": sorted({x["probe"] for x in lines}),
            "tokens": sorted({x["tokens"] for x in lines}), "multi": len(board.datasets) > 1}


def _cell_note(c: Cell, row: Any) -> str:
    if row.reference is not None:
        return row.reference.source
    if c.status == "error":
        return f"error: {c.error}" if c.error else "error"
    if c.status == "incomplete":
        return "incomplete: not every seed of this column finished"
    return "; ".join(c.checks)


def issameobject_view(board: Leaderboard) -> list[dict[str, Any]]:
    """Per (backbone, probe column) of an IsSameObject board: the board's layer and test value, beside
    pixels under the same probe on the same dataset, the majority class and the attention
    correlation at that layer (read from the rows the cell averages)."""
    pixels = {(r.dataset, col): c for r in board.rows if r.backbone == "pixels" and r.control is None
              and r.reference is None for col, c in r.cells.items() if c is not None and c.status == "ok"}
    multi_tokens = len({col[1] for col in board.columns}) > 1
    out = []
    for row in board.rows:
        if row.reference is not None:
            continue
        for col, c in row.cells.items():
            if c is None or c.status != "ok":
                continue
            px = pixels.get((row.dataset, col)) if row.backbone != "pixels" else None
            r, p = _mean(c.rows, "attention_r"), _mean(c.rows, "attention_p")
            out.append({
                "dataset": row.dataset, "label": row.label,
                "probe": f"{col[0]} / {col[1]}" if multi_tokens else col[0],
                "layer": c.layer, "on_test": c.chosen_on == "test",
                "interval": f"{c.value:.3f}" + ("" if c.lo is None or c.hi is None else f" [{c.lo:.3f}, {c.hi:.3f}]"),
                "pixels": None if px is None else px.value, "majority": _mean(c.rows, "majority_accuracy"),
                "attention": None if r is None else f"{r:.2f} (p {p:.3f})" if p is not None else f"{r:.2f}",
            })
    return sorted(out, key=lambda x: (x["dataset"], x["label"], x["probe"]))


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r.get(key) for r in rows]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def dataset_cards(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset shown: its fingerprint, tasks, sizes, prior kind, n_F_eff and the test scenes'
    mean prior bits H(F), H(O|F) (from its binding rows)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault(r["dataset"], []).append(r)
    cards = []
    for name, rs in sorted(groups.items()):
        binding = [r for r in rs if TASKS.get(r["task"]).needs_codes]  # rows of a task that read the priors
        first = binding[0] if binding else rs[0]
        cards.append({"dataset": name, "fingerprint": first["dataset_fingerprint"] or "",
                      "tasks": ", ".join(sorted({r["task"] for r in rs})), "n_train": first.get("n_train"),
                      "n_test": first.get("n_test"), "limit": first.get("limit"), "prior": first.get("prior"),
                      "n_F_eff": first.get("n_F_eff"), "H_F": _mean(binding, "H_F"),
                      "H_O_given_F": _mean(binding, "H_O_given_F"), "H_O": _mean(binding, "H_O")})
    return cards


def runs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: when, the key package versions, the device and the command that made it."""
    first: dict[str, dict] = {}
    for r in rows:
        first.setdefault(r["run_id"], r)
    out = []
    for run_id, r in sorted(first.items()):
        try:
            versions = json.loads(r.get("package_versions") or "{}")
        except ValueError:
            versions = {}
        shown = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if k in KEY_PACKAGES)
        out.append({"run": run_id, "created": r.get("created_at"),
                    "versions": f"bench {r.get('bench_version')}" + (f", {shown}" if shown else ""),
                    "device": r.get("device"), "command": r.get("command") or "(from Python)"})
    return out


def provenance(rows: Sequence[dict[str, Any]]) -> dict[str, list[list[Any]]]:
    """The provenance tables' rows: per dataset its card, per run its versions, device and command."""
    cards = [[c["dataset"], c["fingerprint"][:12], c["tasks"], c["n_train"], c["n_test"], c["limit"], c["prior"],
              c["n_F_eff"], c["H_F"], c["H_O_given_F"]] for c in dataset_cards(rows)]
    return {"cards": cards, "runs": [[r["run"], r["created"], r["versions"], r["device"], r["command"]]
                                     for r in runs(rows)]}


def analysis_view(a: dict[str, Any], k: int, image: str) -> dict[str, Any]:
    """A toy analysis (`bench toys-analysis`): its figure, its table of mean scores per layer and
    pair category, and the heatmap the page draws from `heatmap_data`."""
    cats = [c for c in a["categories"] if any(r["category"] == c and r["n"] for r in a["stats"])]
    cells = {(r["layer"], r["category"]): r for r in a["stats"] if r["n"]}
    table = [[layer] + [f"{cells[(layer, c)]['mean_score']:.2f} ({cells[(layer, c)]['frac_above_half']:.0%})"
                        if (layer, c) in cells else None for c in cats] for layer in a["layers"]]
    return {"title": f"{a['backbone']} on {a['dataset']} ({a['probe']} probe trained on {a['train_dataset']})",
            "image": image, "columns": ["layer", *cats], "table": table, "index": k}


def heatmap_data(a: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": f"{a['backbone']} — {a['dataset']}",
        "layers": a["layers"],
        "grid": a["grid"],
        "scenes": [{"id": s["scene_id"], "image": s["image_png"], "labels": s["labels"], "scores": s["scores"]}
                   for s in a["scenes"]],
    }


def colormap() -> list[list[int]]:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [[round(255 * c) for c in cmap(i / 255)[:3]] for i in range(256)]
