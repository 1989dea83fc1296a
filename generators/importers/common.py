"""What every importer shares: source records, F-disjoint splits, plug-in priors, atomic write.

An importer reads a local copy of a real-image dataset in its official layout and
returns `SourceScene` records (annotations parsed, pixels not yet read) plus the
feature space it chose. This module turns them into the same dataset format as
`bench generate` writes (docs/explanation/architecture.md §1): the F codes are ranked into train/val/test with
the generators' salted hash (`generators.splits.assign_splits`), so the splits are
disjoint in F whatever the source's own splits were; the priors are plug-in
estimates from each split's own codes and the card says so (`priors: empirical`).
Everything is written into a staging folder beside the output and swapped into place
when complete (`bench.core.outdir`), so a missing image or a bad mask halfway through leaves
nothing behind, and nothing the importer did not write is ever deleted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
from PIL import Image, UnidentifiedImageError

import bench
from bench.core.codes import FeatureSpace
from bench.core.dataset import (CARD_NAME, SCHEMA_VERSION, Scene, encode_scene, row_schema, shard_name, write_json_atomic,
                           write_parquet_atomic)
from bench.core.errors import BenchError
from bench.core.hashing import config_hash, fingerprint
from bench.core.outdir import DatasetTarget, check_target
from bench.core.resources import free_disk, gib, min_scene_bytes
from bench.core.versions import package_versions
from generators.splits import FCode, assign_splits

#: The card's `priors` value for imported data: plug-in estimates, never exact.
EMPIRICAL = "empirical"
SHARD_SIZE = 500

#: Pixels and instance mask of one scene, read when the scene is written.
Loader = Callable[[], tuple[np.ndarray, np.ndarray]]


@dataclass
class SourceObject:
    """One annotated object: its value index per feature group and source-specific fields."""

    values: tuple[int, ...]
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class SourceScene:
    """One source image: its key (stable id), the source's own split, objects, and a pixel loader.

    `load()` returns (H x W x 3 uint8 image, H x W instance ids with object i+1 = objects[i]).
    """

    key: str
    source_split: str
    objects: list[SourceObject]
    load: Loader


@dataclass
class Source:
    """A parsed source: scenes, feature space, and what the card says about where they came from."""

    name: str  # e.g. "clevr", "vg-color"
    space: FeatureSpace
    scenes: list[SourceScene]
    provenance: dict[str, Any]
    object_fields: dict[str, pa.DataType] = field(default_factory=dict)
    extra_card: dict[str, Any] = field(default_factory=dict)
    #: Source-specific numbers per split (e.g. CLEVR's generator-rule prior), shown by `bench info`.
    split_stats: Callable[[list[SourceScene]], dict[str, float]] | None = None


def missing(path: Path, layout: str) -> BenchError:
    """The one-line error for a file or folder a source's layout needs."""
    return BenchError(f"src: missing {path}; expected layout: {layout}")


def malformed(path: Path, what: str, layout: str) -> BenchError:
    return BenchError(f"src: {path}: {what}; expected layout: {layout}")


def read_rgb(path: Path, layout: str) -> np.ndarray:
    """An image file as H x W x 3 uint8; a missing or unreadable file is a one-line error."""
    if not path.is_file():
        raise missing(path, layout)
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise malformed(path, f"not a readable image ({type(e).__name__})", layout) from None


def instance_dtype(n_objects: int) -> type:
    return np.uint8 if n_objects < 256 else np.uint16


def box_mask(shape: tuple[int, int], boxes: Sequence[Sequence[int]]) -> np.ndarray:
    """Instance ids from boxes [x0, y0, x1, y1] (object i+1 = boxes[i]): larger boxes are
    painted first, so a small box lying on a large one keeps its pixels."""
    mask = np.zeros(shape, dtype=instance_dtype(len(boxes)))
    order = sorted(range(len(boxes)), key=lambda i: -(boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1]))
    for i in order:
        x0, y0, x1, y1 = boxes[i]
        mask[y0:y1, x0:x1] = i + 1
    return mask


def top_values(counts: Counter, n: int) -> list[str]:
    """The n most frequent names, ties broken alphabetically (so the vocabulary is stable)."""
    return [name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


# -- splits and priors ----------------------------------------------------------------------------


def f_code(space: FeatureSpace, objects: Sequence[SourceObject]) -> FCode:
    return tuple(tuple(sorted({o.values[g] for o in objects})) for g in range(len(space.sizes)))


def split_scenes(source: Source, split_seed: int, val_fraction: float, test_fraction: float
                 ) -> dict[str, list[SourceScene]]:
    """Scenes per split, disjoint in F: distinct F codes ranked by the generators' salted hash
    (not stratified: real F codes rarely fill the active-count strata the generators balance)."""
    codes = {s.key: f_code(source.space, s.objects) for s in source.scenes}
    salt = f"import:{source.name}:{split_seed}"
    assigned = assign_splits(sorted(set(codes.values())), val_fraction, test_fraction, salt, stratify=False)
    where = {code: split for split, cs in assigned.items() for code in cs}
    out: dict[str, list[SourceScene]] = {"train": [], "val": [], "test": []}
    for s in sorted(source.scenes, key=lambda s: s.key):
        out[where[codes[s.key]]].append(s)
    empty = [k for k, v in out.items() if not v]
    if empty:
        raise BenchError(f"src: {len(set(codes.values()))} distinct F codes among {len(source.scenes)} scenes are "
                         f"too few to fill split(s) {', '.join(empty)}; import more scenes or a smaller vocabulary")
    return out


def entropy_bits(counts: Sequence[int]) -> float:
    n = sum(counts)
    return max(0.0, -sum(c / n * math.log2(c / n) for c in counts if c))  # never -0.0


def plugin_priors(f_keys: Sequence[str], o_keys: Sequence[str]) -> tuple[dict[str, float], list[float]]:
    """Plug-in (empirical) priors of one split: H(F), H(O), H(O|F) = H(O) − H(F) (F is a
    function of O), n_F_eff = 1/Σp̂(f)², and per scene the plug-in H(O|F=f) of its own F code."""
    f_counts = Counter(f_keys)
    o_counts = Counter(o_keys)
    h_f, h_o = entropy_bits(list(f_counts.values())), entropy_bits(list(o_counts.values()))
    within: dict[str, Counter] = {}
    for f, o in zip(f_keys, o_keys):
        within.setdefault(f, Counter())[o] += 1
    per_f = {f: entropy_bits(list(c.values())) for f, c in within.items()}
    n = len(f_keys)
    info = {"n_F_codes": len(f_counts), "n_F_eff": n * n / sum(c * c for c in f_counts.values()),
            "H_F": h_f, "H_O": h_o, "H_O_given_F": max(h_o - h_f, 0.0),
            "max_F_mass": max(f_counts.values()) / n}
    return info, [per_f[f] for f in f_keys]


# -- writing ----------------------------------------------------------------------------------------


def write_import(source: Source, out: Path, *, split_seed: int, val_fraction: float, test_fraction: float,
                 config: dict[str, Any], overwrite: bool = False, sources: Sequence[Path] = (),
                 progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Write `source` as a dataset at `out`: built in a staging folder beside it and swapped in
    whole (`bench.core.outdir`), so a failure at any point leaves `out` as it was. `sources` are the
    folders read: `out` may neither hold nor lie inside one."""
    out = Path(out)
    check_target(out, overwrite, sources=sources, stage=True)
    splits = split_scenes(source, split_seed, val_fraction, test_fraction)
    where, free = free_disk(out)
    need = len(source.scenes) * min_scene_bytes(config["image_size"])
    if need > free:  # known only now that the source is read: still before anything is written
        raise BenchError(f"out: {len(source.scenes):,} scenes of {config['image_size']} px need at least {gib(need)} "
                         f"on disk, but {where} has {gib(free)} free (room for at most "
                         f"{free // min_scene_bytes(config['image_size']):,}); use --max-scenes or free space")
    target = DatasetTarget(out, config_hash(config), overwrite=overwrite, sources=sources, stage=True, resume=False)
    try:
        target.record([shard_name(split, k) for split, scenes in splits.items()
                       for k in range(math.ceil(len(scenes) / SHARD_SIZE))])
        card = _write_splits(source, splits, target.work, split_seed, config, progress)
        write_json_atomic(card, target.work / CARD_NAME)
        target.commit()
    except BaseException:
        target.discard()
        raise
    return card


def _write_splits(source: Source, splits: dict[str, list[SourceScene]], tmp: Path, split_seed: int,
                  config: dict[str, Any], progress: Callable[[int], None] | None) -> dict[str, Any]:
    space = source.space
    schema = row_schema({"source_id": pa.string(), **source.object_fields},
                        {"source_key": pa.string(), "source_split": pa.string()})
    card_splits = {}
    for split, scenes in splits.items():
        conjs = [[space.conj_id(o.values) for o in s.objects] for s in scenes]
        codes = [space.encode_o(c) for c in conjs]
        o_keys = ["".join(map(str, o)) for o in codes]
        f_keys = [space.f_key(space.o_to_f(o)) for o in codes]
        info, h_rows = plugin_priors(f_keys, o_keys)
        hashes, names, digests = [], [], {}
        for shard, start in enumerate(range(0, len(scenes), SHARD_SIZE)):
            rows = []
            for index in range(start, min(start + SHARD_SIZE, len(scenes))):
                rows.append(_row(scenes[index], conjs[index], space, split, index, split_seed, h_rows[index],
                                 config["image_size"]))
                if progress:
                    progress(1)
            write_parquet_atomic(pa.Table.from_pylist(rows, schema=schema), tmp / shard_name(split, shard))
            hashes += [r["content_hash"] for r in rows]
            names.append(shard_name(split, shard))
            digests[names[-1]] = fingerprint(r["content_hash"] for r in rows)
        card_splits[split] = {"n": len(scenes), **info, "fingerprint": fingerprint(hashes), "shards": names,
                              "shard_digests": digests,
                              "source_splits": dict(sorted(Counter(s.source_split for s in scenes).items()))}
        if source.split_stats:
            card_splits[split].update(source.split_stats(scenes))
    return {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": f"import:{source.name}", "version": 1},
        "config": config,
        "seed": split_seed,
        "priors": EMPIRICAL,
        "feature_space": space.to_dict(),
        "splits": card_splits,
        "provenance": {**source.provenance, "resized": f"every image and mask to {config['image_size']}x"
                       f"{config['image_size']} (aspect not kept; masks nearest-neighbour)"},
        **source.extra_card,
        "bench_version": bench.__version__,
        "package_versions": package_versions(),
    }


def _row(scene: SourceScene, conjs: list[int], space: FeatureSpace, split: str, index: int, seed: int,
         h: float, size: int) -> dict[str, Any]:
    image, mask = scene.load()
    (sy, sx), image, mask = squared(image, mask, size)
    objects = []
    for i, (obj, conj) in enumerate(zip(scene.objects, conjs), start=1):
        sel = mask == i
        visible = int(sel.sum())
        fields = dict(obj.fields)
        # the source's full size, scaled (pixel rounding can leave it a row below the visible count)
        full = max(round(fields.pop("full_px") * sx * sy), visible) if "full_px" in fields else visible
        box = fields.pop("bbox", None)
        bbox = [round(box[0] * sx), round(box[1] * sy), round(box[2] * sx), round(box[3] * sy)] if box else _bbox(sel)
        objects.append({"id": i, "conj": conj, "bbox": bbox, "visible_px": visible, "full_px": full,
                        "visibility": visible / full if full else 0.0, **fields})
    extras = {"source_key": scene.key, "source_split": scene.source_split}
    return encode_scene(Scene(image, mask, objects, extras), space=space, split=split, index=index, seed=seed,
                        h_o_given_f=h)


def squared(image: np.ndarray, mask: np.ndarray, size: int) -> tuple[tuple[float, float], np.ndarray, np.ndarray]:
    """((y, x) scale, image, mask) resized to size x size: image Lanczos, mask nearest.

    Datasets are square (evaluators take a split's side from its first image) and every
    backbone squashes its input to a square anyway, so the aspect ratio is not kept.
    """
    h, w = image.shape[:2]
    if (h, w) == (size, size):
        return (1.0, 1.0), image, mask
    image = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.LANCZOS))
    mask = np.asarray(Image.fromarray(mask).resize((size, size), Image.Resampling.NEAREST))
    return (size / h, size / w), image, mask


def _bbox(sel: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(sel)
    if len(xs) == 0:
        return [0, 0, 0, 0]
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]
