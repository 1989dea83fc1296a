"""`bench generate --executor ray`: a dataset's shards rendered as Ray tasks.

A shard is the engine's unit already: fixed row range, scenes seeded from (seed, split,
index), written atomically (a temporary file renamed into place), so the bytes do not
depend on which worker rendered it, and a retried or half-written shard is never read as
done. The driver writes the card, as the local path does.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterable, Iterator

from bench.core.ray_cluster import MAX_RETRIES, check_every_node, file_digest, ray, session, unreadable
from generators.base import CommonConfig

Task = tuple[str, int, int, int]  # split, shard, first row, end row


def ray_shards(address: str | None):
    """The engine's `shards` runner for Ray at `address` (None: a local Ray)."""

    def run(name: str, config: CommonConfig, work: Path, manifest: Path, tasks: Iterable[Task]) -> Iterator[tuple[Task, list[str]]]:
        with session(address):
            check_every_node(_work_problem, str(manifest), file_digest(manifest))
            render = ray.remote(_render).options(num_cpus=1, max_retries=MAX_RETRIES)
            pending = {render.remote(name, config, str(work), task): task for task in tasks}
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                yield pending.pop(ref), ray.get(ref)

    return run


def _work_problem(manifest: str, digest: str) -> str | None:
    """What this node cannot see or write in the output directory (None when it can)."""
    found = unreadable(Path(manifest), digest)
    if found:
        return f"{found.replace('cannot read', 'does not see the output directory of')}"
    probe = Path(manifest).with_name(f".ray-write-check-{socket.gethostname()}-{os.getpid()}")
    try:
        probe.write_text("")
        probe.unlink()
    except OSError:
        return f"the Ray worker on {socket.gethostname()} cannot write to {Path(manifest).parent}"
    return None


#: The generator this worker process last built: its shards of one dataset share it (a 3D
#: generator holds a renderer and its meshes).
_BUILT: dict[tuple[str, str], object] = {}


def _render(name: str, config: CommonConfig, work: str, task: Task) -> list[str]:
    """One shard, in a Ray worker: the engine's own shard writer."""
    from generators.base import get_generator
    from generators.engine import write_shard

    key = (name, repr(config))
    if key not in _BUILT:
        _BUILT.clear()
        _BUILT[key] = get_generator(name)(config)
    return write_shard(_BUILT[key], Path(work), task)
