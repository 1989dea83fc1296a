"""ADE20K (the full release with per-image instance masks, e.g. ADE20K_2021_17_01).

Layout: `images/ADE/{training,validation}/<scene>/.../ADE_*.jpg`, beside each image its
`.json` annotation (`annotation.object[]` with `id`, `name`, `name_ndx`,
`parts.part_level`, `parts.hasparts`, `instance_mask`), its `_seg.png` and the folder of
per-instance masks the JSON names (`ADE_*/instance_NNN_ADE_*.png`). Whole objects
(`part_level` 0) become instances; their parts (the `hasparts` ids) are listed by name in
`objects.parts`.

The instance PNGs are amodal (they include occluded parts) and `depth_ordering_rank` does
not decide who is in front (on the release's own sample images, higher ranks are in front
in about 60% of overlaps). What is visible is the `_seg.png`: class index (R/10)*256 + G
(= `name_ndx`) and an instance value in B. Each visible (class, instance) region of the seg
goes to the object of that class whose amodal mask overlaps it most (ties: the earlier
object); `full_px` is the amodal area.

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

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError
from generators.importers.common import (Source, SourceObject, SourceScene, instance_dtype, malformed, missing,
                                         read_rgb, top_values)

LAYOUT = ("ADE20K_2021_17_01/images/ADE/{training,validation}/<scene>/ADE_*.jpg with ADE_*.json, ADE_*_seg.png "
          "and ADE_*/instance_NNN_ADE_*.png beside it")
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
        "licence": "ADE20K: use is governed by the dataset's Terms of Use, accepted when downloading it "
                   "(https://groups.csail.mit.edu/vision/datasets/ADE20K/); read them before sharing this dataset "
                   "or results from it",
        "mask": "instance: each object's amodal instance PNG where the _seg.png shows its class and instance",
        "objects": f"class: top {top_n} object classes by instance count, the rest '{OTHER}'; parts listed per "
                   "object; one group, so O = F (no binding task)",
    }
    return Source("ade20k", space, scenes, provenance,
                  object_fields={"name": pa.string(), "parts": pa.list_(pa.string())})


def _version(src: Path) -> str:
    name = src.resolve().name
    return name.removeprefix("ADE20K_") if name.startswith("ADE20K_") else "unknown (not an ADE20K_<date> folder)"


def _objects(path: Path) -> list[dict[str, Any]]:
    """Whole objects of one annotation with their parts' names (`hasparts` is a list of ids,
    or a bare id when there is one part)."""
    try:
        ann = json.loads(_text(path))["annotation"]
        objs = ann["object"]
        by_id = {int(o["id"]): o for o in objs}
        whole = [o for o in objs if int(o["parts"]["part_level"]) == 0]
        out = [{"id": int(o["id"]), "name": str(o["name"]), "mask": str(o["instance_mask"]),
                "class_index": int(o["name_ndx"]),
                "parts": [str(by_id[int(p)]["name"]) for p in _ids(o["parts"].get("hasparts", [])) if int(p) in by_id]}
               for o in whole]
        filename = str(ann["filename"])
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise malformed(path, f"not valid JSON ({type(e).__name__})", LAYOUT) from None
    except KeyError as e:
        raise malformed(path, f"annotation lacks {e}", LAYOUT) from None
    except TypeError as e:
        raise malformed(path, f"annotation has an unexpected shape ({e})", LAYOUT) from None
    if not out:
        raise malformed(path, "annotation.object has no whole object (part_level 0)", LAYOUT)
    for o in out:
        o["mask"] = path.parent / o["mask"]
    return [{**o, "image": path.parent / filename} for o in out]


def _ids(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _text(path: Path) -> str:
    """A JSON file's text: UTF-8, else Latin-1, so a stray byte in an object name does not stop an import."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _loader(objs: list[dict[str, Any]], objects: list[SourceObject]):
    def pixels() -> tuple[np.ndarray, np.ndarray]:
        image_path = objs[0]["image"]
        image = read_rgb(image_path, LAYOUT)
        shape = image.shape[:2]
        seg = read_rgb(image_path.with_name(image_path.stem + "_seg.png"), LAYOUT)
        if seg.shape[:2] != shape:
            raise malformed(image_path.with_name(image_path.stem + "_seg.png"),
                            f"seg is {seg.shape[1]}x{seg.shape[0]} but its image is {shape[1]}x{shape[0]}", LAYOUT)
        seg_class = (seg[..., 0].astype(np.int64) // 10) * 256 + seg[..., 1]
        segment = seg_class * 256 + seg[..., 2]  # one id per visible (class, instance) region
        owner: dict[int, tuple[int, int]] = {}  # segment -> (pixels shared, object index)
        for i, o in enumerate(objs):
            amodal = _instance(o["mask"], shape)
            objects[i].fields["full_px"] = int(amodal.sum())
            ids, counts = np.unique(segment[amodal & (seg_class == o["class_index"])], return_counts=True)
            for sid, n in zip(ids.tolist(), counts.tolist()):
                owner[sid] = max(owner.get(sid, (0, -1)), (n, -i))
        mask = np.zeros(shape, dtype=instance_dtype(len(objs)))
        for sid, (_, i) in owner.items():  # each visible region goes to the object overlapping it most
            mask[segment == sid] = 1 - i
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
