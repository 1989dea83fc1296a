"""A Hugging Face backbone known by the record of an earlier build, its model built only to run.

A run on a warm activation cache reads every activation it needs from the cache, keyed by the
backbone's `identity()`; for a Hugging Face model that identity holds the hash of its weights, so
knowing it meant building the model: importing transformers' model code and, for a `random:`
preset, initialising every weight (5-8 s of a one-row-set run on a 2-core machine, as long as
half its fit). `planned_backbone` builds a model once and records its info and identity in the
cache (`built-backbones/`), keyed by everything the build reads: the spec, its preset, its options,
the weights' revision, the versions of torch and transformers and the source of the code that
builds it. A later run with
the same key gets a `RecordedBackbone`: the same info and identity, so the same cache keys and
the same rows, and the model is built only when something runs it (an extraction, whose cache
key is then taken again from the built model: `extract_activations`)."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from bench.core.dataset import write_json_atomic
from bench.core.hashing import config_hash
from evaluators.backbones.base import Backbone
from evaluators.backbones.info import BackboneInfo

RECORDS_DIR = "built-backbones"
#: The modules whose code makes a Hugging Face backbone and its identity: a change to any of them
#: makes every record stale.
BUILD_CODE = ("hf.py", "presets.py", "base.py", "weights.py", "hub.py", "__init__.py")


class RecordedBackbone(Backbone):
    """The info and identity an earlier build of the same key gave, and the model built when first
    run (`loaded`; any attribute but those is the built backbone's)."""

    def __init__(self, info: BackboneInfo, identity: dict[str, Any], build: Callable[[], Backbone]) -> None:
        self.info = info
        self._identity = identity
        self._build = build
        self._built: Backbone | None = None

    def identity(self) -> dict[str, Any]:
        return self._identity

    def loaded(self) -> Backbone:
        if self._built is None:
            self._built = self._build()
        return self._built

    def to(self, device: Any, dtype: str) -> Backbone:
        return self.loaded().to(device, dtype)

    def prepare(self, rows: dict[str, list], side: int) -> Any:
        return self.loaded().prepare(rows, side)

    def hidden_states(self, inputs: Any, layers: Any) -> list[Any]:
        return self.loaded().hidden_states(inputs, layers)

    def attention_qk(self, layer: int) -> Any:
        return self.loaded().attention_qk(layer)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.loaded(), name)


def planned_backbone(spec: str, options: Mapping[str, object], build: Callable[[], Backbone]) -> Backbone:
    """The backbone `build()` makes for `spec` with `options`, or, where an earlier build of the
    same key recorded it (`record_path`), a `RecordedBackbone` that builds it only to run it.
    A Hugging Face backbone built here is recorded for the next run."""
    path = record_path(spec, options)
    try:
        record = json.loads(path.read_text()) if path is not None else None
        info = BackboneInfo(**{**record["info"], "register_indices": tuple(record["info"]["register_indices"])})
        return RecordedBackbone(info, record["identity"], build)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    backbone = build()
    if path is not None and recordable(backbone):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic({"info": backbone.info.to_dict(), "identity": backbone.identity()}, path)
        except OSError:  # a record only spares a later run the build: a cache it cannot write (read-only, shared) still serves
            pass
    return backbone


def recordable(backbone: Backbone) -> bool:
    """A Hugging Face backbone whose input settings the checkpoint or the options stated (a folder
    without them says so on stderr when it loads, and its files may change under the same spec)."""
    from evaluators.backbones.hf import HFBackbone

    return type(backbone) is HFBackbone and backbone.unstated_input is None


def record_path(spec: str, options: Mapping[str, object]) -> Path | None:
    """Where a build of `spec` with `options` is recorded: a `random:` preset (its weights are its
    seed's) or a preset of the hub read from its cached snapshot (its revision in the key); None
    for anything else."""
    from evaluators.backbones import PRESETS, backbone_metadata, source_of
    from evaluators.cache.entries import cache_root

    source = source_of(spec)
    if not (source == "preset" or (source == "random" and spec.split(":", 1)[1] in PRESETS)):
        return None
    info = backbone_metadata(spec)
    if info is None or info.revision == "not cached":
        return None
    try:
        versions = {lib: metadata.version(lib) for lib in ("torch", "transformers")}
    except metadata.PackageNotFoundError:
        return None
    here = Path(__file__).parent
    code = hashlib.sha256(b"".join((here / name).read_bytes() for name in BUILD_CODE)).hexdigest()
    preset = PRESETS[spec.split(":", 1)[-1]]
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(options.items())}
    key = config_hash({"spec": spec, "preset": repr(preset), "revision": info.revision, "options": given,
                       "versions": versions, "code": code})
    return cache_root() / RECORDS_DIR / f"{key}.json"
