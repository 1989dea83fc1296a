"""ADE20K (the full release with per-image instance masks, e.g. ADE20K_2021_17_01).

Layout: `images/ADE/{training,validation}/<scene>/.../ADE_*.jpg`, beside each image its
`.json` annotation (`annotation.object[]` with `id`, `name`, `parts.part_level`,
`parts.hasparts`, `instance_mask`) and the folder of per-instance masks the JSON names
(`ADE_*/instance_NNN_ADE_*.png`). Whole objects (`part_level` 0) become instances; their
parts (the `hasparts` ids) are listed by name in `objects.parts`. Masks are painted far
to near by `depth_ordering_rank` (1 = nearest, painted last), so each pixel belongs to
the nearest object covering it.

The coding has one group, the object class (the `top_n` most frequent, the rest
"other"), so O = F: ADE20K is for IsSameObject (patch labels from the masks), and the
binding task refuses it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image, UnidentifiedImageError

from bench.codes import FeatureSpace
from bench.errors import BenchError
from generators.importers.common import (Source, SourceObject, SourceScene, instance_dtype, malformed, missing,
                                         read_rgb, top_values)

LAYOUT = ("ADE20K_2021_17_01/images/ADE/{training,validation}/<scene>/ADE_*.jpg with ADE_*.json and "
          "ADE_*/instance_NNN_ADE_*.png beside it")
SOURCE_SPLITS = ("training", "validation")
OTHER = "other"


def load(src: Path, top_n: int = 20, max_scenes: int | None = None) -> Source:
    if top_n < 1:
        raise BenchError(f"top-n: must be ≥ 1, got {top_n}")
    root = src / "images" / "ADE"
    if not root.is_dir():
        raise missing(root, LAYOUT)
    annotations = sorted((split, p) for split in SOURCE_SPLITS if (root / split).is_dir()
                         for p in (root / split).rglob("ADE_*.json"))
    if not annotations:
        raise missing(root / "training" / "<scene>" / "ADE_train_*.json", LAYOUT)
    annotations = annotations[:max_scenes] if max_scenes is not None else annotations
    parsed = [(split, path, _objects(path)) for split, path in annotations]
    counts = Counter(o["name"] for _, _, objs in parsed for o in objs)
    vocab = [n for n in top_values(counts, top_n) if n != OTHER]
    values = vocab + [OTHER] if len(counts) > len(vocab) else vocab
    space = FeatureSpace.of([("class", values)])
    scenes = []
    for split, path, objs in parsed:
        objects = [SourceObject((values.index(o["name"]) if o["name"] in vocab else values.index(OTHER),),
                                {"source_id": str(o["id"]), "name": o["name"], "parts": o["parts"]}) for o in objs]
        scenes.append(SourceScene(str(path.relative_to(root)), split, objects, _loader(objs, objects)))
    provenance = {
        "source": "ADE20K", "version": _version(src),
        "files_read": [f"images/ADE/{{training,validation}}/**: {len(scenes)} images with their .json and "
                       "instance_*.png masks"],
        "licence": "ADE20K annotations: BSD 3-clause (MIT CSAIL); images are for non-commercial research and "
                   "education only (see the release's terms of use)",
        "mask": "instance: the release's per-instance PNGs, painted far to near by depth_ordering_rank",
        "objects": f"class: top {top_n} object classes by instance count, the rest '{OTHER}'; parts listed per "
                   "object; one group, so O = F (no binding task)",
    }
    return Source("ade20k", space, scenes, provenance,
                  object_fields={"name": pa.string(), "parts": pa.list_(pa.string())})


def _version(src: Path) -> str:
    name = src.resolve().name
    return name.removeprefix("ADE20K_") if name.startswith("ADE20K_") else "unknown (not an ADE20K_<date> folder)"


def _objects(path: Path) -> list[dict[str, Any]]:
    """Whole objects of one annotation, nearest last, with their parts' names."""
    try:
        ann = json.loads(_text(path))["annotation"]
        objs = ann["object"]
        by_id = {int(o["id"]): o for o in objs}
        whole = [o for o in objs if int(o["parts"]["part_level"]) == 0]
        out = [{"id": int(o["id"]), "name": str(o["name"]), "mask": str(o["instance_mask"]),
                "rank": int(o.get("depth_ordering_rank", 0)),
                "parts": [str(by_id[int(p)]["name"]) for p in o["parts"].get("hasparts", []) if int(p) in by_id]}
               for o in whole]
        filename = str(ann["filename"])
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise malformed(path, f"not valid JSON ({type(e).__name__})", LAYOUT) from None
    except (KeyError, TypeError) as e:
        raise malformed(path, f"annotation lacks {e}", LAYOUT) from None
    if not out:
        raise malformed(path, "annotation.object has no whole object (part_level 0)", LAYOUT)
    for o in out:
        o["mask"] = path.parent / o["mask"]
    return [{**o, "image": path.parent / filename} for o in out]


def _text(path: Path) -> str:
    """A JSON file's text: UTF-8, else Latin-1, so a stray byte in an object name does not stop an import."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _loader(objs: list[dict[str, Any]], objects: list[SourceObject]):
    def pixels() -> tuple[np.ndarray, np.ndarray]:
        image = read_rgb(objs[0]["image"], LAYOUT)
        mask = np.zeros(image.shape[:2], dtype=instance_dtype(len(objs)))
        for i in sorted(range(len(objs)), key=lambda i: -objs[i]["rank"]):  # far to near
            sel = _instance(objs[i]["mask"], image.shape[:2])
            objects[i].fields["full_px"] = int(sel.sum())  # the whole instance, before nearer ones cover it
            mask[sel] = i + 1
        return image, mask

    return pixels


def _instance(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    if not path.is_file():
        raise missing(path, LAYOUT)
    try:
        with Image.open(path) as im:
            sel = np.asarray(im.convert("L")) > 0
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise malformed(path, f"not a readable mask ({type(e).__name__})", LAYOUT) from None
    if sel.shape != tuple(shape):
        raise malformed(path, f"mask is {sel.shape[1]}x{sel.shape[0]} but its image is {shape[1]}x{shape[0]}",
                        LAYOUT)
    return sel
