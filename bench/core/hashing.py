"""Stable hashes: seeds, content hashes and fingerprints must not depend on the
process, the machine or Python's per-run string hash randomisation."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable


def stable_json(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces) so equal objects hash equally."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_default)


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot hash {type(obj).__name__}")


def sha256_hex(*parts: bytes | str) -> str:
    """Hex sha256 of the parts, length-prefixed so ('ab','c') != ('a','bc')."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in blocks (weights and cache arrays can be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def config_hash(obj: Any) -> str:
    """Short hash of any JSON-able configuration."""
    return sha256_hex(stable_json(obj))[:16]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed derived from the parts (e.g. global seed, split, scene index)."""
    return int(sha256_hex(stable_json(list(parts)))[:16], 16) >> 1


def fingerprint(row_hashes: Iterable[str]) -> str:
    """Fingerprint of a split: a hash over its rows' content hashes, in order."""
    h = hashlib.sha256()
    n = 0
    for r in row_hashes:
        h.update(bytes.fromhex(r))
        n += 1
    h.update(n.to_bytes(8, "little"))
    return h.hexdigest()
