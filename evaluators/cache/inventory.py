"""The activation cache's inventory, what `bench cache ls` and `bench cache rm` read and do:
every entry under the cache root, complete, partial or damaged (`evaluators.cache.entries` keeps them)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from bench.core.errors import BenchError
from bench.core.locks import try_lock
from evaluators.cache.entries import (DAMAGED_PREFIX, ENTRY_NAME, LOCK_NAME, STATE_NAME, activations_dir, cache_root,
                              intact_entry, read_meta)


@dataclass
class EntryInfo:
    """One cache entry as `bench cache ls` shows it."""

    key: str
    path: Path
    complete: bool
    backbone: str
    revision: str
    dataset: str
    split: str
    layers: list[int]
    token_choices: list[str]
    rows: str
    bytes: int
    #: input side and dataset fingerprint: entries may differ in these alone.
    side: Any = "?"
    fingerprint: str = "?"
    damaged: bool = False

    def row(self) -> dict[str, Any]:
        layers = self.layers
        span = f"{layers[0]}..{layers[-1]} ({len(layers)})" if len(layers) > 3 else ",".join(map(str, layers))
        return {"key": self.key, "status": "damaged" if self.damaged else "complete" if self.complete else "partial", "backbone": self.backbone,
                "revision": self.revision, "dataset": self.dataset, "fingerprint": self.fingerprint[:12],
                "split": self.split, "side": self.side, "layers": span,
                "tokens": ",".join(self.token_choices), "rows": self.rows, "size_mb": round(self.bytes / 2**20, 1),
                "path": str(self.path)}


def list_entries(cache_dir: Path | None = None) -> list[EntryInfo]:
    """Complete and partial entries under the cache root."""
    out = []
    if cache_root(cache_dir).exists() and not cache_root(cache_dir).is_dir():
        raise BenchError(f"cache-dir: {cache_root(cache_dir)} is not a directory")
    root = activations_dir(cache_dir)
    for entry in sorted(root.glob("*/*")) if root.is_dir() else []:
        meta = read_meta(entry)
        damaged = entry.name.startswith(DAMAGED_PREFIX) or (entry / ENTRY_NAME).exists() and (
            meta is None or not intact_entry(entry, meta))
        complete = meta is not None and not damaged
        if meta is None:
            try:
                meta = json.loads((entry / STATE_NAME).read_text())
            except (OSError, ValueError):
                meta = {}
        if not isinstance(meta, dict):
            meta = {}
        mat = meta.get("material", {})
        rows = str(meta.get("n", "?")) if complete else f"{meta.get('n_done', 0)}/{meta.get('n', '?')}"
        out.append(EntryInfo(
            key=f"{entry.parent.name[:8]}{entry.name[:4]}", path=entry, complete=complete,
            backbone=mat.get("spec", "?"), revision=mat.get("revision", "?"), dataset=mat.get("dataset", "?"),
            split=mat.get("split", "?"), layers=list(meta.get("layers", [])), token_choices=list(meta.get("views", [])),
            rows=rows, bytes=sum(f.stat().st_size for f in entry.iterdir() if f.is_file()),
            side=mat.get("side", "?"), fingerprint=str(mat.get("fingerprint", "?")), damaged=damaged,
        ))
    return out


def remove_entries(entries: Sequence[EntryInfo]) -> int:
    """Delete entries (and base directories left empty); returns bytes freed.

    Each entry's lock is taken first, without waiting: an entry a running extraction
    holds is refused, and nothing at all is removed, rather than pulled from under it.
    A writer that was waiting for the lock sees the entry gone and starts it afresh.
    """
    locks: list[int] = []
    try:
        for e in entries:
            fd = try_lock(e.path / LOCK_NAME)
            if fd is None:
                raise BenchError(f"cache rm: entry {e.key} is being written by a running extraction; "
                                 "nothing was removed, retry when it has finished")
            locks.append(fd)
        freed = 0
        for e in entries:
            freed += e.bytes
            shutil.rmtree(e.path, ignore_errors=True)
            with contextlib.suppress(OSError):
                e.path.parent.rmdir()
        return freed
    finally:
        for fd in locks:
            os.close(fd)


def select_entries(entries: Sequence[EntryInfo], keys: Sequence[str]) -> list[EntryInfo]:
    """Entries whose key starts with any of `keys`; an unmatched key is a BenchError."""
    out = []
    for k in keys:
        if not k.strip():  # every key starts with "": an empty argument must not select them all
            raise BenchError("cache key: empty; name a key or prefix from `bench cache ls`, or pass --all")
        hits = [e for e in entries if e.key.startswith(k)]
        if not hits:
            raise BenchError(f"cache key: no entry matches {k!r}; run `bench cache ls` to see the keys")
        out += [e for e in hits if e not in out]
    return out
