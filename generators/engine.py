"""Writes a generator's scenes to a dataset directory, in parallel, resumably.

Every scene is drawn from its own seed, derived from (global seed, split, index),
and shards have fixed row ranges, so the bytes written do not depend on how many
workers ran or in which order they finished. With fewer than two shards a worker, each
shard is cut into row ranges that the workers render and this process writes, so
`--workers` is used even when a split is one shard. The folder's manifest (`bench.core.outdir`)
records the config of an unfinished run and the shards it writes: re-running the same
command reuses finished shards (and renders a damaged one again); the card, written
last, is what makes the directory a dataset.

`--overwrite` replaces only a directory that is a BindingBench dataset: the new one
is built beside it and swapped in once complete, so a crash at any point leaves the
old dataset or the new one, never neither, and nothing else is ever deleted. One
writer at a time: a second run into the same folder is refused while the first holds
its lock. Workers die with the parent (parent-death signal), however the parent ends.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

import bench
from bench.core.dataset import CARD_NAME, SCHEMA_VERSION, encode_scene, row_schema, shard_name, write_json_atomic, write_parquet_atomic
from bench.core.errors import BenchError
from bench.core.hashing import config_hash, derive_seed, fingerprint
from bench.core.outdir import DatasetTarget, check_target
from bench.core.resources import available_memory, free_disk, gib, largest_side, min_scene_bytes
from bench.core.versions import package_versions
from generators.base import CommonConfig, SceneGenerator, config_to_dict, get_generator

#: What the engine holds of each scene until the card is written: its content hash (a 64-character
#: str, 113 bytes) and the list slot that points to it.
HASH_BYTES = 120

Progress = Callable[[int], None]


def scene_seed(seed: int, split: str, index: int) -> int:
    """The seed of one scene: a function of the global seed, the split and the index only."""
    return derive_seed("scene", seed, split, index)


def generate(
    gen_cls: type[SceneGenerator],
    config: CommonConfig,
    out: Path,
    *,
    workers: int = 1,
    overwrite: bool = False,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
    shards: Callable[..., Iterator[tuple[tuple[str, int, int, int], list[str]]]] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Generate one dataset (no sweep expansion) into `out` and return its card.

    `on_start(total_rows)` is called once planning succeeded (config validated).
    `shards(name, config, work_dir, manifest, tasks)`, when given, renders the shards instead of
    local workers (e.g. `generators.ray_shards`), yielding (task, content hashes) as they finish.
    `say` hears one-line notes (a damaged shard of an interrupted run rendered again).
    """
    if workers < 1:
        raise BenchError(f"workers: must be ≥ 1, got {workers}")
    gen = gen_cls(config)  # validates and plans before any file is touched
    out = Path(out)
    total = sum(plan.n for plan in gen.plans.values())
    check_target(out, overwrite)
    check_resources(gen_cls, config, out, workers)
    tasks = [(split, shard, shard * config.shard_size, min(plan.n, (shard + 1) * config.shard_size))
             for split, plan in gen.plans.items() for shard in range(math.ceil(plan.n / config.shard_size))]
    settings = config_to_dict(config)
    target = DatasetTarget(out, config_hash([gen_cls.name, gen_cls.version, settings]), overwrite=overwrite,
                           about={"generator": gen_cls.name, "version": gen_cls.version, **settings})
    try:
        target.record([shard_name(split, shard) for split, shard, _, _ in tasks])
        work = target.work
        if on_start:
            on_start(total)
        hashes: dict[tuple[str, int], list[str]] = {}

        def todo() -> Iterator[tuple[str, int, int, int]]:
            """Shards still to write: those an earlier, interrupted run of the same config left
            whole are read back instead."""
            for task in tasks:
                done = _finished_shard(work / shard_name(*task[:2]), task[3] - task[2], say)
                if done is None:
                    yield task
                    continue
                hashes[task[:2]] = done
                if progress:
                    progress(task[3] - task[2])

        workers = min(workers, max(total, 1))  # more processes than scenes would only start idle
        if shards is not None:
            for task, shard_hashes in shards(gen_cls.name, config, work, target.manifest, todo()):
                hashes[task[:2]] = shard_hashes
                if progress:
                    progress(task[3] - task[2])
        elif workers == 1:
            _WORKER["gen"] = gen
            for task in todo():
                hashes[task[:2]] = _write_shard(work, task, progress)
        else:
            _render_in_pool(gen, work, todo(), workers, pieces_per_shard(len(tasks), workers), hashes, progress)
        card = _card(gen, work, hashes)
        write_json_atomic(card, work / CARD_NAME)
        target.commit()
    finally:
        target.close()  # a failed run keeps its files: the same command resumes them
    return card


def _finished_shard(path: Path, n: int, say: Callable[[str], None] | None) -> list[str] | None:
    """The content hashes of a shard an interrupted run wrote, or None when it is to be
    written: missing, or damaged since (it is ours, by the manifest: rendered again)."""
    if not path.exists():
        return None
    try:
        found = pq.read_table(path, columns=["content_hash"])["content_hash"].to_pylist()
    except (OSError, KeyError, pa.ArrowException):
        found = None
    if found is not None and len(found) == n and all(isinstance(h, str) for h in found):
        return found
    (say or _stderr)(f"warning: {path} is damaged; rendering it again")
    path.unlink()
    return None


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


Task = tuple[str, int, int, int]  # split, shard, first row, end row


def pieces_per_shard(n_shards: int, workers: int) -> int:
    """How many pieces each shard is cut into, so that `workers` processes have about two units
    of work each: 1 when the shards alone are enough (a worker then writes its shard itself)."""
    return 1 if n_shards >= 2 * workers else math.ceil(2 * workers / max(n_shards, 1))


def _render_in_pool(gen: SceneGenerator, work: Path, tasks: Iterator[Task], workers: int, pieces: int,
                    hashes: dict[tuple[str, int], list[str]], progress: Progress | None) -> None:
    """Render `tasks` in `workers` processes. With `pieces` > 1 (fewer shards than workers keep
    busy) each shard is cut into row ranges rendered apart, and this process writes the shard
    once its pieces are back: every scene is seeded by its own index, so the rows, and the
    shard's bytes, are the same as one worker's."""
    ctx = get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(gen.name, gen.config, os.getpid())) as pool:
        pending: dict[Future, tuple[Task, int, int]] = {}
        parts: dict[tuple[str, int], dict[int, list[dict[str, Any]]]] = {}

        def collect() -> None:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                task, start, stop = pending.pop(fut)
                if pieces == 1:
                    hashes[task[:2]] = fut.result()
                else:
                    got = parts.setdefault(task[:2], {})
                    got[start] = fut.result()
                    if sum(map(len, got.values())) == task[3] - task[2]:
                        rows = [r for first in sorted(got) for r in got[first]]
                        hashes[task[:2]] = write_rows(gen, work, task[0], task[1], rows)
                        del parts[task[:2]]
                if progress:
                    progress(stop - start)

        for task in tasks:  # at most 2 units per worker in flight: bounded memory
            for start, stop in _cut(task[2], task[3], pieces):
                unit = pool.submit(_write_shard, work, task, None) if pieces == 1 else \
                    pool.submit(_render_piece, task[0], start, stop)
                pending[unit] = (task, start, stop)
                while len(pending) >= 2 * workers:
                    collect()
        while pending:
            collect()


def _cut(start: int, stop: int, pieces: int) -> list[tuple[int, int]]:
    """[start, stop) in at most `pieces` contiguous, nearly equal, non-empty row ranges."""
    edges = sorted({start + (stop - start) * k // pieces for k in range(pieces + 1)})
    return list(zip(edges[:-1], edges[1:]))


def check_resources(gen_cls: type[SceneGenerator], config: CommonConfig, out: Path, workers: int) -> None:
    """Refuse, before anything is written or rendered, a dataset this machine cannot make even
    at its smallest: its scenes on the disk under `out`, every scene's content hash in memory
    until the card is written, and one scene rendered in each worker at once. Each line names
    the limit that would fit."""
    # the image side first: an absurd one would otherwise read as too many scenes for the disk
    total = sum(config.split_sizes.values())
    memory = available_memory()
    at_once = max(1, min(workers, total))
    need = at_once * gen_cls.render_bytes(config)
    if need > memory:
        side = largest_side(memory // at_once, lambda s: gen_cls.render_bytes(replace(config, image_size=s)))
        limit = f"at most image_size {side:,} fits" if side >= 1 else "no image_size fits at this object_size"
        raise BenchError(f"image_size: {at_once} worker(s) rendering {config.image_size}-px scenes need at least "
                         f"{gib(need)} of memory, but {gib(memory)} is available; {limit} with {at_once} worker(s) "
                         "(fewer --workers fit more)")
    where, free = free_disk(out)
    per_scene = min_scene_bytes(config.image_size)
    if total * per_scene > free:
        raise BenchError(f"n_train: {total:,} scenes need at least {gib(total * per_scene)} on disk, but {where} has "
                         f"{gib(free)} free (room for at most {free // per_scene:,} scenes of {config.image_size} px); "
                         "generate fewer scenes or free space")
    if total * HASH_BYTES > memory:
        raise BenchError(f"n_train: {total:,} scenes need at least {gib(total * HASH_BYTES)} of memory while they are "
                         f"written, but {gib(memory)} is available (at most {memory // HASH_BYTES:,} scenes); "
                         "generate fewer scenes")


_WORKER: dict[str, SceneGenerator] = {}


def _init_worker(name: str, config: CommonConfig, parent: int) -> None:
    _die_with_parent(parent)
    _WORKER["gen"] = get_generator(name)(config)


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this worker when the parent dies, by any signal (SIGKILL
    included, which no handler in the parent could see); a worker whose parent is
    already gone exits at once."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _write_shard(out: Path, task: tuple[str, int, int, int], progress: Progress | None) -> list[str]:
    return write_shard(_WORKER["gen"], out, task, progress)


def _render_piece(split: str, start: int, stop: int) -> list[dict[str, Any]]:
    return render_rows(_WORKER["gen"], split, start, stop)


def write_shard(gen: SceneGenerator, out: Path, task: tuple[str, int, int, int],
                progress: Progress | None = None) -> list[str]:
    """Render one shard (split, shard, first row, end row) and write it atomically; its rows'
    content hashes. Every scene is seeded from (seed, split, index), so the bytes do not depend
    on which process, or machine, renders it."""
    split, shard, start, stop = task
    return write_rows(gen, out, split, shard, render_rows(gen, split, start, stop, progress))


def render_rows(gen: SceneGenerator, split: str, start: int, stop: int,
                progress: Progress | None = None) -> list[dict[str, Any]]:
    """The encoded rows of scenes [start, stop) of a split, each from its own seed."""
    rows = []
    for index in range(start, stop):
        seed = scene_seed(gen.config.seed, split, index)
        scene, h = gen.render(split, index, seed)
        rows.append(encode_scene(scene, space=gen.feature_space, split=split, index=index, seed=seed, h_o_given_f=h))
        if progress:
            progress(1)
    return rows


def write_rows(gen: SceneGenerator, out: Path, split: str, shard: int, rows: list[dict[str, Any]]) -> list[str]:
    """Write one shard's rows (in row order) atomically; their content hashes."""
    schema = row_schema(gen.object_fields, gen.scene_fields)
    write_parquet_atomic(pa.Table.from_pylist(rows, schema=schema), out / shard_name(split, shard))
    return [r["content_hash"] for r in rows]


def _card(gen: SceneGenerator, out: Path, hashes: dict[tuple[str, int], list[str]]) -> dict[str, Any]:
    splits = {}
    for split, plan in gen.plans.items():
        shards = sorted(k[1] for k in hashes if k[0] == split)
        names = [shard_name(split, s) for s in shards]
        info = {
            "n": plan.n,
            **plan.priors.to_dict(),
            "fingerprint": fingerprint(h for s in shards for h in hashes[(split, s)]),
            "shards": names,
            "shard_digests": {n: fingerprint(hashes[(split, s)]) for n, s in zip(names, shards)},
        }
        if gen.summary_columns:
            table = pa.concat_tables([pq.read_table(out / n, columns=list(gen.summary_columns)) for n in names])
            info.update(gen.summarize(split, table))
        splits[split] = info
    return {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": gen.name, "version": gen.version},
        "config": config_to_dict(gen.config),
        "seed": gen.config.seed,
        "feature_space": gen.feature_space.to_dict(),
        "splits": splits,
        "bench_version": bench.__version__,
        "package_versions": package_versions(),
    }
