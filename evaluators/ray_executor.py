"""`bench evaluate --executor ray`: the local run's units of work as Ray tasks.

The local path's units of work move, unchanged. Extraction: one task per (backbone, row
shard) calling `extract_activations` on its rows (each split is one cache entry, which the
shards' writers fill at once through the cache's own locked, resumable protocol: `entry.json`
is written last, by whichever shard completes the entry, so an attempt killed mid-shard
leaves rows that the retry resumes from and that nothing reads as done; shards start on
batch boundaries, so every image goes through the model in the local path's batch). Binding
training: one task per (backbone, layer, view) calling `run.binding_rows` for each of its
seeds (all families of a seed share one pass over the cached rows). IsSameObject: one task
per (backbone, layer) calling `issameobject.evaluate_activations` on that layer. Training
tasks take the extraction results as arguments, so Ray starts them as soon as their
backbone's shards are cached.
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from bench.core.dataset import CARD_NAME, Dataset
from bench.core.errors import BenchError
from bench.core.ray_cluster import MAX_RETRIES, check_every_node, file_digest, ray, require_ray, session, unreadable
from bench.core.results import write_run
from evaluators import cache
from evaluators.extract import BATCH_SIZE, extract_activations, is_complete, row_shards
from evaluators.training import TrainConfig

#: Fault injection: "<stage>:<marker file>" with stage `extract` or `train`. The first task of
#: that stage to create the marker kills its own worker process (extract: after its first
#: batch of rows is on disk; train: after its first seed's rows); retries find the marker.
FAULT_ENV = "BINDINGBENCH_FAULT"
#: Seconds between two rewrites of the results file while tasks finish.
WRITE_EVERY_S = 10.0
SPLITS = ("train", "val", "test")
#: The largest row shard: a retried shard redoes at most this many rows.
MAX_SHARD_ROWS = 4096


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


def _extract(spec: str, run_id: str, dataset: str, split: str, rows: tuple[int, int], layers: list[int],
             views: list[str], device: str, dtype: str, limit: int | None, cache_dir: str,
             gpus: float) -> tuple[Any, str]:
    """One extraction unit: a backbone's activations of one row shard, into the split's shared
    cache entry (see `cache.EntryWriter`: several shards' writers fill it at once)."""

    def body() -> Any:
        if _arm_fault("extract"):
            write = cache.EntryWriter.write

            def write_then_die(self: cache.EntryWriter, start: int, arrays: dict) -> None:
                write(self, start, arrays)
                n = len(next(iter(arrays.values())))
                print(f"fault injection: killing this worker after rows {start}..{start + n}")
                _die()

            cache.EntryWriter.write = write_then_die  # this process only, and it is about to end
        acts = extract_activations(_backbone(spec, run_id), Dataset(Path(dataset)), split, layers=layers, views=views,
                                   device=device, dtype=dtype, cache_dir=Path(cache_dir), progress=False, limit=limit,
                                   rows=rows, batch_size=BATCH_SIZE)
        print(f"activations: rows {rows[0]}..{rows[1]} of {acts.n} in {acts.path}")
        return acts

    return _in_task(f"extract {spec} {split} rows {rows[0]}..{rows[1]}", gpus, body)


#: The backbone this worker process last built, keyed by (spec, run id): a worker that runs
#: several shards of one backbone builds (or loads) the model once. One at a time, to bound memory.
_BUILT: dict[tuple[str, str], Any] = {}


def _backbone(spec: str, run_id: str) -> Any:
    from evaluators.backbones import resolve_backbone

    if (spec, run_id) not in _BUILT:
        _BUILT.clear()
        _BUILT[spec, run_id] = resolve_backbone(spec)
    return _BUILT[spec, run_id]


class BindingSteps(NamedTuple):
    """The binding row makers the Ray path runs exactly as the local loop does. `evaluators.run`
    passes its own, so this module never imports run (which imports this one): no cycle."""

    task: Callable[..., Any]  # binding_task(ds, limit, unanchored, control)
    common: Callable[..., dict[str, Any]]  # binding_common(prov, plan, ds, test_fp, limit, task_data)
    error_rows: Callable[..., list[dict[str, Any]]]  # extraction_error_rows(common, plan, todo, error)
    rows: Callable[..., list[dict[str, Any]]]  # binding_rows(common, acts, task_data, layer, shown, seed, ...)


def _train(binding_rows: Callable[..., list[dict[str, Any]]], common: dict[str, Any], task_data: Any, layer: int,
           shown: list[str], units: list[tuple[int, list[str]]],
           base_train: TrainConfig, dtype: str, limit: int | None, gpus: float, n_shards: list[int],
           *shard_acts: Any) -> tuple[list[dict[str, Any]], str]:
    """One training unit: every (seed, families) of one (backbone, layer, view). `shard_acts`
    are the splits' shard results in SPLITS order (`n_shards` each): Ray starts this task only
    when all of them are done, so each split's entry is complete."""
    acts = _entries(n_shards, shard_acts)

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


def _entries(n_shards: list[int], shard_acts: Sequence[Any]) -> dict[str, Any]:
    """Each split's Activations, from its shards' results (`n_shards` each, in SPLITS order):
    a task that took them all as arguments starts when every shard is done, so every entry
    is complete."""
    firsts = [sum(n_shards[:i]) for i in range(len(SPLITS))]
    acts = {s: shard_acts[i] for s, i in zip(SPLITS, firsts)}
    for s, a in acts.items():
        if not is_complete(a):
            raise RuntimeError(f"the {s} activations at {a.path} are incomplete after all their shards finished")
    return acts


def _pairs_layer(spec: str, run_id: str, dataset: str, layer: int, probes: list[str], seeds: list[int], device: str,
                 dtype: str, epochs: int | None, exclude_background: bool, limit: int | None, gpus: float,
                 n_shards: list[int], *shard_acts: Any) -> tuple[list[dict[str, Any]], str]:
    """One IsSameObject unit: every probe and seed at one (backbone, layer), the rows
    `evaluate_issameobject` gives for that layer."""
    from evaluators.issameobject import evaluate_activations, pair_configs, wants_qk

    acts = {s: replace(a, layers=[layer]) for s, a in _entries(n_shards, shard_acts).items()}

    def body() -> list[dict[str, Any]]:
        pc, tc = pair_configs(device, epochs, exclude_background)
        ds = Dataset(Path(dataset))
        qk = _backbone(spec, run_id).bind(ds).attention_qk if wants_qk(probes) else None
        rows = evaluate_activations(acts, ds, probes=probes, seeds=seeds, pair_config=pc,
                                    train_config=tc, limit=limit, progress=False, extra_config={"dtype": dtype},
                                    attention_qk=qk)
        print(f"{len(rows)} rows: {', '.join(probes)} x seeds {', '.join(map(str, seeds))}")
        return rows

    return _in_task(f"issameobject {spec} layer {layer}", gpus, body)


def shard_plan(n: int, slots: int) -> list[tuple[int, int]]:
    """Row shards of one split: about two per slot that can run at once (so uneven splits and
    backbones still balance), at least a batch and at most MAX_SHARD_ROWS rows each."""
    return row_shards(n, min(MAX_SHARD_ROWS, -(-n // (2 * max(1, slots)))), BATCH_SIZE)


def _slots(gpus: float) -> int:
    """Tasks the cluster runs at once: its CPUs, or its GPUs over each task's share."""
    res = ray.cluster_resources()
    return int(res.get("GPU", 0) / gpus) if gpus else int(res.get("CPU", 1))


def _unwrap(error: Exception) -> BaseException:
    """The task's own exception inside Ray's wrapper (or the Ray error itself)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


@dataclass
class _Cluster:
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
def _cluster(ds: Dataset, device: str, gpus_per_task: float | None, address: str | None, results_dir: Path,
             run_id: str) -> Iterator[_Cluster]:
    """Ray connected, storage checked on every node, the run's log folder made."""
    logs = Path(results_dir) / "logs" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    # Ray prints the raylet's messages (e.g. a worker that died, before its retry) on stdout,
    # which holds the command's data: they go to the run's driver log instead.
    with open(logs / "driver.log", "a") as driver_log, contextlib.redirect_stdout(driver_log), session(address):
        gpus = task_gpus(device, gpus_per_task)
        dataset, cache_root = ds.path.resolve(), cache.cache_root().resolve()
        check_storage(dataset, cache_root)
        yield _Cluster(gpus, "cuda" if gpus else "cpu", dataset, cache_root, logs)


def _submit_extraction(c: _Cluster, plans: Sequence[Any], run_id: str, shards: dict[str, list[tuple[int, int]]],
                       dtype: str, limit: int | None) -> dict[str, list[Any]]:
    """One task per row shard of every split of every backbone, submitted before any unit that
    reads them and largest first (so no worker waits while another finishes a long shard);
    each backbone's Activations refs, in SPLITS order."""
    extract = c.remote(_extract, num_returns=2)
    order = sorted(((plan, s, rows) for plan in plans for s in SPLITS for rows in shards[s]),
                   key=lambda t: t[2][0] - t[2][1])  # stable: equal sizes keep backbone, split order
    refs: dict[tuple[str, str, tuple[int, int]], Any] = {}
    for plan, s, rows in order:
        acts, log = extract.remote(plan.spec, run_id, str(c.dataset), s, rows, plan.layers, plan.views, c.dev,
                                   dtype, limit, str(c.cache_root), c.gpus)
        c.tasks[log] = (f"extract-{plan.spec}-{s}-{rows[0]}-{rows[1]}", plan.spec)
        refs[plan.spec, s, rows] = acts
    return {plan.spec: [refs[plan.spec, s, rows] for s in SPLITS for rows in shards[s]] for plan in plans}


def run_binding(plans: Sequence[Any], ds: Dataset, *, unanchored: bool, prov: dict[str, Any], test_fp: str,
                base_train: TrainConfig, device: str, dtype: str, limit: int | None, results_dir: Path,
                run_id: str, progress: bool, address: str | None, gpus_per_task: float | None,
                steps: BindingSteps, control: str | None = None) -> Path | None:
    """The binding rows of `plans` (backbones with rows to do), computed by Ray tasks; the
    results file is rewritten, in the local path's row order, as rows arrive."""
    if not plans:
        return None
    with _cluster(ds, device, gpus_per_task, address, results_dir, run_id) as c:
        task_data = steps.task(ds, limit, unanchored, control)
        prov = {**prov, "device": c.dev}
        base_train = replace(base_train, device=c.dev)
        train = c.remote(_train)
        data_ref = ray.put(task_data)
        units: dict[Any, tuple[Any, dict, list]] = {}  # ref -> (plan, common, todo), in the local row order
        shards = {s: shard_plan(len(task_data.codes[s][1]), _slots(c.gpus)) for s in SPLITS}
        extracted = _submit_extraction(c, plans, run_id, shards, dtype, limit)
        for plan in plans:
            common = steps.common(prov, plan, ds, test_fp, limit, task_data)
            groups: dict[tuple[int, str], list[tuple]] = {}
            for item in plan.todo:  # (layer, view, seed, fams), layer-major as the local loop
                groups.setdefault(item[:2], []).append(item)
            for (layer, view), todo in groups.items():
                seeds = [(seed, fams) for _, _, seed, fams in todo]
                ref = train.remote(steps.rows, common, data_ref, layer, plan.shown(view), seeds, base_train, dtype,
                                   limit, c.gpus,
                                   [len(shards[s]) for s in SPLITS], *extracted[plan.spec])
                c.tasks[ref] = (f"train-{plan.spec}-L{layer}-{view}", plan.spec)
                units[ref] = (plan, common, todo)
        rows_of: dict[Any, list[dict[str, Any]]] = {}

        def arrived(ref: Any, rows: list[dict[str, Any]] | None, error: BaseException | None) -> int:
            plan, common, todo = units[ref]
            rows_of[ref] = plan.stamp(rows if error is None else steps.error_rows(common, plan, todo, error))
            return len(rows_of[ref])

        def write() -> Path | None:
            rows = [r for ref in units if ref in rows_of for r in rows_of[ref]]
            return write_run(rows, results_dir, run_id) if rows else None

        _gather(c, set(units), extracted, progress, arrived, write)
        return write()


def run_issameobject(work: Sequence[tuple[Any, list[int], list[str]]], ds: Dataset, *, seeds: Sequence[int],
                     device: str, dtype: str, epochs: int | None, exclude_background: bool, limit: int | None,
                     results_dir: Path, run_id: str, progress: bool, address: str | None,
                     gpus_per_task: float | None) -> dict[str, list[dict[str, Any]] | BaseException]:
    """IsSameObject rows of each (plan, layers, probes) in `work`, as `evaluate_issameobject`
    returns them (in its order), or the exception its extraction raised: extraction in row
    shards, then one task per (backbone, layer) training all probes and seeds."""
    out: dict[str, list[dict[str, Any]] | BaseException] = {}
    if not work:
        return out
    with _cluster(ds, device, gpus_per_task, address, results_dir, run_id) as c:
        layer_task = c.remote(_pairs_layer)
        units: dict[Any, str] = {}
        shards = {s: shard_plan(ds.num_rows(s) if limit is None else min(limit, ds.num_rows(s)), _slots(c.gpus))
                  for s in SPLITS}
        extracted = _submit_extraction(c, [plan for plan, _, _ in work], run_id, shards, dtype, limit)
        for plan, layers, probes in work:
            out[plan.spec] = []
            for layer in layers:
                ref = layer_task.remote(plan.spec, run_id, str(c.dataset), layer, probes, list(seeds), c.dev, dtype,
                                        epochs, exclude_background, limit, c.gpus, [len(shards[s]) for s in SPLITS],
                                        *extracted[plan.spec])
                c.tasks[ref] = (f"issameobject-{plan.spec}-L{layer}", plan.spec)
                units[ref] = plan.spec

        def arrived(ref: Any, rows: list[dict[str, Any]] | None, error: BaseException | None) -> int:
            spec = units[ref]
            if error is not None:
                out[spec] = error
            elif not isinstance(out[spec], BaseException):
                out[spec] += rows
            return len(rows or [])

        _gather(c, set(units), extracted, progress, arrived, None)
    seed_at = {s: i for i, s in enumerate(seeds)}
    for plan, _, probes in work:  # the local order: seed, then layer, then probe
        rows = out[plan.spec]
        if not isinstance(rows, BaseException):
            probe_at = {p: i for i, p in enumerate(probes)}
            rows.sort(key=lambda r, at=probe_at: (seed_at[r["seed"]], r["layer"], at[r["probe"]]))
    return out


def _gather(c: _Cluster, units: set[Any], extracted: dict[str, list[Any]], progress: bool,
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

