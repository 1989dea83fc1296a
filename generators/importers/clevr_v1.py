"""CLEVR v1.0 from its release layout: `scenes/CLEVR_<split>_scenes.json` + `images/<split>/`.

Each object is one conjunction of size x colour x material x shape, with CLEVR's own
vocabularies (its generator's `properties.json`). O is a set, so two identical objects
in one scene are one conjunction. CLEVR v1.0 ships no instance masks: `mask` holds
discs centred on each object's `pixel_coords`, radius from its size and depth, painted
far to near — approximate, and the card says so.

CLEVR's generator (clevr-dataset-gen `render_images.py`, `data/properties.json`) also
fixes an analytic prior (`clevr_rules`): a count drawn uniformly from 3–10 per image,
each object's size, shape, colour and material drawn uniformly and independently,
duplicates allowed. Under those rules H(O), H(F) and H(O|F=f) are exact sums (below).
The count stays exact for the released scenes (retries keep it), the properties do not:
when an object cannot be placed (minimum distance, margins) or some object shows fewer
than 200 pixels, the renderer deletes every object and draws them all again, so the
accepted scenes favour property combinations that place and show easily. The headline
therefore stays the empirical reference probe.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.core.codes import FeatureSpace
from generators.importers.common import Source, SourceObject, SourceScene, malformed, missing, read_rgb
from generators.priors import coverage_count

LAYOUT = "CLEVR_v1.0/{scenes/CLEVR_<split>_scenes.json, images/<split>/CLEVR_<split>_NNNNNN.png}"
#: CLEVR's vocabularies (clevr-dataset-gen image_generation/data/properties.json), group order as coded here.
GROUPS = (
    ("size", ("large", "small")),
    ("color", ("gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow")),
    ("material", ("rubber", "metal")),
    ("shape", ("cube", "sphere", "cylinder")),
)
#: Object radius in Blender units per size (properties.json) and the camera's focal length in
#: pixels at 480 px width (35 mm lens on a 32 mm sensor): disc radius ≈ r · f / depth.
SIZE_RADIUS = {"large": 0.7, "small": 0.35}
FOCAL_PX_PER_WIDTH = 35.0 / 32.0
MIN_OBJECTS, MAX_OBJECTS = 3, 10
SOURCE_SPLITS = ("train", "val")


def load(src: Path, max_scenes: int | None = None) -> Source:
    """Parse every `scenes/CLEVR_<split>_scenes.json` present (train, val; test has none)."""
    space = FeatureSpace.of(GROUPS)
    files = [src / "scenes" / f"CLEVR_{s}_scenes.json" for s in SOURCE_SPLITS]
    present = [f for f in files if f.is_file()]
    if not present:
        raise missing(files[0], LAYOUT)
    scenes, version = [], None
    for path in present:
        split = path.stem.split("_")[1]
        data = _json(path)
        info = data.get("info", {}) if isinstance(data, dict) else {}
        version = version or info.get("version")
        records = data.get("scenes") if isinstance(data, dict) else None
        if not isinstance(records, list):
            raise malformed(path, "no 'scenes' list", LAYOUT)
        for rec in records:
            scenes.append(_scene(src, split, rec, space, path))
    scenes.sort(key=lambda s: s.key)
    scenes = scenes[:max_scenes]
    provenance = {
        "source": "CLEVR", "version": str(version or "1.0"),
        "files_read": [str(p.relative_to(src)) for p in present] + [f"images/<split>/: {len(scenes)} PNG files"],
        "licence": "CLEVR v1.0 is released under CC BY 4.0 (cite Johnson et al., CVPR 2017)",
        "mask": "approximate: discs at each object's pixel_coords (CLEVR v1.0 has no instance masks)",
        "objects": "size x color x material x shape; identical objects in a scene are one conjunction",
    }
    return Source("clevr", space, scenes, provenance,
                  object_fields={"pixel_coords": pa.list_(pa.float64())},
                  extra_card={"clevr_rules": clevr_rules()}, split_stats=rules_per_split)


def rules_per_split(scenes: list[SourceScene]) -> dict[str, float]:
    """Mean H(O|F=f) under CLEVR's rules over a split's scenes: what the split's F codes leave
    to binding if the scenes had followed the rules exactly (H(O|F=f) depends on f only
    through its active counts)."""
    n_groups = len(GROUPS)
    h = [rules_given_f(tuple(len({o.values[g] for o in s.objects}) for g in range(n_groups)))[1] for s in scenes]
    return {"H_O_given_F_rules": sum(h) / len(h)}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise malformed(path, f"not valid JSON ({type(e).__name__})", LAYOUT) from None


def _scene(src: Path, split: str, rec: Any, space: FeatureSpace, path: Path) -> SourceScene:
    if not isinstance(rec, dict) or not isinstance(rec.get("image_filename"), str) \
            or not isinstance(rec.get("objects"), list) or not rec["objects"]:
        raise malformed(path, "a scene lacks 'image_filename' or a non-empty 'objects' list", LAYOUT)
    objects = []
    for obj in rec["objects"]:
        try:
            values = tuple(space.value_index(g, obj[g]) for g in space.names)
            x, y, depth = (float(v) for v in obj["pixel_coords"])
        except (KeyError, TypeError, ValueError) as e:
            raise malformed(path, f"{rec['image_filename']}: an object lacks a valid {e}", LAYOUT) from None
        objects.append(SourceObject(values, {"source_id": str(len(objects)), "pixel_coords": [x, y, depth]}))
    image_path = src / "images" / split / rec["image_filename"]
    sizes = [GROUPS[0][1][o.values[0]] for o in objects]
    return SourceScene(rec["image_filename"], split, objects,
                       lambda: _pixels(image_path, objects, sizes))


def _pixels(image_path: Path, objects: list[SourceObject], sizes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    image = read_rgb(image_path, LAYOUT)
    h, w = image.shape[:2]
    focal = FOCAL_PX_PER_WIDTH * w
    yy, xx = np.mgrid[0:h, 0:w]
    mask = np.zeros((h, w), dtype=np.uint8)
    order = sorted(range(len(objects)), key=lambda i: -objects[i].fields["pixel_coords"][2])  # far to near
    for i in order:
        x, y, depth = objects[i].fields["pixel_coords"]
        r = SIZE_RADIUS[sizes[i]] * focal / max(depth, 1e-3)
        mask[(xx - x) ** 2 + (yy - y) ** 2 <= r * r] = i + 1
    return image, mask


# -- the analytic prior under CLEVR's generator rules -------------------------------------------------


@lru_cache(maxsize=None)
def _set_probability(k: int) -> Fraction:
    """P(O = S) for one particular set S of k conjunctions: n ~ U{3..10} draws, each uniform
    over the 96 conjunctions, cover exactly S (k! S(n, k) surjections of n draws onto S)."""
    cells = math.prod(len(v) for _, v in GROUPS)
    n_counts = MAX_OBJECTS - MIN_OBJECTS + 1
    return sum((Fraction(_surjections(n, k), cells ** n) for n in range(MIN_OBJECTS, MAX_OBJECTS + 1)),
               Fraction(0)) / n_counts


@lru_cache(maxsize=None)
def _surjections(n: int, k: int) -> int:
    return sum((-1) ** j * math.comb(k, j) * (k - j) ** n for j in range(k + 1))


def _h(p: Fraction) -> float:
    return -float(p) * math.log2(float(p)) if p else 0.0


def rules_given_f(active: tuple[int, ...]) -> tuple[float, float]:
    """(P(F = f), H(O | F = f)) under CLEVR's rules, for an F code with these active counts."""
    p_sets = [(coverage_count(k, active), _set_probability(k)) for k in range(1, MAX_OBJECTS + 1)]
    p_f = sum((n * p for n, p in p_sets), Fraction(0))
    if not p_f:
        return 0.0, 0.0
    h = sum(n * _h(p / p_f) for n, p in p_sets if n)
    return float(p_f), h


@lru_cache(maxsize=1)
def clevr_rules() -> dict[str, Any]:
    """H(O), H(F), H(O|F) in bits of CLEVR's generator rules, exact for those rules."""
    sizes = [len(v) for _, v in GROUPS]
    cells = math.prod(sizes)
    h_o = sum(math.comb(cells, k) * _h(_set_probability(k)) for k in range(1, MAX_OBJECTS + 1))
    h_f = 0.0
    for active in np.ndindex(*sizes):
        a = tuple(int(x) + 1 for x in active)
        p_f, _ = rules_given_f(a)
        h_f += math.prod(math.comb(s, x) for s, x in zip(sizes, a)) * _h(Fraction(p_f))
    return {
        "H_O": h_o, "H_F": h_f, "H_O_given_F": h_o - h_f,
        "exact_for": "CLEVR's sampling rules: 3-10 objects (count uniform), size, colour, material and shape "
                     "each uniform and independent, duplicates allowed, O a set",
        "not_exact_for": "the released scenes' properties: the renderer re-draws every object of a scene it cannot "
                         "place (min distance, margins) or where an object shows < 200 pixels, so accepted scenes "
                         "are not uniform in properties (the count is); the headline B* uses the empirical "
                         "reference probe instead",
    }
