"""Environment variables set for a block: what child processes started in it inherit."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Mapping


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in this process's environment for the block, then each variable as before (unset
    where it was unset)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
