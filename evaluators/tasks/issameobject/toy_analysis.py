"""The identical-objects experiment (Li et al., NeurIPS 2025) on `toys` scenes.

Two identical red cars (A, B), a red car of another make (C) and a red boat (D): a
patch-pair probe trained per layer (on the toys' own training split, or on any other
dataset such as clevr) scores pairs of patches of held-out toy scenes, and the scores
are grouped by how the two patches' objects relate:

- same-instance: two patches of one object;
- identical-twin: car A vs car B (same make, same colour: only position tells them apart);
- same-make-different-colour: only with distractors;
- same-class-different-make: car A or B vs car C;
- different-class: a car vs the boat;
- object-vs-background: an object patch vs a ground/sky patch.

Background-background pairs are no relation between objects and are left out. If a
layer binds patches to *instances*, identical twins score low like any other pair of
distinct objects; if it only encodes *what* a patch shows, twins score like
same-instance pairs ("identical objects collapse").

The output is JSON-able (a table of per-layer, per-category score statistics, plus score
maps of a few scenes for the interactive report) and a figure: one panel per category,
layer on the x axis. Attention correlation is not computed: the extraction API exposes
no attention weights.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend first)
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402

from bench.core.dataset import Dataset, decode_image  # noqa: E402
from bench.core.errors import BenchError  # noqa: E402
from bench.core.hashing import derive_seed  # noqa: E402
from bench.core.labels import drawn_as_written  # noqa: E402
from evaluators.tasks.issameobject.evaluate import layer_data, maybe_progress  # noqa: E402
from evaluators.tasks.issameobject.pairs import PairConfig, Pairs, gather_tokens, sample_pairs  # noqa: E402
from evaluators.tasks.issameobject.scorers import PairTrainConfig, fit_scorer  # noqa: E402
from evaluators.tasks.issameobject.patch_labels import BACKGROUND, DEFAULT_MIN_SHARE, IGNORE, split_patch_labels  # noqa: E402
from evaluators.fitting import resolve_device  # noqa: E402

PAIR_CATEGORIES = (
    "same-instance", "identical-twin", "same-make-different-colour", "same-class-different-make",
    "different-class", "object-vs-background",
)
QUANTILES = (5, 25, 50, 75, 95)
ANALYSIS_NAME = "toy_analysis.json"
FIGURE_NAME = "toy_analysis.png"
TABLE_COLUMNS = ("layer", "category", "n", "mean_score", "frac_above_half")


def pair_category(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """How two objects relate (dicts with `id`, `category`, `identity`; None = background).

    None for two background patches. Classes: every category starting with "car" is a car.
    """
    if a is None and b is None:
        return None
    if a is None or b is None:
        return "object-vs-background"
    if a["id"] == b["id"]:
        return "same-instance"
    if a["identity"] == b["identity"]:
        return "identical-twin"
    if a["category"] == b["category"]:
        return "same-make-different-colour"
    if a["category"].startswith("car") and b["category"].startswith("car"):
        return "same-class-different-make"
    return "different-class"


def categorized_pairs(labels: np.ndarray, objects: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, category index into PAIR_CATEGORIES, -1 = none) of every valid patch pair i < j of one scene."""
    by_id = {int(o["id"]): o for o in objects}
    idx = np.flatnonzero(labels != IGNORE)
    present, code = np.unique(labels[idx], return_inverse=True)
    objs = [None if lab == BACKGROUND else by_id.get(int(lab)) for lab in present]
    for lab, o in zip(present, objs):
        if lab != BACKGROUND and o is None:
            raise BenchError(f"toys: mask id {lab} has no object record")
    table = np.array(
        [[_category_index(pair_category(a, b)) for b in objs] for a in objs], dtype=np.int64
    ).reshape(len(objs), len(objs))
    a, b = np.triu_indices(len(idx), k=1)
    return idx[a], idx[b], table[code[a], code[b]]


def _category_index(name: str | None) -> int:
    return -1 if name is None else PAIR_CATEGORIES.index(name)


def sample_categorized(
    labels: np.ndarray, objects: Sequence[Sequence[dict[str, Any]]], max_per_category: int, seed: int
) -> dict[str, np.ndarray]:
    """Up to `max_per_category` pairs of each category per scene: {image, i, j, category}."""
    rng = np.random.default_rng(seed)
    parts = []
    for n, (row, objs) in enumerate(zip(labels, objects)):
        i, j, cat = categorized_pairs(row, objs)
        for c in range(len(PAIR_CATEGORIES)):
            sel = np.flatnonzero(cat == c)
            if len(sel) > max_per_category:
                sel = np.sort(rng.choice(sel, max_per_category, replace=False))
            parts.append((np.full(len(sel), n), i[sel], j[sel], np.full(len(sel), c)))
    cols = [np.concatenate(p).astype(np.int64) for p in zip(*parts)] if parts else [np.zeros(0, np.int64)] * 4
    return dict(zip(("image", "i", "j", "category"), cols))


def category_stats(scores: np.ndarray, category: np.ndarray) -> list[dict[str, Any]]:
    """Per category: n, mean score, share above 0.5, quantiles (categories without pairs: n = 0)."""
    out = []
    for c, name in enumerate(PAIR_CATEGORIES):
        s = scores[category == c]
        row: dict[str, Any] = {"category": name, "n": int(len(s))}
        if len(s):
            row.update(mean_score=float(s.mean()), frac_above_half=float((s > 0.5).mean()))
            row.update({f"q{q:02d}": float(v) for q, v in zip(QUANTILES, np.percentile(s, QUANTILES))})
        out.append(row)
    return out


def check_toys(path: Path) -> None:
    """Refuse, before any extraction, a dataset that is not a `bench generate toys` set."""
    generator = Dataset(path).card.get("generator", {}).get("name")
    if generator != "toys":
        raise BenchError(f"dataset: {path} was made by the {generator!r} generator; toys-analysis needs "
                         "identical-object scenes from `bench generate toys`")


def run_toy_analysis(
    spec: str,
    toys: Path | Dataset,
    *,
    train_dataset: Path | Dataset | None = None,
    probe: str = "quadratic",
    layers: str | Sequence[int] = "all",
    split: str = "test",
    device: str = "auto",
    dtype: str = "fp32",
    epochs: int | None = None,
    limit: int | None = None,
    max_pairs_per_category: int = 200,
    heatmap_scenes: int = 3,
    min_share: float = DEFAULT_MIN_SHARE,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `probe` per layer on `train_dataset` (default: the toys' train/val splits) and
    score categorized pairs of the toys' `split`. Returns the JSON-able analysis."""
    from evaluators.cache.extract import extract_activations  # noqa: PLC0415 (the heavy stage, only here)

    _refuse_attention_qk(probe)
    toys_ds = toys if isinstance(toys, Dataset) else Dataset(toys)
    train_ds = toys_ds if train_dataset is None else (
        train_dataset if isinstance(train_dataset, Dataset) else Dataset(train_dataset))

    def acts(ds: Dataset, s: str):
        return extract_activations(spec, ds, s, layers=layers, token_choices=("all",), device=device, dtype=dtype,
                                   progress=progress, limit=limit)

    splits = {"train": acts(train_ds, "train"), "val": acts(train_ds, "val"), "toys": acts(toys_ds, split)}
    config = PairTrainConfig(seed=seed, device=resolve_device(device))
    if epochs is not None:
        config = replace(config, epochs=epochs)
    return analyse_activations(
        splits, train_ds, toys_ds, split, probe=probe, train_config=config, limit=limit,
        max_pairs_per_category=max_pairs_per_category, heatmap_scenes=heatmap_scenes, min_share=min_share,
        seed=seed, progress=progress,
    )


def _refuse_attention_qk(probe: str) -> None:
    if probe == "attention-qk":
        raise BenchError("probe: toys-analysis does not offer attention-qk (it needs the backbone's projection "
                         "weights); use `bench evaluate --task issameobject --probes attention-qk`")


def analyse_activations(
    acts: dict[str, Any],
    train_ds: Dataset,
    toys_ds: Dataset,
    split: str = "test",
    *,
    probe: str = "quadratic",
    train_config: PairTrainConfig = PairTrainConfig(),
    limit: int | None = None,
    max_pairs_per_category: int = 200,
    heatmap_scenes: int = 3,
    min_share: float = DEFAULT_MIN_SHARE,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """`run_toy_analysis` from activations {"train", "val", "toys"} (each with `.get(layer, "all")`)."""
    _refuse_attention_qk(probe)
    target = acts["toys"]
    grid = target.grid
    if grid is None:
        raise BenchError(f"toys: backbone {target.info.spec!r} has no spatial tokens")
    if any(a.grid != grid for a in acts.values()):
        raise BenchError("toys: the training dataset gives another patch grid than the toy scenes; use the same image size")
    pc = PairConfig(min_share=min_share)
    train_pairs = {
        s: sample_pairs(split_patch_labels(train_ds, s, grid, min_share, limit), pc, derive_seed(seed, "toys", s))
        for s in ("train", "val")
    }
    labels = split_patch_labels(toys_ds, split, grid, min_share, limit)
    table = toys_ds.table(split, ["scene_id", "objects", "image"])
    n = len(labels)
    objects = table["objects"].to_pylist()[:n]
    if not any("identity" in o for objs in objects for o in objs):
        raise BenchError(f"toys: dataset {toys_ds.name!r} has no per-object identity (generate it with `bench generate toys`)")
    pairs = sample_categorized(labels, objects, max_pairs_per_category, derive_seed(seed, "toys", "pairs"))
    shown = list(range(min(heatmap_scenes, n)))
    stats, accuracy, maps = [], {}, {k: {} for k in shown}
    with maybe_progress(progress, f"toys analysis {target.info.spec}", len(target.layers)) as bar:
        for layer in target.layers:
            data = {s: layer_data(_head(acts[s].get(layer, "all"), limit), train_pairs[s]) for s in ("train", "val")}
            scorer = fit_scorer(probe, data["train"], data["val"], train_config)
            u, ix, iy, same = data["val"]
            accuracy[str(layer)] = float(np.mean((scorer.score(u[ix], u[iy]) >= 0.5) == same)) if len(same) else None
            tokens = _head(acts["toys"].get(layer, "all"), limit)
            scores = _score_pairs(scorer, tokens, pairs)
            stats += [{"layer": int(layer), **r} for r in category_stats(scores, pairs["category"])]
            for k in shown:
                maps[k][str(layer)] = _encode_scores(_score_matrix(scorer, np.asarray(tokens[k], np.float32)))
            if bar:
                bar.advance(1)
    info = target.info
    return {
        "backbone": info.spec, "n_layers": int(info.n_layers), "layers": [int(x) for x in target.layers],
        "dataset": toys_ds.name, "split": split, "train_dataset": train_ds.name, "probe": probe,
        "grid": list(grid), "categories": list(PAIR_CATEGORIES), "min_share": min_share,
        "train_config": {k: v for k, v in asdict(train_config).items() if k != "device"},
        "probe_val_accuracy": accuracy, "stats": stats,
        "scenes": [
            {
                "scene_id": table["scene_id"][k].as_py(),
                "image_png": base64.b64encode(table["image"][k].as_py()["bytes"]).decode(),
                "labels": labels[k].tolist(),
                "scores": maps[k],  # layer -> base64 uint8 T x T, score * 255 rounded
            }
            for k in shown
        ],
    }


def _head(tokens: np.ndarray, limit: int | None) -> np.ndarray:
    return tokens if limit is None else tokens[:limit]


def _score_pairs(scorer, tokens: np.ndarray, pairs: dict[str, np.ndarray]) -> np.ndarray:
    p = Pairs(pairs["image"], pairs["i"], pairs["j"], np.zeros(len(pairs["i"]), bool))
    u, ix, iy = gather_tokens(tokens, p)
    return scorer.score(u[ix], u[iy]) if len(ix) else np.zeros(0)


def _score_matrix(scorer, tokens: np.ndarray) -> np.ndarray:
    """T x T scores of every patch pair of one scene (symmetric; the diagonal is a patch with itself)."""
    t = len(tokens)
    a, b = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    return scorer.score(tokens[a.ravel()], tokens[b.ravel()]).reshape(t, t)


def _encode_scores(m: np.ndarray) -> str:
    return base64.b64encode(np.round(np.clip(m, 0, 1) * 255).astype(np.uint8).tobytes()).decode()


def decode_scores(data: str, t: int) -> np.ndarray:
    """A stored T x T score map back as floats in [0, 1] (1/255 resolution)."""
    return np.frombuffer(base64.b64decode(data), np.uint8).reshape(t, t) / 255.0


def table_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary table: per layer and category with pairs, n, mean score, share above 0.5."""
    return [{c: r.get(c) for c in TABLE_COLUMNS} for r in analysis["stats"] if r["n"]]


@drawn_as_written
def plot_toy_analysis(analysis: dict[str, Any], out: str | os.PathLike) -> Path:
    """One panel per category with pairs: median score vs layer, 25-75 and 5-95 % bands, mean dashed."""
    cats = [c for c in analysis["categories"] if any(r["category"] == c and r["n"] for r in analysis["stats"])]
    if not cats:
        raise BenchError("toys: no categorized pairs to plot")
    n_cols = min(len(cats), 4)  # small multiples, four a row: the figure stays readable at 1280 px
    n_rows = -(-len(cats) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(2.8 * n_cols, 2.8 * n_rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(cats):]:
        ax.set_visible(False)
    for ax, cat in zip(axes.flat, cats):
        rows = sorted((r for r in analysis["stats"] if r["category"] == cat and r["n"]), key=lambda r: r["layer"])
        single = len(rows) == 1  # one layer (e.g. pixels): widen it into a box, so the bands stay visible
        x = [rows[0]["layer"] - 0.3, rows[0]["layer"] + 0.3] if single else [r["layer"] for r in rows]
        rows = rows * 2 if single else rows
        ax.fill_between(x, [r["q05"] for r in rows], [r["q95"] for r in rows], color="C0", alpha=0.15, lw=0, label="5–95 %")
        ax.fill_between(x, [r["q25"] for r in rows], [r["q75"] for r in rows], color="C0", alpha=0.35, lw=0, label="25–75 %")
        ax.plot(x, [r["q50"] for r in rows], color="C0", marker=None if single else "o", ms=3, label="median")
        ax.plot(x, [r["mean_score"] for r in rows], color="k", ls="--", lw=1, label="mean")
        if single:
            ax.set_xticks([rows[0]["layer"]])
            ax.set_xlim(rows[0]["layer"] - 1, rows[0]["layer"] + 1)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.axhline(0.5, color="gray", lw=0.8, ls=":")
        ax.set_title(cat, fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("P(same object)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=8)
    fig.suptitle(f"IsSameObject scores on {analysis['dataset']} — {analysis['backbone']}, "
                 f"{analysis['probe']} probe trained on {analysis['train_dataset']}", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    width = fig.get_tightbbox(fig.canvas.get_renderer()).width + 0.2  # inches, legend and padding included
    dpi = min(150.0, (MAX_FIGURE_WIDTH - 2) / width)
    for _ in range(4):  # the tight box moves a little with the dpi: checked after saving
        fig.savefig(out, dpi=dpi, bbox_inches="tight")
        with Image.open(out) as im:
            if im.width <= MAX_FIGURE_WIDTH:
                break
            dpi *= (MAX_FIGURE_WIDTH - 2) / im.width
    plt.close(fig)
    return out


#: The widest figure, in pixels (a laptop screen's width; the report's limit too).
MAX_FIGURE_WIDTH = 1280


def write_analysis(analysis: dict[str, Any], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """`toy_analysis.json` and `toy_analysis.png` in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ANALYSIS_NAME
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(analysis))
    os.replace(tmp, path)
    return path, plot_toy_analysis(analysis, out_dir / FIGURE_NAME)


def read_analysis(path: str | os.PathLike) -> dict[str, Any]:
    """A written analysis (a directory holding toy_analysis.json, or the file itself)."""
    p = Path(path)
    p = p / ANALYSIS_NAME if p.is_dir() else p
    if not p.exists():
        raise BenchError(f"toys: no {ANALYSIS_NAME} at {path} (run `bench toys-analysis` first)")
    return json.loads(p.read_text())


def scene_image(scene: dict[str, Any]) -> np.ndarray:
    """The RGB pixels of a stored heatmap scene."""
    return decode_image(base64.b64decode(scene["image_png"]))
