"""Visual Genome v1.2 from its release layout: `image_data.json`, `objects.json`,
`attributes.json` and the images in `VG_100K/` and `VG_100K_2/` (`<image_id>.jpg`).

Two codings, as in "Formalizing the Binding Problem":
- `vg-color`: groups (color, name). Colours are the basic colour terms below; the
  vocabulary is the `top_n` most frequent colours and the `top_n` most frequent names of
  coloured objects (ties alphabetical).
- `vg-topattr`: groups (attribute, name), with the `top_n` most frequent attributes.
An object enters when its first name is in the name vocabulary and one of its attributes
is in the attribute vocabulary; it takes the most frequent of those. Other objects are
left out (of `objects` and of the mask); images left with none are skipped. Masks are
the objects' boxes, smaller boxes painted over larger ones (the card says so). A box that
reaches past the image's edge is clipped to it (the release has many a pixel too wide); one
with no pixel inside the image is refused, naming the file, the image and the object.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError
from generators.importers.common import (Source, SourceObject, SourceScene, box_mask, malformed, missing, read_rgb,
                                         top_values)

LAYOUT = "VG/{image_data.json, objects.json, attributes.json, VG_100K/<image_id>.jpg, VG_100K_2/<image_id>.jpg}"
CODINGS = ("vg-color", "vg-topattr")
#: Basic colour terms (Berlin & Kay's eleven plus the frequent VG synonyms and metals).
COLORS = frozenset({"white", "black", "blue", "green", "red", "brown", "yellow", "gray", "grey", "orange", "pink",
                    "purple", "silver", "gold", "tan", "beige"})
IMAGE_DIRS = ("VG_100K", "VG_100K_2")


def load(src: Path, coding: str = "vg-color", top_n: int = 10, max_scenes: int | None = None) -> Source:
    if coding not in CODINGS:
        raise BenchError(f"coding: unknown {coding!r}; allowed: {', '.join(CODINGS)}")
    if top_n < 1:
        raise BenchError(f"top-n: must be ≥ 1, got {top_n}")
    files = {name: src / f"{name}.json" for name in ("image_data", "objects", "attributes")}
    for path in files.values():
        if not path.is_file():
            raise missing(path, LAYOUT)
    images = {_image_id(r, files["image_data"]): r for r in _records(files["image_data"])}
    attrs: dict[int, list[str]] = {}
    for rec in _records(files["attributes"]):
        for a in _list(rec, "attributes", files["attributes"]):
            if "object_id" not in a:
                raise malformed(files["attributes"], "an attribute record lacks 'object_id'", LAYOUT)
            attrs[a["object_id"]] = [str(x).strip().lower() for x in a.get("attributes") or []]
    per_image: list[tuple[int, list[dict[str, Any]]]] = []
    for rec in _records(files["objects"]):
        iid = _image_id(rec, files["objects"])
        objs = []
        for o in _list(rec, "objects", files["objects"]):
            try:
                box = [int(o["x"]), int(o["y"]), int(o["x"]) + int(o["w"]), int(o["y"]) + int(o["h"])]
                name = str(o["names"][0] if "names" in o else o["name"]).strip().lower()  # v1.0: "name"
            except (KeyError, IndexError, TypeError, ValueError):
                raise malformed(files["objects"], f"image {iid}: an object lacks x, y, w, h or names", LAYOUT) from None
            kept = [a for a in attrs.get(o.get("object_id"), []) if coding == "vg-topattr" or a in COLORS]
            objs.append({"object_id": o.get("object_id"), "name": name, "box": box, "attrs": kept})
        per_image.append((iid, objs))
    attr_counts = Counter(a for _, objs in per_image for o in objs for a in o["attrs"])
    name_counts = Counter(o["name"] for _, objs in per_image for o in objs if o["attrs"])
    attr_vocab, name_vocab = top_values(attr_counts, top_n), top_values(name_counts, top_n)
    if not attr_vocab or not name_vocab:
        what = "a colour attribute" if coding == "vg-color" else "an attribute"
        raise malformed(files["attributes"], f"no object has {what}", LAYOUT)
    group = "color" if coding == "vg-color" else "attribute"
    space = FeatureSpace.of([(group, attr_vocab), ("name", name_vocab)])
    scenes = []
    for iid, objs in sorted(per_image, key=lambda t: t[0]):
        chosen = []
        for o in objs:
            ranks = sorted(attr_vocab.index(a) for a in o["attrs"] if a in attr_vocab)
            if ranks and o["name"] in name_vocab:
                chosen.append(SourceObject((ranks[0], name_vocab.index(o["name"])),
                                           {"source_id": str(o["object_id"]), "box": o["box"]}))
        if chosen:
            if iid not in images:
                raise malformed(files["image_data"], f"no record for image_id {iid}", LAYOUT)
            scenes.append(_scene(src, iid, images[iid], chosen))
        if max_scenes is not None and len(scenes) >= max_scenes:
            break
    provenance = {
        "source": "Visual Genome", "version": "1.2",
        "files_read": ["image_data.json", "objects.json", "attributes.json",
                       f"VG_100K*/: {len(scenes)} JPEG files"],
        "licence": "Visual Genome is released under CC BY 4.0 (cite Krishna et al., IJCV 2017); images keep "
                   "their Flickr/COCO terms",
        "mask": "boxes: each object's box, smaller boxes painted over larger ones (not instance masks); a box "
                "reaching past the image's edge is clipped to it",
        "objects": f"{coding}: {group} x name, top {top_n} of each; an object takes its most frequent "
                   f"{group} in the vocabulary; objects outside the vocabulary are left out",
    }
    return Source(coding, space, scenes, provenance)


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise malformed(path, f"not valid JSON ({type(e).__name__})", LAYOUT) from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise malformed(path, "expected a JSON list of per-image records", LAYOUT)
    return data


def _image_id(rec: dict[str, Any], path: Path) -> int:
    value = rec.get("image_id", rec.get("id"))
    if not isinstance(value, int):
        raise malformed(path, "a record lacks an integer 'image_id'", LAYOUT)
    return value


def _list(rec: dict[str, Any], key: str, path: Path) -> list[dict[str, Any]]:
    value = rec.get(key)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise malformed(path, f"image {rec.get('image_id', rec.get('id'))}: no '{key}' list of records", LAYOUT)
    return value


def _image_path(src: Path, iid: int, meta: dict[str, Any]) -> Path:
    """The image's folder named in its url (`.../VG_100K_2/1.jpg`), else whichever holds it."""
    url = str(meta.get("url", ""))
    for folder in IMAGE_DIRS[::-1]:
        if f"/{folder}/" in url:
            return src / folder / f"{iid}.jpg"
    for folder in IMAGE_DIRS:
        if (src / folder / f"{iid}.jpg").is_file():
            return src / folder / f"{iid}.jpg"
    return src / IMAGE_DIRS[0] / f"{iid}.jpg"


def _check_boxes(objects_file: Path, iid: int, objects: list[SourceObject], boxes: list[list[int]], w: int,
                 h: int) -> None:
    """Refuse a box with no pixel inside its `w` x `h` image (empty, or wholly outside it): its
    object would enter O with nothing to see. A box reaching past an edge is kept, clipped to the
    image: the release has many a pixel or two too wide."""
    for obj, (x0, y0, x1, y1) in zip(objects, boxes):
        if not (x0 < x1 and y0 < y1 and x0 < w and y0 < h and x1 > 0 and y1 > 0):
            raise malformed(objects_file, f"image {iid}: object {obj.fields['source_id']} has box x={x0}, y={y0}, "
                            f"w={x1 - x0}, h={y1 - y0}, with no pixel inside the {w}x{h} image", LAYOUT)


def _scene(src: Path, iid: int, meta: dict[str, Any], objects: list[SourceObject]) -> SourceScene:
    path = _image_path(src, iid, meta)
    boxes = [o.fields.pop("box") for o in objects]
    objects_file = src / "objects.json"
    if isinstance(meta.get("width"), int) and isinstance(meta.get("height"), int):  # checked before any write
        _check_boxes(objects_file, iid, objects, boxes, meta["width"], meta["height"])

    def pixels() -> tuple[np.ndarray, np.ndarray]:
        image = read_rgb(path, LAYOUT)
        h, w = image.shape[:2]
        if (meta.get("width"), meta.get("height")) not in ((w, h), (None, None)):
            raise malformed(path, f"is {w}x{h} but image_data.json says {meta.get('width')}x{meta.get('height')}",
                            LAYOUT)
        _check_boxes(objects_file, iid, objects, boxes, w, h)
        clipped = [[min(max(v, 0), lim) for v, lim in zip(b, (w, h, w, h))] for b in boxes]
        for o, b in zip(objects, clipped):  # the row's bbox and full size are the clipped box's
            o.fields.update(bbox=b, full_px=(b[2] - b[0]) * (b[3] - b[1]))
        return image, box_mask((h, w), clipped)

    return SourceScene(str(iid), "all", objects, pixels)
