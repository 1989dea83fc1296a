"""Advisory file locks (`flock`): the kernel drops them when their holder dies, however it
dies, so a killed writer never leaves a folder locked and no stale-lock heuristics exist.

The activation cache locks its entries with these; dataset folders lock theirs (one
writer at a time, `bench.core.outdir`). A lock file is never deleted while it may be in use:
a process that waited for a lock checks that the path still names the file it locked
(`same_file`), since a remover may have replaced the folder meanwhile.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def locked(path: Path, shared: bool = False) -> int:
    """A descriptor holding a flock on `path` (created if missing), waiting for it."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    return fd


def try_lock(path: Path, create: bool = False) -> int | None:
    """A descriptor holding an exclusive flock on `path` without waiting; None when another
    process holds it. A missing file is created when `create`, else locked as /dev/null
    (nobody can hold a lock on a file that is not there)."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0))
    except FileNotFoundError:
        if create:
            raise
        return os.open(os.devnull, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)
