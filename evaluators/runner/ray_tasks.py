"""How the Ray path (`evaluators.runner.ray_executor`) runs its tasks: the options each asks for, the
cluster session, the check that every worker sees the dataset and the activation cache, fault
injection, each task's captured log, and gathering results as they arrive.

Workers read the dataset and the activation cache by path: both must be on storage every
worker sees, which `check_storage` proves at start (a token the driver writes must be
readable from every node). A task whose worker dies is retried (`MAX_RETRIES`); each task's
captured output is written to `<results>/logs/<run_id>/<task>.log`.

Importing this module imports Ray: only the `--executor ray` path does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.core.dataset import CARD_NAME, Dataset
from bench.core.errors import BenchError
from bench.core.ray_cluster import MAX_RETRIES, check_every_node, file_digest, ray, require_ray, session, unreadable
from evaluators.cache import entries

#: Fault injection: "<stage>:<marker file>" with stage `extract` or `train`. The first task of
#: that stage to create the marker kills its own worker process (extract: after its first
#: batch of rows is on disk; train: after its first seed's rows); retries find the marker.
FAULT_ENV = "BINDINGBENCH_FAULT"
#: Seconds between two rewrites of the results file while tasks finish.
WRITE_EVERY_S = 10.0


def check_options(executor: str, task: str, gpus_per_task: float | None, address: str | None = None) -> None:
    """Refuse an unknown executor, a missing Ray, an address nothing answers at, or negative GPUs."""
    require_ray(executor, address)
    if gpus_per_task is not None and gpus_per_task < 0:
        raise BenchError(f"gpus-per-task: must be ≥ 0, got {gpus_per_task}")


def task_gpus(device: str, gpus_per_task: float | None) -> float:
    """GPUs a task asks for: `gpus_per_task`, else 1 for cuda, 0 for cpu, and for auto 1
    when the cluster has GPUs (the driver may run on a node without one)."""
    if gpus_per_task is not None:
        if gpus_per_task > 0 and device == "cpu":
            raise BenchError("gpus-per-task: --device cpu tasks use no GPU; drop --gpus-per-task or use --device cuda")
        if gpus_per_task == 0 and device == "cuda":
            raise BenchError("gpus-per-task: --device cuda tasks need a GPU share above 0, e.g. 0.5")
        return gpus_per_task
    if device == "cuda":
        return 1.0
    if device == "auto":
        return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    return 0.0


def check_storage(dataset: Path, cache_root: Path) -> None:
    """Every alive node must read this dataset's card (the same bytes) and a token the driver
    writes into the activation cache, and write there; else one line names the node."""
    cache_root.mkdir(parents=True, exist_ok=True)
    token_file = cache_root / f".ray-storage-check-{uuid.uuid4().hex}"
    token_file.write_text(uuid.uuid4().hex)
    try:
        check_every_node(_storage_problem, str(dataset / CARD_NAME), file_digest(dataset / CARD_NAME),
                         str(token_file), file_digest(token_file))
    finally:
        token_file.unlink(missing_ok=True)


def _storage_problem(card: str, card_digest: str, token_file: str, token_digest: str) -> str | None:
    """What this node cannot see or write, in words (None when it sees everything)."""
    host = socket.gethostname()
    if unreadable(Path(card), card_digest):
        return f"the Ray worker on {host} cannot read dataset {Path(card).parent}"
    cache_dir = Path(token_file).parent
    if unreadable(Path(token_file), token_digest):
        return f"the Ray worker on {host} does not see the driver's activation cache {cache_dir}"
    try:
        probe = Path(f"{token_file}-{host}-{os.getpid()}")
        probe.write_text("")
        probe.unlink()
    except OSError:
        return f"the Ray worker on {host} cannot write to the activation cache {cache_dir}"
    return None


def arm_fault(stage: str) -> bool:
    """True once per marker file: this task is the one that dies (see FAULT_ENV)."""
    value = os.environ.get(FAULT_ENV, "")
    if not value.startswith(f"{stage}:"):
        return False
    try:
        os.close(os.open(value.split(":", 1)[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def die() -> None:
    """Kill this worker process at once, as a crash or an OOM kill would (no cleanup)."""
    sys.stderr.flush()
    os._exit(1)


def in_task(name: str, gpus: float, body: Callable[[], Any]) -> tuple[Any, str]:
    """Run `body` as one task: one torch thread on CPU tasks, everything it prints and logs
    captured into the log returned beside its result."""
    import torch

    if not gpus:
        torch.set_num_threads(1)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logging.getLogger().addHandler(handler)
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            print(f"{name}: host {platform.node()} pid {os.getpid()} gpus {gpus} torch threads {torch.get_num_threads()}")
            result = body()
            print(f"{name}: done in {time.perf_counter() - t0:.1f} s")
    finally:
        logging.getLogger().removeHandler(handler)
    return result, buf.getvalue()


def slots(gpus: float) -> int:
    """Tasks the cluster runs at once: its CPUs, or its GPUs over each task's share."""
    res = ray.cluster_resources()
    return int(res.get("GPU", 0) / gpus) if gpus else int(res.get("CPU", 1))


def _unwrap(error: Exception) -> BaseException:
    """The task's own exception inside Ray's wrapper (or the Ray error itself)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


@dataclass
class Cluster:
    """What every task of one run shares."""

    gpus: float  # each task's GPU share (0: a CPU task)
    dev: str
    dataset: Path
    cache_root: Path
    logs: Path
    tasks: dict[Any, tuple[str, str]] = field(default_factory=dict)  # waited-on ref -> (task name, backbone)

    def remote(self, fn: Callable[..., Any], **extra: Any) -> Any:
        return ray.remote(fn).options(**task_options(self.gpus), **extra)


def task_options(gpus: float) -> dict[str, Any]:
    """Ray options of every task: one CPU, `gpus` of a GPU (fractions share one), retried when
    its worker dies, and the fault-injection variable passed on (see FAULT_ENV)."""
    env = {FAULT_ENV: os.environ[FAULT_ENV]} if os.environ.get(FAULT_ENV) else {}
    return dict(num_cpus=1, num_gpus=gpus, max_retries=MAX_RETRIES, runtime_env={"env_vars": env} if env else None)


@contextlib.contextmanager
def cluster(ds: Dataset, device: str, gpus_per_task: float | None, address: str | None, results_dir: Path,
             run_id: str) -> Iterator[Cluster]:
    """Ray connected, storage checked on every node, the run's log folder made."""
    logs = Path(results_dir) / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    # Ray prints the raylet's messages (e.g. a worker that died, before its retry) on stdout,
    # which holds the command's data: they go to the run's driver log instead.
    with open(logs / "driver.log", "a") as driver_log, contextlib.redirect_stdout(driver_log), session(address):
        gpus = task_gpus(device, gpus_per_task)
        dataset, cache_root = ds.path.resolve(), entries.cache_root().resolve()
        check_storage(dataset, cache_root)
        yield Cluster(gpus, "cuda" if gpus else "cpu", dataset, cache_root, logs)


def gather(c: Cluster, units: set[Any], extracted: dict[str, list[Any]], progress: bool,
            arrived: Callable[[Any, Any, BaseException | None], int],
            checkpoint: Callable[[], Any] | None) -> None:
    """Wait for every task under one progress bar and write each task's log. A finished unit
    (a task in `units`) goes to `arrived(ref, result, None)`; a unit whose backbone's
    extraction failed to `arrived(ref, None, that error)`, as the local path turns a backbone
    that fails to run into error rows. `checkpoint` runs every WRITE_EVERY_S, and on a failure."""
    failed: dict[str, BaseException] = {}  # backbone -> why its extraction failed
    pending = list(c.tasks)
    last_write, n_rows = time.monotonic(), 0
    with _bar(progress, len(pending)) as bar:
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ref = done[0]
                name, spec = c.tasks[ref]
                log_file = c.logs / f"{_safe(name)}.log"
                error = None
                try:
                    out = ray.get(ref)
                    result, log = out if ref in units else (None, out)
                except Exception as e:  # noqa: BLE001 — a failed extraction becomes error rows, as locally
                    cause = _unwrap(e)
                    log_file.write_text(f"{name} failed:\n{e}\n")
                    if isinstance(cause, BenchError):
                        raise cause from None
                    upstream = failed.get(spec) or _extraction_error(extracted[spec])
                    if upstream is None:
                        why = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
                        raise BenchError(f"ray: task {name} failed: {why}; its log: {log_file}") from None
                    failed[spec] = error = upstream
                    result = None
                else:
                    log_file.write_text(log)
                if ref in units:
                    n_rows += arrived(ref, result, error)
                bar.advance(1)
                bar.describe(f"ray tasks · {n_rows} rows")
                if checkpoint and ref in units and time.monotonic() - last_write >= WRITE_EVERY_S:
                    checkpoint()
                    last_write = time.monotonic()
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            if checkpoint:
                checkpoint()
            raise
    if progress:
        from bench.core.console import stderr

        stderr.print(f"per-task logs in {c.logs}", soft_wrap=True, markup=False, highlight=False)


def _extraction_error(acts: list[Any]) -> BaseException | None:
    """The exception of a backbone's failed extraction task, if one failed."""
    for ref in acts:
        try:
            ray.get(ref)
        except Exception as e:  # noqa: BLE001
            return _unwrap(e)
    return None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextlib.contextmanager
def _bar(enabled: bool, total: int) -> Any:
    if not enabled:
        yield _Silent()
        return
    from bench.core.console import progress_bar

    with progress_bar("ray tasks · 0 rows", total) as bar:
        yield bar


class _Silent:
    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass
