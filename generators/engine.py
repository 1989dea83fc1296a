"""Writes a generator's scenes to a dataset directory, in parallel, resumably.

Every scene is drawn from its own seed, derived from (global seed, split, index),
and shards have fixed row ranges, so the bytes written do not depend on how many
workers ran or in which order they finished. A marker file records the config of
an unfinished run: re-running the same command reuses finished shards; the card,
written last, is what makes the directory a dataset.
"""

from __future__ import annotations

import json
import math
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

import bench
from bench.dataset import CARD_NAME, SCHEMA_VERSION, encode_scene, row_schema, shard_name, write_json_atomic, write_parquet_atomic
from bench.errors import BenchError
from bench.hashing import config_hash, derive_seed, fingerprint
from bench.versions import package_versions
from generators.base import CommonConfig, SceneGenerator, config_to_dict, get_generator

MARKER = ".generating.json"

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
) -> dict[str, Any]:
    """Generate one dataset (no sweep expansion) into `out` and return its card.

    `on_start(total_rows)` is called once planning succeeded (config validated).
    """
    if workers < 1:
        raise BenchError(f"workers: must be ≥ 1, got {workers}")
    gen = gen_cls(config)  # validates and plans before any file is touched
    out = Path(out)
    _prepare_dir(out, config_hash([gen_cls.name, gen_cls.version, config_to_dict(config)]), overwrite)
    tasks = [
        (split, shard, shard * config.shard_size, min(plan.n, (shard + 1) * config.shard_size))
        for split, plan in gen.plans.items()
        for shard in range(math.ceil(plan.n / config.shard_size))
    ]
    if on_start:
        on_start(sum(plan.n for plan in gen.plans.values()))
    hashes: dict[tuple[str, int], list[str]] = {}
    todo = []
    for task in tasks:
        path = out / shard_name(task[0], task[1])
        if path.exists():  # finished by an earlier, interrupted run of the same config
            hashes[task[:2]] = pq.read_table(path, columns=["content_hash"])["content_hash"].to_pylist()
            if progress:
                progress(task[3] - task[2])
        else:
            todo.append(task)
    if workers == 1 or len(todo) <= 1:
        _WORKER["gen"] = gen
        for task in todo:
            hashes[task[:2]] = _write_shard(out, task, progress)
    else:
        ctx = get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(gen_cls.name, config)) as pool:
            futures = {pool.submit(_write_shard, out, task, None): task for task in todo}
            for fut in as_completed(futures):
                task = futures[fut]
                hashes[task[:2]] = fut.result()
                if progress:
                    progress(task[3] - task[2])
    card = _card(gen, out, hashes)
    write_json_atomic(card, out / CARD_NAME)
    (out / MARKER).unlink(missing_ok=True)
    return card


def _prepare_dir(out: Path, key: str, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise BenchError(f"out: {out} exists and is not a directory")
    marker = out / MARKER
    if (out / CARD_NAME).exists():
        if not overwrite:
            raise BenchError(f"out: {out} already holds a dataset; pass --overwrite to replace it")
        shutil.rmtree(out)
    elif marker.exists():
        try:
            same = json.loads(marker.read_text()).get("key") == key
        except (OSError, ValueError):
            same = False
        if not same:  # an unfinished run of another config: its shards are useless here
            shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        if not overwrite:
            raise BenchError(f"out: {out} is not empty and not a dataset; choose another directory or pass --overwrite")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for tmp in out.glob(".*.tmp-*"):
        tmp.unlink()
    if not marker.exists():
        write_json_atomic({"key": key}, marker)


_WORKER: dict[str, SceneGenerator] = {}


def _init_worker(name: str, config: CommonConfig) -> None:
    _WORKER["gen"] = get_generator(name)(config)


def _write_shard(out: Path, task: tuple[str, int, int, int], progress: Progress | None) -> list[str]:
    gen = _WORKER["gen"]
    split, shard, start, stop = task
    rows = []
    for index in range(start, stop):
        seed = scene_seed(gen.config.seed, split, index)
        scene, h = gen.render(split, index, seed)
        rows.append(encode_scene(scene, space=gen.feature_space, split=split, index=index, seed=seed, h_o_given_f=h))
        if progress:
            progress(1)
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
