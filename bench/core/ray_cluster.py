"""What every `--executor ray` command shares: connecting to Ray quietly, and proving that
every node sees the files the tasks will open by path.

Importing this module imports Ray (the `ray` extra); only the `--executor ray` paths do.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.core.errors import BenchError

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:  # named by require_ray
    ray = None  # type: ignore[assignment]

EXECUTORS = ("local", "ray")
#: Retries of a task whose worker process died (Ray's `max_retries`); exceptions are not retried.
MAX_RETRIES = 3
HINT = "put it on storage every Ray worker sees (the same path on every node)"


def require_ray(executor: str, address: str | None = None) -> None:
    """Refuse an unknown executor, `ray` when the extra is not installed, or an address nothing
    answers at (`check_reachable`), before a command makes any folder."""
    if executor not in EXECUTORS:
        raise BenchError(f"executor: unknown {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if executor == "ray" and ray is None:
        raise BenchError("executor: ray is not installed; pip install 'bindingbench[ray]'")
    if executor == "ray" and address:
        check_reachable(address)


@contextlib.contextmanager
def session(address: str | None) -> Iterator[None]:
    """Ray, connected: reuse an initialised one (tests, notebooks), else connect to `address`
    (None: a local Ray on this machine's cores) and shut it down on exit. Ray's logging and
    the workers' output stay off the driver's terminal (tasks keep their own logs)."""
    if ray.is_initialized():
        yield
        return
    if address:
        check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = address or "a local Ray"
        raise BenchError(f"address: cannot start or reach {where}: {str(e).splitlines()[0]}") from None
    try:
        yield
    finally:
        ray.shutdown()


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse a `host:port` address (bare or `ray://`) nothing answers at, within `timeout`
    seconds: `ray.init` waits for a head that is not there for minutes. "auto" and
    addresses without a port are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as e:
        raise BenchError(f"address: nothing answers at {address} ({e.strerror or e}); start Ray there "
                         "(`ray start --head`) or leave --address out for a local Ray") from None


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_every_node(problem: Callable[..., str | None], *args: Any) -> None:
    """Run `problem(*args)` on every alive node; the first problem it names (a sentence, None
    when that node sees what it must) stops the run in one line."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    probe = ray.remote(num_cpus=0, max_retries=MAX_RETRIES)(problem)
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(*args)
            for n in nodes]
    for found in ray.get(refs):
        if found:
            raise BenchError(f"storage: {found}; {HINT}")


def unreadable(path: Path, digest: str) -> str | None:
    """What this node cannot see: the same bytes at `path` (None when it reads them)."""
    try:
        same = file_digest(path) == digest
    except OSError:
        same = False
    return None if same else f"the Ray worker on {socket.gethostname()} cannot read {path}"
