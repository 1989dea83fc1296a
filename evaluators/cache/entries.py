"""The activation cache (docs/explanation/architecture.md §2): fp16 arrays on disk, read memory-mapped.

Layout: `<root>/activations/<base>/<selection>/` where `base` hashes everything
that changes the numbers (backbone weights and preprocessing, input side, dataset
fingerprint and split, dtype, format version) and `selection` the layers and
tokens choices stored. One `.npy` per (layer, tokens). An entry is complete exactly when its
`entry.json` exists; it is written last, after every row, so a killed run never
looks complete. While writers are going, `state.json` records which rows are on
disk, and a later writer resumes from there; several writers may fill disjoint row
ranges of one entry at once (`EntryWriter`).

Rows are written with positioned writes, not through a writable memmap: mapped
dirty pages count toward the writer's RSS, which would then grow with the dataset.

`entry.json` records each array's sha256 (`digests`), computed from the files once every row
is on disk. A reader checks an entry's headers and sizes every time (cheap) and its digests
once: the verification is remembered against the files' inodes, sizes and times, so a zeroed
or edited array is found, set aside and recomputed with a one-line warning, while an unchanged
entry is never hashed twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from bench.core.dataset import write_json_atomic
from bench.core.hashing import file_sha256, sha256_hex, stable_json
from bench.core.locks import locked, same_file

FORMAT_VERSION = 1
ENTRY_NAME = "entry.json"
STATE_NAME = "state.json"
LOCK_NAME = ".lock"
STATE_LOCK_NAME = ".state.lock"
DTYPE = np.float16


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """`cache_dir`, else $BINDINGBENCH_CACHE, else ~/.cache/bindingbench."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("BINDINGBENCH_CACHE") or "~/.cache/bindingbench").expanduser()


def activations_dir(cache_dir: Path | str | None = None) -> Path:
    return cache_root(cache_dir) / "activations"


def base_key(material: dict[str, Any]) -> str:
    """Hash of the key material (plus the format version): equal only for equal numbers."""
    return sha256_hex(stable_json({"format_version": FORMAT_VERSION, **material}))[:32]


def selection_key(layers: Sequence[int], token_choices: Sequence[str]) -> str:
    """The hash of a selection. Its key stays "views", as entry.json's and state.json's do (the
    tokens choices were called views when they were written), so that entries written before
    are found and read as before."""
    return sha256_hex(stable_json({"layers": sorted(layers), "views": sorted(token_choices)}))[:16]


def array_name(layer: int, tokens: str) -> str:
    return f"L{layer:03d}-{tokens}.npy"


def covers(stored: Sequence[str], tokens: str) -> bool:
    """A stored set of tokens choices serves `tokens` (cls and mean are column slices of cls+mean)."""
    return tokens in stored or (tokens in ("cls", "mean") and "cls+mean" in stored)


def find_complete(cache_dir: Path | None, base: str, layers: Sequence[int],
                  token_choices: Sequence[str]) -> Path | None:
    """A complete entry of this base key holding at least these layers and tokens choices."""
    root = activations_dir(cache_dir) / base
    if not root.is_dir():
        return None
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(DAMAGED_PREFIX):
            continue
        meta = read_meta(entry)
        if meta is not None and not (intact_entry(entry, meta) and verified_entry(entry, meta)):
            set_aside(entry)
            continue
        if meta and set(layers) <= set(meta["layers"]) and all(covers(meta["views"], v) for v in token_choices):
            return entry
    return None


def read_meta(entry: Path) -> dict[str, Any] | None:
    """The entry's record, or None while it is incomplete (or its record is not an object)."""
    try:
        meta = json.loads((entry / ENTRY_NAME).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


#: A damaged entry is renamed with this prefix: kept for a look, never read, listed as damaged.
DAMAGED_PREFIX = "damaged-"


def intact_entry(entry: Path, meta: dict[str, Any]) -> bool:
    """Every array the record lists has a valid header, `n` rows and all its bytes: a cheap
    check (headers and file sizes only) that turns an empty, truncated or garbled `.npy`
    into a recompute instead of a traceback or wrong numbers."""
    try:
        n, layers, token_choices = int(meta["n"]), list(meta["layers"]), list(meta["views"])
        for layer in layers:
            for tokens in token_choices:
                path = entry / array_name(int(layer), str(tokens))
                with open(path, "rb") as f:
                    np.lib.format.read_magic(f)
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                    offset = f.tell()
                if not shape or shape[0] != n or fortran or dtype != np.dtype(DTYPE):
                    return False
                if path.stat().st_size < offset + int(np.prod(shape)) * np.dtype(DTYPE).itemsize:
                    return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


#: A verification is remembered (in this process, and in the entry's `verified.json`) only for
#: arrays last changed this long before it: file times tick coarsely (a few ms), so an array
#: zeroed in the same tick as a verification would keep its times, and pass for verified.
RACY_S = 1.0
VERIFIED_NAME = "verified.json"
_VERIFIED: dict[str, list[list[int]]] = {}


def verified_entry(entry: Path, meta: dict[str, Any]) -> bool:
    """Every array's bytes match the digest written with the entry, hashed once per entry: a
    verification holds until an array's file changes (its inode, size or times), so entries are
    read memory-mapped as before and hashed again only after something wrote to them. An entry
    from before digests gains them here. False: the contents changed (a zeroed or edited array)."""
    names = [array_name(int(layer), str(tokens)) for layer in meta["layers"] for tokens in meta["views"]]
    signature = _signature(entry, [*names, ENTRY_NAME])
    if signature is None:
        return False
    if signature in (_VERIFIED.get(str(entry)), _read_stamp(entry)):
        return True
    digests = {name: file_sha256(entry / name) for name in names}
    recorded = meta.get("digests")
    if isinstance(recorded, dict):
        if recorded != digests:
            return False
    else:
        with contextlib.suppress(OSError):  # a read-only cache stays as it is, checked each run
            write_json_atomic({**meta, "digests": digests}, entry / ENTRY_NAME)
        signature = _signature(entry, [*names, ENTRY_NAME])
    if signature is not None and time.time() - max(s[-1] for s in signature) / 1e9 > RACY_S:
        _VERIFIED[str(entry)] = signature
        with contextlib.suppress(OSError):
            write_json_atomic({"signature": signature}, entry / VERIFIED_NAME)
    return True


def _signature(entry: Path, names: Sequence[str]) -> list[list[int]] | None:
    """What a change to the files leaves different: inode, size, modification and change times
    (a user can set the first time back, not the second)."""
    try:
        stats = [(entry / name).stat() for name in names]
    except OSError:
        return None
    return [[st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] for st in stats]


def _read_stamp(entry: Path) -> list[list[int]] | None:
    try:
        stamp = json.loads((entry / VERIFIED_NAME).read_text())
    except (OSError, ValueError):
        return None
    return stamp.get("signature") if isinstance(stamp, dict) else None


def set_aside(entry: Path) -> None:
    """Rename a damaged entry out of the way (so the next extraction recomputes it), with a warning."""
    target = entry.with_name(f"{DAMAGED_PREFIX}{entry.name}-{os.getpid()}")
    with contextlib.suppress(OSError):
        entry.rename(target)
        print(f"bench: warning: cache entry {entry} is damaged; set aside as {target.name}, recomputing",
              file=sys.stderr)


def open_array(entry: Path, layer: int, tokens: str) -> np.memmap:
    """Read-only memory map of one stored array (no data read until indexed)."""
    arr = np.load(entry / array_name(layer, tokens), mmap_mode="r")
    assert isinstance(arr, np.memmap)
    return arr


@dataclass
class EntryWriter:
    """Fills one entry's arrays, row range by row range, alone or beside other writers.

    A writer owns the rows `rows` (default: all). Several writers of one entry (Ray's row
    shards, on one node or many) share it safely: each holds `.lock` shared for its whole
    life (so `cache rm` refuses the entry), its own range's lock exclusively (so a second
    writer of the same range waits, then finds the rows done), and takes `.state.lock`
    only to create the arrays or record finished rows in `state.json` ("done": merged
    [start, stop) ranges). Whichever writer completes the coverage writes `entry.json`,
    once; until then nothing reads the entry as done. A killed writer's recorded rows stay,
    and the next writer of its range resumes after them.
    """

    path: Path
    material: dict[str, Any]
    layers: list[int]
    token_choices: list[str]
    n: int
    row_shapes: dict[str, tuple[int, ...]]
    rows: tuple[int, int] | None = None
    done: list[list[int]] = field(default_factory=list)
    _fds: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    _lock_fds: list[int] = field(default_factory=list)

    @property
    def n_done(self) -> int:
        """Rows of the entry on disk (all writers')."""
        return sum(b - a for a, b in self.done)

    @property
    def span(self) -> tuple[int, int]:
        return self.rows or (0, self.n)

    def open(self) -> "EntryWriter":
        """Lock the entry and this writer's rows, then reuse whatever rows earlier writers left."""
        lo, hi = self.span
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"rows {lo}..{hi} are not inside the entry's 0..{self.n}")
        while True:  # a `cache rm` holds the entry's lock: wait, and start afresh if it removed the entry
            self.path.mkdir(parents=True, exist_ok=True)
            fd = locked(self.path / LOCK_NAME, shared=True)
            if same_file(fd, self.path / LOCK_NAME):
                self._lock_fds.append(fd)
                break
            os.close(fd)
        self._lock_fds.append(locked(self.path / f".rows-{lo}-{hi}.lock"))  # a writer of these rows: wait
        with self._state_lock():
            if read_meta(self.path) is not None:  # finished by a writer we waited for: leave it alone
                self.done = [[0, self.n]]
                return self
            state = self._read_state()
            if state is None:
                self._create_arrays()
                self.done = []
                self._write_state()
            else:
                self.done = state["done"]
        for layer in self.layers:
            for tokens in self.token_choices:
                p = self.path / array_name(layer, tokens)
                fd = os.open(p, os.O_RDWR)
                self._fds[layer, tokens] = (fd, _data_offset(p))
        return self

    def todo(self) -> list[tuple[int, int]]:
        """This writer's rows not yet on disk, as [start, stop) runs in row order."""
        lo, hi = self.span
        out, at = [], lo
        for a, b in self.done:
            if b <= at or a >= hi:
                continue
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return out

    @contextlib.contextmanager
    def _state_lock(self) -> Iterator[None]:
        fd = locked(self.path / STATE_LOCK_NAME)
        try:
            yield
        finally:
            os.close(fd)

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads((self.path / STATE_NAME).read_text())
        except (OSError, ValueError):
            return None
        same = state.get("n") == self.n and state.get("row_shapes") == {k: list(v) for k, v in self.row_shapes.items()}
        files = all(_intact(self.path / array_name(l, v), (self.n, *self.row_shapes[v]))
                    for l in self.layers for v in self.token_choices)
        if not (same and files):  # a damaged partial entry starts afresh rather than failing every run
            return None
        if "done" not in state:  # a single writer's state of an earlier version: the first n_done rows
            state["done"] = [[0, int(state["n_done"])]] if state.get("n_done") else []
        return state

    def _create_arrays(self) -> None:
        for layer in self.layers:
            for tokens in self.token_choices:
                shape = (self.n, *self.row_shapes[tokens])
                p = self.path / array_name(layer, tokens)
                with open(p, "wb") as f:
                    np.lib.format.write_array_header_1_0(
                        f, {"descr": np.lib.format.dtype_to_descr(np.dtype(DTYPE)), "fortran_order": False,
                            "shape": shape})
                    f.truncate(f.tell() + int(np.prod(shape)) * np.dtype(DTYPE).itemsize)

    def _write_state(self) -> None:
        write_json_atomic({"n_done": self.n_done, "done": self.done, "n": self.n, "material": self.material,
                           "layers": self.layers, "views": self.token_choices,
                           "row_shapes": {k: list(v) for k, v in self.row_shapes.items()}, "updated": time.time()},
                          self.path / STATE_NAME)

    def write(self, start: int, arrays: dict[tuple[int, str], np.ndarray]) -> None:
        """Write rows [start, start + len) of every array, then record them as done."""
        count = 0
        for (layer, tokens), rows in arrays.items():
            fd, offset = self._fds[layer, tokens]
            rows = np.ascontiguousarray(rows, dtype=DTYPE)
            row_bytes = int(np.prod(self.row_shapes[tokens])) * rows.itemsize
            _pwrite_all(fd, rows.data.cast("B"), offset + start * row_bytes)
            count = len(rows)
        with self._state_lock():  # other writers record their rows too: merge with what is on disk now
            state = self._read_state()
            self.done = _merged([*(state["done"] if state else self.done), [start, start + count]])
            self._write_state()

    def finish(self, meta: dict[str, Any]) -> bool:
        """Flush this writer's rows; if every row of the entry is now on disk, make the entry
        complete (entry.json written last, once). True when the entry is complete."""
        for fd, _ in self._fds.values():
            os.fsync(fd)  # before another writer (perhaps on another node) declares the entry complete
        with self._state_lock():
            if read_meta(self.path) is not None:
                return True
            state = self._read_state()
            self.done = state["done"] if state else self.done
            if self.n_done != self.n:  # the ranges are merged and inside the entry: all rows iff n_done == n
                return False
            digests = {array_name(l, v): file_sha256(self.path / array_name(l, v))  # every writer's rows, on disk
                       for l in self.layers for v in self.token_choices}
            write_json_atomic({"format_version": FORMAT_VERSION, "material": self.material, "layers": self.layers,
                               "views": self.token_choices, "n": self.n, "digests": digests, **meta},
                              self.path / ENTRY_NAME)
            (self.path / STATE_NAME).unlink(missing_ok=True)
            return True

    def close(self) -> None:
        for fd, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for fd in reversed(self._lock_fds):
            os.close(fd)  # releases the flocks
        self._lock_fds.clear()


def _merged(ranges: list[list[int]]) -> list[list[int]]:
    """Sorted, disjoint [start, stop) ranges covering the same rows."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _intact(path: Path, shape: tuple[int, ...]) -> bool:
    """An array file with this shape's header and all its bytes (a crash or a truncation leaves neither)."""
    try:
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
            stored, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            offset = f.tell()
        size = path.stat().st_size
    except (OSError, ValueError):
        return False
    nbytes = int(np.prod(shape)) * np.dtype(DTYPE).itemsize
    return stored == shape and not fortran and dtype == np.dtype(DTYPE) and size >= offset + nbytes


def _data_offset(path: Path) -> int:
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        return f.tell()
