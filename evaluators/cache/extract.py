"""Per-layer token activations of a dataset split, extracted once and cached
(docs/explanation/architecture.md, section 2).

All requested layers come from one forward pass per batch. Three stages overlap:
a loader thread reads and prepares batches (Parquet -> PNG decode -> resize ->
normalise), the calling thread runs the model, and a writer thread appends fp16
rows to the cache. Queues are bounded, so memory stays O(batch) whatever the
dataset size.
"""

from __future__ import annotations

import queue
import shutil
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np
import pyarrow as pa
import torch

from bench.core.dataset import Dataset, decode_image
from bench.core.errors import BenchError
from bench.core.results import check_writable
from evaluators.backbones import Backbone, BackboneInfo, resolve_backbone
from evaluators.cache import entries
from evaluators.cache.keys import check_device, check_dtype, gib, parse_layers, parse_tokens, split_fingerprint
from evaluators.probes.families import TOKEN_CHOICES

#: Images a model sees at once (every executor: the same batches give the same bits).
BATCH_SIZE = 32
_DONE = object()


@dataclass
class Activations:
    """Cached activations of one (backbone, dataset split): read-only fp16 memmaps."""

    info: BackboneInfo
    layers: list[int]
    n: int
    grid: tuple[int, int] | None
    token_choices: list[str]
    path: Path

    def get(self, layer: int, tokens: str) -> np.memmap:
        """Rows in dataset order: cls/mean (N, D), cls+mean (N, 2D), all (N, T, D) spatial tokens only."""
        if tokens not in TOKEN_CHOICES:
            raise BenchError(f"tokens: unknown {tokens!r}; allowed: {', '.join(TOKEN_CHOICES.names())}")
        if layer not in self.layers:
            raise BenchError(f"layer: {layer} was not extracted; available: {', '.join(map(str, self.layers))}")
        if tokens == "all" and self.grid is None:
            raise BenchError(f"tokens: {self.info.spec} has no spatial tokens, so no 'all'")
        if tokens in self.token_choices:
            return entries.open_array(self.path, layer, tokens)
        if entries.covers(self.token_choices, tokens):
            both = entries.open_array(self.path, layer, "cls+mean")
            d = both.shape[1] // 2
            return both[:, :d] if tokens == "cls" else both[:, d:]
        raise BenchError(f"tokens: {tokens!r} was not extracted; available: {', '.join(self.token_choices)}")


def resolve_device(device: str) -> torch.device:
    """The torch device `device` names, refused in one line when unknown or (cuda) absent."""
    check_device(device)
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("device: cuda requested but no CUDA device is available")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def dataset_side(dataset: Dataset, split: str) -> int:
    """Image side of a split (its first image; datasets are square)."""
    for batch in dataset.iter_batches(split, batch_size=1, columns=["image"]):
        return int(decode_image(batch.column("image")[0].as_py()).shape[0])
    raise BenchError(f"split: {split!r} of {dataset.path} has no rows")


def check_tokens(backbone: Backbone, dataset: Dataset, split: str, token_choices: Sequence[str],
                 resolution: str = "native", image_size: int | None = None) -> tuple[int, tuple[int, int] | None]:
    """The input side and token grid, after refusing tokens choices the backbone cannot give; cheap,
    so a run checks every backbone before it extracts anything."""
    info = backbone.info
    side = backbone.input_side(dataset_side(dataset, split), resolution, image_size)
    grid = backbone.grid(side)
    if "all" in token_choices and grid is None:
        raise BenchError(f"tokens: {info.spec} has no spatial tokens; use cls or mean")
    if info.cls_index is None and {"cls", "cls+mean"} & set(token_choices):
        raise BenchError(f"tokens: {info.spec} has no class token; use mean or all")
    return side, grid


def _entry_key(backbone: Backbone, dataset: Dataset, split: str, side: int, dtype: str,
               limit: int | None) -> tuple[str, dict[str, Any]]:
    """The cache base key of a split's activations, and the material it hashes."""
    info = backbone.info
    material = {
        "spec": info.spec, "revision": info.revision, "backbone": backbone.identity(), "side": side,
        "dataset": dataset.name, "fingerprint": split_fingerprint(dataset, split, limit), "split": split,
        "dtype": dtype,
    }
    # the spec string labels the entry but is not part of its identity: the weights are
    return entries.base_key({k: v for k, v in material.items() if k not in ("spec", "dataset")}), material


def pending_bytes(backbone: Backbone, dataset: Dataset, split: str, *, layers: Sequence[int],
                  token_choices: Sequence[str], dtype: str = "fp32", limit: int | None = None,
                  cache_dir: Path | None = None) -> int:
    """Bytes the cache entry of this request will take on disk, 0 when the cache already holds it:
    rows x layers x (tokens x width per choice) x 2 bytes (fp16)."""
    side, grid = check_tokens(backbone, dataset, split, token_choices)
    for lim in dict.fromkeys((None, limit)):  # a whole split's entry serves a limited request too
        key, _ = _entry_key(backbone, dataset, split, side, dtype, lim)
        if entries.find_complete(cache_dir, key, layers, token_choices) is not None:
            return 0
    n = min(dataset.num_rows(split), limit or dataset.num_rows(split))
    return entry_bytes(n, layers, token_choices, backbone.info.width, grid)


def entry_bytes(rows: int, layers: Sequence[int], token_choices: Sequence[str], width: int,
                grid: tuple[int, int] | None) -> int:
    """Bytes a cache entry of `rows` scenes takes: rows x layers x (tokens x width per choice) x 2
    (fp16); the one count behind `bench evaluate`'s disk check and a study's estimate."""
    per_row = sum(int(np.prod(s)) for s in _row_shapes(token_choices, width, grid).values())
    return rows * len(layers) * per_row * np.dtype(entries.DTYPE).itemsize


def check_cache_space(needed: int, cache_dir: Path | None = None, say: Callable[[str], None] | None = None) -> None:
    """Say how much the cache will grow and refuse, before any work, a cache the disk cannot hold or
    this process cannot write."""
    if needed <= 0:
        return
    root = entries.cache_root(cache_dir)
    check_writable(root, "cache ($BINDINGBENCH_CACHE)")  # else every backbone would fail into error rows
    probe = next(p for p in (root, *root.parents) if p.exists())
    free = shutil.disk_usage(probe).free
    where = f"activations cache {root}"
    if needed > free:
        raise BenchError(f"cache: this run needs ~{gib(needed)} in the {where} but only {gib(free)} is free; "
                         "free space, set $BINDINGBENCH_CACHE to a larger disk, or ask for fewer layers or tokens")
    if say is not None:
        say(f"{where}: this run adds ~{gib(needed)} ({gib(free)} free)")



#: One cache entry's request: (layers, tokens choices), as `extract_activations` takes them.
Selection = tuple[Union[str, Sequence[int]], Sequence[str]]


def extract_activations(
    spec: str | Backbone,
    dataset: Dataset,
    split: str,
    *,
    layers: str | Sequence[int] = "all",
    token_choices: Sequence[str] = ("cls",),
    **options: Any,
) -> Activations:
    """Activations of a split, from the cache when an entry covers the request, else extracted now.

    `spec` may also be an already resolved Backbone (the benchmark reuses one model).
    `limit` extracts only the first N rows (an entry of its own, keyed by their fingerprint);
    a cached entry of the whole split serves it too, so its arrays may hold more rows than
    `limit`: readers take the first N.
    `rows` (start, stop) extracts only that row shard into the split's entry, beside other
    writers of other shards (`row_shards`); the entry returned is complete only once every
    shard is (`is_complete`). The other options are `extract_selections`'.
    """
    return extract_selections(spec, dataset, split, [(layers, token_choices)], **options)[0]


def extract_selections(
    spec: str | Backbone,
    dataset: Dataset,
    split: str,
    selections: Sequence[Selection],
    *,
    device: str = "auto",
    dtype: str = "fp32",
    batch_size: int = BATCH_SIZE,
    resolution: str = "native",
    image_size: int | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
    limit: int | None = None,
    rows: tuple[int, int] | None = None,
) -> list[Activations]:
    """Each selection's activations (`extract_activations`' arguments otherwise), the missing ones
    from one forward pass: a study that reads every layer's pooled tokens and every token of one
    layer runs the model once, not once per selection. Each selection is its own cache entry, so
    a reader of either finds it as if it had been extracted alone, with the same bytes."""
    check_dtype(dtype)
    if batch_size < 1:
        raise BenchError(f"batch_size: must be ≥ 1, got {batch_size}")
    if limit is not None and limit < 1:
        raise BenchError(f"limit: must be ≥ 1, got {limit}")
    if not selections:
        raise BenchError("selections: give at least one (layers, tokens)")
    token_lists = [parse_tokens(tokens) for _, tokens in selections]  # before the model is built
    n = dataset.num_rows(split)
    limit = None if limit is None or limit >= n else limit
    backbone = (resolve_backbone(spec) if isinstance(spec, str) else spec).bind(dataset)
    info = backbone.info
    wanted = [(parse_layers(layers, info.n_layers), tokens) for (layers, _), tokens in zip(selections, token_lists)]
    side, grid = check_tokens(backbone, dataset, split, [t for _, tokens in wanted for t in tokens], resolution,
                              image_size)
    dev = resolve_device(device)
    key, material = _entry_key(backbone, dataset, split, side, dtype, limit)
    whole = None if limit is None else _entry_key(backbone, dataset, split, side, dtype, None)[0]
    # the whole split's entry, when cached, already holds a limited request's first rows
    found = [(whole and entries.find_complete(cache_dir, whole, layer_ids, tokens))
             or entries.find_complete(cache_dir, key, layer_ids, tokens) for layer_ids, tokens in wanted]
    if None in found and backbone.loaded() is not backbone:  # a recorded model: built to extract, keyed by itself
        return extract_selections(backbone.loaded(), dataset, split, selections, device=device, dtype=dtype,
                                  batch_size=batch_size, resolution=resolution, image_size=image_size,
                                  cache_dir=cache_dir, progress=progress, limit=limit, rows=rows)
    n = n if limit is None else limit
    if rows is not None and not (0 <= rows[0] < rows[1] <= n and rows[0] % batch_size == 0):
        raise BenchError(f"rows: {rows[0]}..{rows[1]} is not a row shard of {split}'s {n} rows starting on a batch "
                         f"boundary (a multiple of {batch_size})")
    # a selection asked for twice is one entry, with one writer (a second would wait on the first's lock)
    folders = {i: entries.activations_dir(cache_dir) / key / entries.selection_key(*wanted[i])
               for i, f in enumerate(found) if f is None}
    if folders:
        with ExitStack() as stack:
            writers = []
            for folder, i in {folder: i for i, folder in folders.items()}.items():
                layer_ids, tokens = wanted[i]
                shapes = _row_shapes(tokens, info.width, grid)
                writer = entries.EntryWriter(folder, material, layer_ids, tokens, n, shapes, rows=rows).open()
                stack.callback(writer.close)
                writers.append(writer)
            complete = _fill(backbone, dataset, split, side, writers, dev, dtype, batch_size, progress,
                             {"info": info.to_dict(), "grid": list(grid) if grid else None, "device": str(dev),
                              "batch_size": batch_size})
        if not all(complete) and rows is None:
            raise RuntimeError(f"extraction of {info.spec} {split} left the cache entry incomplete")
        for i, folder in folders.items():
            found[i] = folder
    out = []
    for (layer_ids, tokens), path in zip(wanted, found):
        meta = entries.read_meta(path)
        out.append(Activations(info=info, layers=layer_ids, n=n if meta is None else int(meta["n"]), grid=grid,
                               token_choices=list(meta["views"]) if meta else tokens, path=path))
    return out


def _fill(backbone: Backbone, dataset: Dataset, split: str, side: int, writers: list[entries.EntryWriter],
          dev: torch.device, dtype: str, batch_size: int, progress: bool, meta: dict[str, Any]) -> list[bool]:
    """Every writer's missing rows, writers missing the same rows from one forward pass each run
    (their layers together), then each finished with `meta` and its wall time; whether each
    entry is complete (a row shard's writer may finish before the others)."""
    groups: dict[tuple[tuple[int, int], ...], list[entries.EntryWriter]] = {}
    for w in writers:  # empty when another writer finished these rows while we waited
        groups.setdefault(tuple(w.todo()), []).append(w)
    if any(groups):
        backbone = backbone.to(dev, dtype)
    t0 = time.perf_counter()
    for todo, group in groups.items():
        with ExitStack() as stack:
            lo, hi = group[0].span
            advance = _progress(stack, progress and bool(todo), f"extract {backbone.info.spec} {split}", hi - lo,
                                hi - lo - sum(b - a for a, b in todo))
            for start, stop in todo:
                _run(backbone, dataset, split, side, group, batch_size, start, stop, advance)
    return [w.finish({**meta, "wall_s": round(time.perf_counter() - t0, 3)}) for w in writers]


def row_shards(n: int, rows_per_shard: int, batch_size: int = BATCH_SIZE) -> list[tuple[int, int]]:
    """[start, stop) shards of n rows, about `rows_per_shard` each, cut on batch boundaries."""
    size = max(batch_size, -(-rows_per_shard // batch_size) * batch_size)
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def is_complete(acts: Activations) -> bool:
    """Every row of the entry is on disk (a shard's writer returns it before the others finish)."""
    return entries.read_meta(acts.path) is not None


def _row_shapes(token_choices: Sequence[str], width: int, grid: tuple[int, int] | None) -> dict[str, tuple[int, ...]]:
    tokens = grid[0] * grid[1] if grid else 0
    shapes = {"cls": (width,), "mean": (width,), "cls+mean": (2 * width,), "all": (tokens, width)}
    return {v: shapes[v] for v in token_choices}


def select_tokens(h: torch.Tensor, info: BackboneInfo, token_choices: Sequence[str],
                  spatial: bool) -> dict[str, torch.Tensor]:
    """The requested tokens choices of one layer's tokens (B x T x D); registers are never spatial."""
    patches = h[:, info.n_prefix:]
    out: dict[str, torch.Tensor] = {}
    if info.cls_index is not None:
        out["cls"] = h[:, info.cls_index].float()
    out["mean"] = patches.float().mean(dim=1) if spatial else out["cls"]
    if "cls+mean" in token_choices:
        out["cls+mean"] = torch.cat([out["cls"], out["mean"]], dim=1)
    if "all" in token_choices:
        out["all"] = patches
    return {v: out[v] for v in token_choices}


def _run(backbone: Backbone, dataset: Dataset, split: str, side: int, writers: list[entries.EntryWriter],
         batch_size: int, start: int, stop: int, advance: Callable[[int], None]) -> None:
    """Rows [start, stop) through the three-stage pipeline: loader thread -> forward here (every
    writer's layers) -> writer thread (each writer its own layers and tokens)."""
    inputs: queue.Queue = queue.Queue(maxsize=2)
    outputs: queue.Queue = queue.Queue(maxsize=2)
    errors: list[BaseException] = []
    halt = threading.Event()
    spatial = backbone.grid(side) is not None
    layers = sorted({layer for w in writers for layer in w.layers})

    def load() -> None:
        try:
            for offset, rows in _batches(dataset, split, backbone.columns, batch_size, skip=start, stop=stop):
                if halt.is_set():
                    return
                inputs.put((offset, backbone.prepare(rows, side)))
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)
        finally:
            inputs.put(_DONE)

    def write(advance: Callable[[int], None]) -> None:
        while (item := outputs.get()) is not _DONE:
            if errors:  # keep consuming so the forward loop never blocks on a full queue
                continue
            offset, arrays = item
            try:
                for writer, part in zip(writers, arrays):
                    writer.write(offset, part)
                advance(len(next(iter(arrays[0].values()))))
            except BaseException as e:
                errors.append(e)
                halt.set()

    threads = [threading.Thread(target=load, daemon=True), threading.Thread(target=write, args=(advance,), daemon=True)]
    for t in threads:
        t.start()
    try:
        while (item := inputs.get()) is not _DONE and not halt.is_set():
            offset, x = item
            hs = dict(zip(layers, backbone.hidden_states(x, layers)))
            arrays = [{(layer, tokens): t.to(torch.float16).cpu().numpy() for layer in w.layers
                       for tokens, t in select_tokens(hs[layer], backbone.info, w.token_choices, spatial).items()}
                      for w in writers]
            outputs.put((offset, arrays))
    finally:
        halt.set()
        _drain(inputs)
        outputs.put(_DONE)
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    missing = [r for w in writers for r in w.todo() if r[0] < stop and r[1] > start]
    if missing:
        raise RuntimeError(f"extraction of rows {start}..{stop} left rows {missing[0][0]}..{missing[0][1]} unwritten")


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _progress(stack: ExitStack, enabled: bool, description: str, total: int, done: int) -> Callable[[int], None]:
    if not enabled:
        return lambda k: None
    from bench.core.console import progress_bar

    bar = stack.enter_context(progress_bar(description, total))
    bar.advance(done)
    return bar.advance


def _batches(dataset: Dataset, split: str, columns: Sequence[str], batch_size: int,
             skip: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict[str, list]]]:
    """(first row index, column -> values) batches in dataset order, rows `skip` to `stop`.

    Batches end at multiples of `batch_size` counted from the split's first row, whatever
    the shard files' sizes: a row range that starts on such a multiple (a Ray row shard)
    goes through the model in exactly the batches the whole split does, so its numbers
    are the same to the bit."""
    pending: pa.Table | None = None
    first = skip  # row index of pending's first row
    for batch in dataset.iter_batches(split, batch_size=batch_size, columns=list(columns), start=skip):
        if stop is not None:
            batch = batch.slice(0, max(0, stop - first - (pending.num_rows if pending is not None else 0)))
        part = pa.Table.from_batches([batch])
        pending = part if pending is None else pa.concat_tables([pending, part])
        while pending.num_rows >= (cut := (first // batch_size + 1) * batch_size - first):
            yield first, _columns(pending.slice(0, cut), columns)
            pending, first = pending.slice(cut), first + cut
        if stop is not None and first + pending.num_rows >= stop:
            break
    if pending is not None and pending.num_rows:
        yield first, _columns(pending, columns)


def _columns(table: pa.Table, columns: Sequence[str]) -> dict[str, list]:
    return {c: table.column(c).to_pylist() for c in columns}
