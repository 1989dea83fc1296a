"""`bench evaluate --executor ray`: the local run's units of work as Ray tasks.

Only the binding task's two units move, unchanged: extraction, one task per (backbone, split)
calling `extract_activations` (each split is one cache entry, filled through the cache's own
locked, resumable protocol: `entry.json` is written last, so an attempt killed mid-entry
leaves rows that the retry resumes from and that nothing reads as done), and training,
one task per (backbone, layer, view) calling `run.binding_rows` for each of its seeds (all
families of a seed share one pass over the cached rows). Training tasks take the extraction
results as arguments, so Ray starts them as soon as their backbone's splits are cached.
The driver plans, skips finished rows and writes `results/<run_id>.parquet` exactly as the
local path does, in the local path's row order, so the file differs only in provenance and
wall times.

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
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.dataset import CARD_NAME, Dataset
from bench.errors import BenchError
from bench.ray_cluster import MAX_RETRIES, check_every_node, file_digest, ray, require_ray, session, unreadable
from bench.results import write_run
from evaluators import cache
from evaluators.training import TrainConfig

#: Fault injection: "<stage>:<marker file>" with stage `extract` or `train`. The first task of
#: that stage to create the marker kills its own worker process (extract: after its first
#: batch of rows is on disk; train: after its first seed's rows); retries find the marker.
FAULT_ENV = "BINDINGBENCH_FAULT"
#: Seconds between two rewrites of the results file while tasks finish.
WRITE_EVERY_S = 10.0
SPLITS = ("train", "val", "test")


def check_options(executor: str, task: str, gpus_per_task: float | None) -> None:
    """Refuse an unknown executor, a missing Ray, a task Ray does not run, or negative GPUs."""
    require_ray(executor)
    if task != "binding":
        raise BenchError(f"executor: --executor ray runs the binding task; run --task {task} with --executor local")
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


def _arm_fault(stage: str) -> bool:
    """True once per marker file: this task is the one that dies (see FAULT_ENV)."""
    value = os.environ.get(FAULT_ENV, "")
    if not value.startswith(f"{stage}:"):
        return False
    try:
        os.close(os.open(value.split(":", 1)[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _die() -> None:
    """Kill this worker process at once, as a crash or an OOM kill would (no cleanup)."""
    sys.stderr.flush()
    os._exit(1)


def _in_task(name: str, gpus: float, body: Callable[[], Any]) -> tuple[Any, str]:
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


def _extract(spec: str, dataset: str, split: str, layers: list[int], views: list[str], device: str, dtype: str,
             limit: int | None, cache_dir: str, gpus: float) -> tuple[Any, str]:
    """One extraction unit: a backbone's activations of one split, into the shared cache."""
    from evaluators.extract import extract_activations

    def body() -> Any:
        if _arm_fault("extract"):
            write = cache.EntryWriter.write

            def write_then_die(self: cache.EntryWriter, start: int, arrays: dict) -> None:
                write(self, start, arrays)
                print(f"fault injection: killing this worker after rows {start}..{self.n_done}")
                _die()

            cache.EntryWriter.write = write_then_die  # this process only, and it is about to end
        acts = extract_activations(spec, Dataset(Path(dataset)), split, layers=layers, views=views, device=device,
                                   dtype=dtype, cache_dir=Path(cache_dir), progress=False, limit=limit)
        print(f"activations: {acts.path}")
        return acts

    return _in_task(f"extract {spec} {split}", gpus, body)


def _train(common: dict[str, Any], acts_train: Any, acts_val: Any, acts_test: Any, task_data: Any, layer: int,
           shown: list[str], units: list[tuple[int, list[str]]], base_train: TrainConfig, dtype: str,
           limit: int | None, gpus: float) -> tuple[list[dict[str, Any]], str]:
    """One training unit: every (seed, families) of one (backbone, layer, view)."""
    from evaluators.run import binding_rows

    acts = {"train": acts_train, "val": acts_val, "test": acts_test}

    def body() -> list[dict[str, Any]]:
        die = _arm_fault("train")
        rows: list[dict[str, Any]] = []
        for seed, fams in units:
            rows += binding_rows(common, acts, task_data, layer, shown, seed, fams, replace(base_train, seed=seed),
                                 dtype, limit, progress=False)
            print(f"seed {seed}: {', '.join(fams)} trained")
            if die:
                print("fault injection: killing this worker after its first seed")
                _die()
        return rows

    return _in_task(f"train {common['backbone']} layer {layer} {shown[0]}", gpus, body)


def _unwrap(error: Exception) -> BaseException:
    """The task's own exception inside Ray's wrapper (or the Ray error itself)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def run_binding(plans: Sequence[Any], ds: Dataset, *, unanchored: bool, prov: dict[str, Any], test_fp: str,
                base_train: TrainConfig, device: str, dtype: str, limit: int | None, results_dir: Path,
                run_id: str, progress: bool, address: str | None, gpus_per_task: float | None) -> Path | None:
    """The binding rows of `plans` (backbones with rows to do), computed by Ray tasks."""
    from evaluators.run import binding_common, binding_task

    if not plans:
        return None
    logs = Path(results_dir) / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    # Ray prints the raylet's messages (e.g. a worker that died, before its retry) on stdout,
    # which holds the command's data: they go to the run's driver log instead.
    with open(logs / "driver.log", "a") as driver_log, contextlib.redirect_stdout(driver_log), session(address):
        gpus = task_gpus(device, gpus_per_task)
        dev = "cuda" if gpus else "cpu"
        dataset, cache_root = ds.path.resolve(), cache.cache_root().resolve()
        check_storage(dataset, cache_root)
        task_data = binding_task(ds, limit, unanchored)
        prov = {**prov, "device": dev}
        base_train = replace(base_train, device=dev)
        env = {FAULT_ENV: os.environ[FAULT_ENV]} if os.environ.get(FAULT_ENV) else {}
        opts = dict(num_cpus=1, num_gpus=gpus, max_retries=MAX_RETRIES,
                    runtime_env={"env_vars": env} if env else None)
        extract = ray.remote(_extract).options(num_returns=2, **opts)
        train = ray.remote(_train).options(**opts)
        data_ref = ray.put(task_data)
        tasks: dict[Any, tuple[str, str]] = {}  # waited-on ref -> (task name, backbone)
        units: list[tuple[Any, Any, dict, list]] = []  # (ref, plan, common, todo) in the local row order
        extracted: dict[str, list[Any]] = {}  # backbone -> its splits' Activations refs
        for plan in plans:
            acts = {}
            for s in SPLITS:
                acts[s], log = extract.remote(plan.spec, str(dataset), s, plan.layers, plan.views, dev, dtype, limit,
                                              str(cache_root), gpus)
                tasks[log] = (f"extract-{plan.spec}-{s}", plan.spec)
            extracted[plan.spec] = list(acts.values())
            common = binding_common(prov, plan, ds, test_fp, limit, task_data)
            groups: dict[tuple[int, str], list[tuple]] = {}
            for item in plan.todo:  # (layer, view, seed, fams), layer-major as the local loop
                groups.setdefault(item[:2], []).append(item)
            for (layer, view), todo in groups.items():
                ref = train.remote(common, *(acts[s] for s in SPLITS), data_ref, layer, plan.shown(view),
                                   [(seed, fams) for _, _, seed, fams in todo], base_train, dtype, limit, gpus)
                tasks[ref] = (f"train-{plan.spec}-L{layer}-{view}", plan.spec)
                units.append((ref, plan, common, todo))
        return _gather(tasks, units, extracted, results_dir, run_id, logs, progress)


def _gather(tasks: dict[Any, tuple[str, str]], units: list[tuple[Any, Any, dict, list]],
            extracted: dict[str, list[Any]], results_dir: Path, run_id: str, logs: Path,
            progress: bool) -> Path | None:
    """Wait for every task under one progress bar, write each task's log, rewrite the results
    file (in the local order) as rows arrive, and turn a failed extraction into error rows."""
    rows_of: dict[Any, list[dict[str, Any]]] = {}
    unit_of = {u[0]: u for u in units}
    failed: dict[str, BaseException] = {}  # backbone -> why its extraction failed
    pending = list(tasks)
    last_write, n_rows = time.monotonic(), 0

    def write() -> Path | None:
        rows = [r for ref, *_ in units if ref in rows_of for r in rows_of[ref]]
        return write_run(rows, results_dir, run_id) if rows else None

    with _bar(progress, len(pending)) as bar:
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ref = done[0]
                name, spec = tasks[ref]
                log_file = logs / f"{_safe(name)}.log"
                try:
                    out = ray.get(ref)
                    result, log = out if ref in unit_of else (None, out)
                except Exception as e:  # noqa: BLE001 — a failed extraction becomes error rows, as locally
                    cause = _unwrap(e)
                    log_file.write_text(f"{name} failed:\n{e}\n")
                    if isinstance(cause, BenchError):
                        raise cause from None
                    upstream = failed.get(spec) or _extraction_error(extracted[spec])
                    if upstream is None:
                        why = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
                        raise BenchError(f"ray: task {name} failed: {why}; its log: {log_file}") from None
                    failed[spec] = upstream
                    result = None
                else:
                    log_file.write_text(log)
                if ref in unit_of:
                    rows_of[ref] = result if result is not None else _error_rows(unit_of[ref], failed[spec])
                    n_rows += len(rows_of[ref])
                bar.advance(1)
                bar.describe(f"ray tasks · {n_rows} rows")
                if ref in unit_of and time.monotonic() - last_write >= WRITE_EVERY_S:
                    write()
                    last_write = time.monotonic()
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            write()
            raise
    path = write()
    if progress:
        from bench.commands.common import stderr

        stderr.print(f"per-task logs in {logs}", soft_wrap=True, markup=False, highlight=False)
    return path


def _error_rows(unit: tuple[Any, Any, dict, list], error: BaseException) -> list[dict[str, Any]]:
    from evaluators.run import extraction_error_rows

    _, plan, common, todo = unit
    return extraction_error_rows(common, plan, todo, error)


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
    from bench.commands.common import progress_bar

    with progress_bar("ray tasks · 0 rows", total) as bar:
        yield bar


class _Silent:
    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

