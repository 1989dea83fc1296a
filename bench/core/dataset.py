"""The dataset on disk (docs/explanation/architecture.md §1): Parquet shards of scenes plus a `dataset.json` card.

This is the only interface between generators and evaluators. A dataset directory
is complete exactly when its card exists: shards and the card are written to a
temporary name and renamed into place, and the card is written last, so a killed
run never leaves something that reads as a finished dataset.

Readers trust nothing on disk: the card's schema, every shard's footer and row count
(against the card) are checked before use, and any damage is a one-line BenchError
naming the file, never a traceback from deep inside Arrow.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError
from bench.core.hashing import fingerprint, sha256_hex, stable_json

SCHEMA_VERSION = 1
CARD_NAME = "dataset.json"
SPLITS = ("train", "val", "test")

#: Hugging Face `datasets` Image convention: PNG bytes, path null.
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
#: The schema metadata `datasets` reads its features from (`Features.from_arrow_schema`), so
#: `load_dataset("parquet", ...)` decodes `image` and `mask` as PIL images with no cast. Flat-colour
#: scenes are stored as palette PNGs (smaller, faster), which PIL opens in mode "P"; every vision
#: model expects RGB, so the image feature converts (`mode`); a mask keeps its integer mode.
HF_FEATURES = {b"huggingface": json.dumps({"info": {"features": {"image": {"_type": "Image", "mode": "RGB"},
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


def decode_image(data: bytes | dict) -> np.ndarray:
    """RGB pixels (H x W x 3 uint8) of a stored image (the `{bytes, path}` struct too), whatever
    mode its PNG was saved in (palette, grey, alpha): what every backbone reads."""
    with _opened_png(data) as im:
        return np.asarray(im.convert("RGB"))


def decode_mask(data: bytes | dict) -> np.ndarray:
    """Instance ids of a stored mask in the PNG's own integer mode (uint8 or uint16): never
    converted to colour, which would turn ids into palette or grey values."""
    with _opened_png(data) as im:
        return np.asarray(im)


@contextlib.contextmanager
def _opened_png(data: bytes | dict) -> Iterator[Image.Image]:
    """A decoded PNG, or one line naming what is wrong with its bytes."""
    if isinstance(data, dict):
        data = data["bytes"]
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            yield im
    except (OSError, ValueError, TypeError) as e:  # PIL's errors for truncated or garbled bytes
        raise BenchError(f"dataset: a stored image is not a valid PNG ({_first_line(e)}); "
                         "regenerate the dataset with `bench generate`") from None


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


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write, renamed onto `path` when the block ends well.

    A failure (a full disk, a killed encoder) removes the temporary and leaves `path` as it
    was, so a half-written file never stands where a good one stood; an OSError then names
    `path`, not the temporary, for the one-line error the user reads."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None and e.filename != str(path):
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write a Parquet file under a temporary name, then rename it into place."""
    with replacing(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=False)


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write JSON (indented, sorted keys: byte-stable) atomically."""
    write_text_atomic(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def write_text_atomic(text: str, path: Path) -> None:
    """Write a UTF-8 text file atomically (`replacing`)."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


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
        try:
            self.card: dict[str, Any] = json.loads(card_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise _damaged(card_path, f"unreadable JSON: {_first_line(e)}") from None
        if not isinstance(self.card, dict):
            raise _damaged(card_path, f"a JSON {type(self.card).__name__}, not an object")
        version = self.card.get("schema_version")
        if version != SCHEMA_VERSION:
            raise BenchError(
                f"dataset: {self.path} has schema_version {version}; this BindingBench reads {SCHEMA_VERSION}"
            )
        _check_card(self.card, card_path)
        if "feature_space" not in self.card:
            raise BenchError(f"dataset: {self.path} has no feature_space in its card, so no F/O codes to probe")
        try:
            self.feature_space = FeatureSpace.from_dict(self.card["feature_space"])
        except (KeyError, TypeError, ValueError) as e:
            raise _damaged(card_path, f"feature_space: {_first_line(e)}") from None
        self._checked: set[str] = set()

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
        """The split's shards, checked once (`_check_split`) before any is read."""
        files = [self.path / name for name in self.split_info(split)["shards"]]
        if split not in self._checked:
            _check_split(self, split, files)
            self._checked.add(split)
        return files

    def verify(self) -> None:
        """Check every split now (`bench info`: a damaged shard is named before the card is shown)."""
        for split in self.splits:
            self.files(split)

    def num_rows(self, split: str) -> int:
        return int(self.split_info(split)["n"])

    def table(self, split: str, columns: Sequence[str] | None = None) -> pa.Table:
        """All rows of a split (optionally only some columns) as one Arrow table."""
        files = self.files(split)
        if not files:
            return row_schema({}, {}).empty_table()
        tables = []
        for f in files:
            with _reading(f):
                tables.append(pq.read_table(f, columns=columns))
        return pa.concat_tables(tables)

    def iter_batches(
        self, split: str, batch_size: int = 256, columns: Sequence[str] | None = None, start: int = 0
    ) -> Iterator[pa.RecordBatch]:
        """Stream a split's rows from `start` on in record batches, one shard open at a time
        (bounded memory); shards wholly before `start` are not read (a resumed or sharded
        extraction does not re-read the rows before its own)."""
        offset = 0
        for f in self.files(split):
            with _reading(f):
                shard = pq.ParquetFile(f)
                if offset + shard.metadata.num_rows <= start:
                    offset += shard.metadata.num_rows
                    continue
                for batch in shard.iter_batches(batch_size=batch_size, columns=columns):
                    cut, offset = max(start - offset, 0), offset + batch.num_rows
                    if cut < batch.num_rows:
                        yield batch.slice(cut) if cut else batch

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
                try:
                    row["image"] = decode_image(row["image"])
                    row["mask"] = decode_mask(row["mask"])
                except BenchError as e:  # name the scene: its shard is the split's at its index
                    raise BenchError(f"{e} (scene {row['scene_id']} of {self.path})") from None
                yield row


def _check_split(ds: Dataset, split: str, files: Sequence[Path]) -> None:
    """The cheap check at open, before a split is read: every shard present with a readable
    footer and the core columns, F and O rows as wide as the feature space, the rows the card
    counts, and content hashes that match the card's per-shard digests and the split's
    fingerprint (so a swapped, replaced or foreign shard, or an edited card, is named here
    and not read as data). It reads three small columns, never the images."""
    info = ds.split_info(split)
    digests = info.get("shard_digests") if isinstance(info.get("shard_digests"), dict) else {}
    widths = {"F": ds.feature_space.n_features, "O": ds.feature_space.n_conjunctions}
    hashes: list[str] = []
    for f in files:
        with _reading(f):
            shard = pq.ParquetFile(f)
            _check_columns(f, shard.schema_arrow)
            table = shard.read(columns=["content_hash", *widths])
        for column, width in widths.items():
            lengths = pc.min_max(pc.list_value_length(table[column])).as_py()
            if table.num_rows and (table[column].null_count or lengths != {"min": width, "max": width}):
                raise _damaged(f, f"column {column} does not hold {width} values in every row, as the card's "
                                  "feature space says")
        own = table["content_hash"].to_pylist()
        if f.name in digests and fingerprint(own) != digests[f.name]:
            raise _damaged(f, "its rows are not the ones the card lists for this shard (a shard swapped, replaced "
                              "or edited)")
        hashes += own
    card = ds.path / CARD_NAME
    if len(hashes) != ds.num_rows(split):
        raise _damaged(card, f"split {split!r} has {len(hashes)} rows in its shards, the card says "
                             f"{ds.num_rows(split)}")
    if fingerprint(hashes) != info["fingerprint"]:
        raise _damaged(card, f"split {split!r}'s fingerprint does not match the rows of its shards (a shard "
                             "replaced or reordered, or the card edited)")


#: The core columns every reader relies on, with their types (a foreign Parquet file has others).
_CORE_COLUMNS = row_schema({}, {})


def _check_columns(shard: Path, schema: pa.Schema) -> None:
    for field in _CORE_COLUMNS:
        found = schema.field(field.name) if field.name in schema.names else None
        expected = field.type
        if field.name == "objects":  # generators add their own object fields: the core ones must be there
            ok = (found is not None and pa.types.is_list(found.type) and pa.types.is_struct(found.type.value_type)
                  and all(found.type.value_type.get_field_index(c.name) >= 0
                          and found.type.value_type.field(c.name).type == c.type for c in expected.value_type))
        else:
            ok = found is not None and found.type == expected
        if not ok:
            what = "is missing" if found is None else f"is {found.type}, not {expected}"
            raise _damaged(shard, f"column {field.name!r} {what}: not a BindingBench shard")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _damaged(path: Path, what: str) -> BenchError:
    return BenchError(f"dataset: {path} is damaged ({what}); regenerate the dataset with `bench generate`")


#: The card fields readers rely on, and each split's.
_CARD_FIELDS = {"generator": dict, "splits": dict}
_SPLIT_FIELDS = {"n": int, "fingerprint": str, "shards": list}


def _check_card(card: dict[str, Any], path: Path) -> None:
    """Fields and types the readers use, so damage surfaces here and not as a KeyError later."""
    for name, tp in _CARD_FIELDS.items():
        if not isinstance(card.get(name), tp):
            raise _damaged(path, f"{name!r} missing or not a {tp.__name__}")
    generator = card["generator"]
    if not (isinstance(generator.get("name"), str) and generator["name"] and "version" in generator):
        raise _damaged(path, "'generator' lacks its name or version")
    for split, info in card["splits"].items():
        for name, tp in _SPLIT_FIELDS.items():
            if not isinstance(info, dict) or not isinstance(info.get(name), tp):
                raise _damaged(path, f"splits.{split}.{name} missing or not a {tp.__name__}")
        names = info["shards"]
        if not all(isinstance(n, str) and n and Path(n).name == n for n in names) or info["n"] < 0:
            raise _damaged(path, f"splits.{split} lists invalid shards or rows")


@contextlib.contextmanager
def _reading(shard: Path) -> Iterator[None]:
    """Turn a missing, truncated or garbled shard into one line naming it."""
    try:
        yield
    except FileNotFoundError:
        raise BenchError(f"dataset: shard {shard} is missing; regenerate the dataset with `bench generate`") from None
    except (OSError, pa.ArrowException) as e:
        raise _damaged(shard, _first_line(e)) from None


def _list_column(col: pa.ChunkedArray, width: int) -> np.ndarray:
    flat = pa.concat_arrays([c.flatten() for c in col.chunks]) if col.num_chunks else pa.array([], pa.uint8())
    return flat.to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.uint8)
