"""The dataset on disk (DESIGN §5): Parquet shards of scenes plus a `dataset.json` card.

This is the only interface between generators and evaluators. A dataset directory
is complete exactly when its card exists: shards and the card are written to a
temporary name and renamed into place, and the card is written last, so a killed
run never leaves something that reads as a finished dataset.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from bench.codes import FeatureSpace
from bench.errors import BenchError
from bench.hashing import sha256_hex, stable_json

SCHEMA_VERSION = 1
CARD_NAME = "dataset.json"
SPLITS = ("train", "val", "test")

#: Hugging Face `datasets` Image convention: PNG bytes, path null.
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
#: The schema metadata `datasets` reads its features from (`Features.from_arrow_schema`), so
#: `load_dataset("parquet", ...)` decodes `image` and `mask` as PIL images with no cast.
HF_FEATURES = {b"huggingface": json.dumps({"info": {"features": {"image": {"_type": "Image"},
                                                                "mask": {"_type": "Image"}}}}).encode()}

CORE_OBJECT_FIELDS: dict[str, pa.DataType] = {
    "id": pa.int32(),
    "conj": pa.int32(),
    "attributes": pa.list_(pa.string()),
    "bbox": pa.list_(pa.int32()),
    "visible_px": pa.int64(),
    "full_px": pa.int64(),
    "visibility": pa.float64(),
}


@dataclass
class Scene:
    """One rendered scene before encoding.

    `objects[i]` must carry at least the core fields except `attributes` (filled
    in from `conj`); `mask` holds instance ids (0 = background, ids 1..n).
    """

    image: np.ndarray  # H x W x 3 uint8, or H x W palette indices when `palette` is given
    mask: np.ndarray  # H x W uint8 / uint16 instance ids
    objects: list[dict[str, Any]]
    extras: dict[str, Any] = field(default_factory=dict)
    #: K x 3 uint8 colours: flat-colour scenes stored as palette PNGs (3-4x faster to encode).
    palette: np.ndarray | None = None


def row_schema(object_fields: dict[str, pa.DataType], scene_fields: dict[str, pa.DataType]) -> pa.Schema:
    """Arrow schema of a generator's rows: core columns plus its own scalars."""
    obj = pa.struct(list({**CORE_OBJECT_FIELDS, **object_fields}.items()))
    cols = [
        ("scene_id", pa.string()),
        ("split", pa.string()),
        ("index", pa.int64()),
        ("seed", pa.int64()),
        ("image", IMAGE_TYPE),
        ("mask", IMAGE_TYPE),
        ("F", pa.list_(pa.uint8())),
        ("O", pa.list_(pa.uint8())),
        ("n_objects", pa.int32()),
        ("H_O_given_F", pa.float64()),
        ("objects", pa.list_(obj)),
        *scene_fields.items(),
        ("content_hash", pa.string()),
    ]
    return pa.schema(cols, metadata={b"bindingbench_schema_version": str(SCHEMA_VERSION).encode(), **HF_FEATURES})


def encode_png(array: np.ndarray, palette: np.ndarray | None = None, compress_level: int = 1) -> bytes:
    """PNG bytes of an image or an instance mask (uint8 -> L, uint16 -> I;16, indices + palette -> P)."""
    im = Image.fromarray(array)
    if palette is not None:
        im = Image.fromarray(array, mode="P") if im.mode != "P" else im
        im.putpalette(np.asarray(palette, dtype=np.uint8).ravel().tolist())
    buf = io.BytesIO()
    im.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def decode_png(data: bytes | dict) -> np.ndarray:
    """Pixels of a PNG (accepts the `{bytes, path}` struct too); palette images come back RGB."""
    if isinstance(data, dict):
        data = data["bytes"]
    with Image.open(io.BytesIO(data)) as im:
        if im.mode == "P":
            im = im.convert("RGB")
        return np.asarray(im)


def encode_scene(
    scene: Scene,
    *,
    space: FeatureSpace,
    split: str,
    index: int,
    seed: int,
    h_o_given_f: float,
) -> dict[str, Any]:
    """A Parquet row for a scene, with its content hash.

    The content hash covers decoded pixels (not PNG bytes, which depend on the
    zlib build) and every code and metadata field, so fingerprints agree across
    machines.
    """
    conjs = [int(o["conj"]) for o in scene.objects]
    o_code = space.encode_o(conjs)
    f_code = space.o_to_f(o_code)
    objects = [{**o, "attributes": list(space.conj_names(int(o["conj"])))} for o in scene.objects]
    mask = np.ascontiguousarray(scene.mask)
    image = np.ascontiguousarray(scene.image)
    row: dict[str, Any] = {
        "scene_id": f"{split}-{index:07d}",
        "split": split,
        "index": int(index),
        "seed": int(seed),
        "F": f_code.tolist(),
        "O": o_code.tolist(),
        "n_objects": len(objects),
        "H_O_given_F": float(h_o_given_f),
        "objects": objects,
        **scene.extras,
    }
    palette = b"" if scene.palette is None else np.ascontiguousarray(scene.palette, dtype=np.uint8).tobytes()
    row["content_hash"] = sha256_hex(
        image.tobytes(), str(image.shape), palette, mask.tobytes(), str(mask.dtype), stable_json(row)
    )
    row["image"] = {"bytes": encode_png(image, scene.palette), "path": None}
    row["mask"] = {"bytes": encode_png(mask), "path": None}
    return row


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write a Parquet file under a temporary name, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd", write_statistics=False)
    os.replace(tmp, path)


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write JSON (indented, sorted keys: byte-stable) atomically."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def shard_name(split: str, shard: int) -> str:
    return f"{split}-{shard:05d}.parquet"


class Dataset:
    """Read access to a generated dataset directory (what evaluators use)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        card_path = self.path / CARD_NAME
        if not self.path.is_dir():
            raise BenchError(f"dataset: {self.path} is not a directory")
        if not card_path.exists():
            raise BenchError(
                f"dataset: {self.path} has no {CARD_NAME} (not a dataset, or its generation did not finish)"
            )
        self.card: dict[str, Any] = json.loads(card_path.read_text())
        version = self.card.get("schema_version")
        if version != SCHEMA_VERSION:
            raise BenchError(
                f"dataset: {self.path} has schema_version {version}; this BindingBench reads {SCHEMA_VERSION}"
            )
        self.feature_space = FeatureSpace.from_dict(self.card["feature_space"])

    @property
    def name(self) -> str:
        return self.card.get("name") or self.path.name

    @property
    def splits(self) -> list[str]:
        return [s for s in SPLITS if s in self.card["splits"]] + [
            s for s in self.card["splits"] if s not in SPLITS
        ]

    def split_info(self, split: str) -> dict[str, Any]:
        if split not in self.card["splits"]:
            raise BenchError(f"split: {split!r} not in dataset; available: {', '.join(self.splits)}")
        return self.card["splits"][split]

    def fingerprint(self, split: str) -> str:
        return self.split_info(split)["fingerprint"]

    def files(self, split: str) -> list[Path]:
        return [self.path / name for name in self.split_info(split)["shards"]]

    def num_rows(self, split: str) -> int:
        return int(self.split_info(split)["n"])

    def table(self, split: str, columns: Sequence[str] | None = None) -> pa.Table:
        """All rows of a split (optionally only some columns) as one Arrow table."""
        files = self.files(split)
        if not files:
            return row_schema({}, {}).empty_table()
        return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])

    def iter_batches(
        self, split: str, batch_size: int = 256, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream a split in record batches, one shard open at a time (bounded memory)."""
        for f in self.files(split):
            yield from pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=columns)

    def codes(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(F, O, H(O|F=f) per row) as arrays: F is N x n_features, O is N x n_conjunctions."""
        t = self.table(split, ["F", "O", "H_O_given_F"])
        space = self.feature_space
        f = _list_column(t["F"], space.n_features)
        o = _list_column(t["O"], space.n_conjunctions)
        return f, o, t["H_O_given_F"].to_numpy()

    def iter_scenes(self, split: str, batch_size: int = 64) -> Iterator[dict[str, Any]]:
        """Rows as dicts with `image` and `mask` decoded to arrays."""
        for batch in self.iter_batches(split, batch_size):
            for row in batch.to_pylist():
                row["image"] = decode_png(row["image"])
                row["mask"] = decode_png(row["mask"])
                yield row


def _list_column(col: pa.ChunkedArray, width: int) -> np.ndarray:
    flat = pa.concat_arrays([c.flatten() for c in col.chunks]) if col.num_chunks else pa.array([], pa.uint8())
    return flat.to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.uint8)
