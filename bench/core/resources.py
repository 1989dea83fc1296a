"""Free memory and disk, read before a command starts work it could not finish.

A size a user can type (an image side, a scene count) is checked here against what the
machine has, so `--image-size 100000` ends in one line naming the largest size that fits
instead of a MemoryError, or the machine swapping, minutes into a run. The estimates are
lower bounds of what the work needs: a size they refuse cannot work, a size they accept may
still be too large for other reasons, never the other way round.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from bench.core.errors import BenchError

#: Bytes of memory an image pixel needs at least while a scene is made: the RGB image (3)
#: and its 8-bit instance mask (1), before any copy a renderer or an encoder makes.
PIXEL_BYTES = 4
#: Deflate's best ratio (258-byte matches in 2 bits): no PNG of n pixels at 8 bits is smaller
#: than n / 1032 bytes.
_DEFLATE_MAX_RATIO = 1032
#: What a scene's row holds besides its two PNGs (codes, content hash, metadata), at least.
_ROW_BYTES = 256


def available_memory() -> int:
    """Bytes of memory new work can take without swapping: the kernel's MemAvailable, else the
    free pages (systems without /proc)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_disk(path: Path) -> tuple[Path, int]:
    """The nearest existing folder of `path` (what will hold it) and its free bytes."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return where, shutil.disk_usage(where).free


def min_scene_bytes(side: int) -> int:
    """The fewest bytes a stored scene of `side` x `side` pixels can take: its image and mask
    as PNGs compressed as far as deflate can, plus its row."""
    return _ROW_BYTES + 2 * (side * side // _DEFLATE_MAX_RATIO)


def largest_side(budget: int, bytes_of: Callable[[int], int]) -> int:
    """The largest image side whose `bytes_of(side)` fits `budget` (0 when none does);
    `bytes_of` grows with the side."""
    lo, hi = 0, max(1, math.isqrt(max(budget, 0)))  # every estimate here costs at least a byte a pixel
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bytes_of(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


#: The units `parse_size` reads, in bytes: binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB).
SIZE_UNITS = {"": 1, "b": 1, **{p + "ib": 1024 ** (k + 1) for k, p in enumerate("kmgt")},
              **{p + "b": 1000 ** (k + 1) for k, p in enumerate("kmgt")}}


def parse_size(text: str, what: str = "memory budget") -> int:
    """Bytes of a size a user typed: plain bytes (`1073741824`) or a number and a unit (`1GiB`,
    `512MiB`, `1.5GB`; `SIZE_UNITS`, any case). Anything else, or a size under one byte, is a
    `BenchError` naming `what`, so that `--memory-budget 1 GiB` fails in one line, not a traceback."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match.group(2).lower()
    if not match or unit not in SIZE_UNITS:
        raise BenchError(f"{what}: expected bytes or a size such as 512MiB or 1GiB, got {text!r}")
    size = int(float(match.group(1)) * SIZE_UNITS[unit])
    if size < 1:
        raise BenchError(f"{what}: must be at least one byte, got {text!r}")
    return size


def gib(n: float) -> str:
    """Bytes as a message shows them: GiB with one decimal."""
    return f"{n / 2**30:,.1f} GiB"


#: The errors of a disk (or a quota) that is full: no retry helps until space is freed.
_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a full disk: an OSError, or a library's wrapper of
    one, such as safetensors' `... (os error 28)`, whose cause Rust keeps only in the text."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL:
            return True
        if any(f"(os error {code})" in str(e) for code in _FULL):
            return True
        e = e.__cause__ or e.__context__
    return False
