"""Output destinations, checked before any long work starts.

A command that renders, trains or extracts for minutes and only then finds it cannot
write its output has wasted all of it; these checks touch nothing and fail in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from bench.core.errors import BenchError


def output_path(value: str | os.PathLike, what: str) -> Path:
    """`value` as a path, an empty one (or only spaces) refused: `Path("")` is the working
    directory, so an empty `--out` would write there, or fail later with a traceback."""
    if not os.fspath(value).strip():
        raise BenchError(f"{what}: empty; name the file or folder to write")
    return Path(value)


def check_output_file(path: str | os.PathLike, what: str, suffixes: Sequence[str] = ()) -> Path:
    """Refuse an output file that could not be written: a wrong suffix, a directory in its
    place, a parent that is missing, not a directory, or not writable. Returns the path."""
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise BenchError(f"{what}: {p} must end in {' or '.join(suffixes)}")
    if p.is_dir():
        raise BenchError(f"{what}: {p} is a directory; name a file inside it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise BenchError(f"{what}: cannot write {p}: {parent} {problem}")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise BenchError(f"{what}: cannot write {p} (permission denied or read-only filesystem)")
    return p


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """Refuse, creating nothing, an output directory that could not be made or written:
    its nearest existing ancestor must be a writable directory. Returns the path."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise BenchError(f"{what}: {p} exists and is not a directory")
    where = p.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        raise BenchError(f"{what}: cannot write {p}: {where} is not a writable directory")
    return p
