"""What the GPU benchmark times in its own process: the dataset it makes, extraction, and the fits of
row sets on one device (a row set, the stack of a backbone's row sets with its wall split by fit
stage, attention, the oracles' power), each stopped at its phase's share (a part of
`benchmarks/gpu.py`; the CPU path's worker processes are `gpu_pool`'s)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

import evaluators.fitting as fitting
from bench.core.dataset import Dataset
from benchmarks import gpu_budget
from evaluators.backbones import Backbone
from evaluators.tasks.binding.columns import evaluate_binding, evaluate_binding_sets
from evaluators.cache.extract import extract_activations
from evaluators.fitting import RowReader, TrainConfig
from generators.base import build_config, get_generator
from generators.engine import generate

SPLITS = ("train", "val", "test")
MODEL, PIXELS = "random:dinov2-small", "pixels"
ORACLES = ("oracle:objects", "oracle:features", "oracle:mix-0.5")


def make_dataset(root: Path, n_train: int, n_eval: int, image_size: int, seed: int) -> Dataset:
    """The small preset at `image_size` px; below 128 px its objects and margins shrink with the
    image (16 and 4 px at 128), so that its 18 objects still fit a tiny test image."""
    gen = get_generator("colorshape")
    shrink = {"object_size": max(2, 16 * image_size // 128), "margin": max(1, 4 * image_size // 128)} \
        if image_size < 128 else {}
    cfg = build_config(gen, "small", {"n_train": n_train, "n_val": n_eval, "n_test": n_eval,
                                      "image_size": image_size, "seed": seed, **shrink})
    generate(gen, cfg, root / "small", workers=os.cpu_count() or 1)
    return Dataset(root / "small")


def extract(spec: str | Backbone, ds: Dataset, layers: str, token_choices: list[str], device: str, dtype: str,
            cache: Path, input_size: int | None = None) -> tuple[dict, float]:
    """Every split's activations and the seconds they took (a fresh cache: nothing is read back).
    A resolved `spec` is built once, outside the time, not once per split."""
    t0 = gpu_budget.now()
    acts = {s: extract_activations(spec, ds, s, layers=layers, token_choices=token_choices, device=device, dtype=dtype,
                                   image_size=input_size, cache_dir=cache, progress=False) for s in SPLITS}
    if device == "cuda":
        torch.cuda.synchronize()
    return acts, gpu_budget.now() - t0


def fit(acts: dict, task, layer: int, tokens: str, families: list[str], device: str) -> tuple[float, dict]:
    """(wall s, β* per family) of one row set, at the evaluator's default settings on `device`."""
    return fit_inputs({s: RowReader(a.get(layer, tokens)) for s, a in acts.items()}, task, families, device)


def fit_inputs(inputs: dict, task, families: list[str], device: str) -> tuple[float, dict]:
    """`fit` of a row set's readers."""
    t0 = gpu_budget.now()
    res = evaluate_binding(inputs, task, families, train=TrainConfig(device=device), n_boot=200)
    if device == "cuda":
        torch.cuda.synchronize()
    return gpu_budget.now() - t0, {f: _num(r.metrics.get("beta_star")) for f, r in res.items()}


def _num(x) -> float | None:
    return None if x is None or x != x else round(float(x), 4)


#: The CUDA caching allocator's counters a fit's `split_of` reads the change of: device allocations
#: (`cudaMalloc`) and frees, retries after a failed allocation (each frees the cache and waits for the
#: device), and waits on every stream.
ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


@contextmanager
def split_of(device: str) -> Iterator[dict]:
    """Where a fit's wall time went, without a profiler (a profiled process's first fit was only
    0.3 s slower than its warm one, where this run's first was 1.3-1.6 s slower: what differs is
    the process the fit runs in, so it is read in this one): host seconds in each fit stage (the
    `stage_label`s; no wait for the device at their edges, so a stage's queued work may finish in
    the next), before the first stage (building and copying the probes) and after the last (the
    metrics); the garbage collector's pauses; and on CUDA the allocator's counters that grew
    (`ALLOCATOR_COUNTS`). The dict yielded is filled when the block ends."""
    got: dict = {}
    stages: dict[str, float] = {}
    edges: list[float] = []
    label = fitting.stage_label

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        t0 = gpu_budget.now()
        with label(name):
            yield
        edges.extend((t0, gpu_budget.now()))
        stages[name] = stages.get(name, 0.0) + edges[-1] - t0

    pauses: list[float] = []

    def collector(phase: str, info: dict) -> None:
        if phase == "start":
            pauses.append(-gpu_budget.now())
        elif pauses:
            pauses[-1] += gpu_budget.now()

    counts = torch.cuda.memory_stats if device == "cuda" else dict
    before = counts()
    fitting.stage_label = timed
    gc.callbacks.append(collector)
    start = gpu_budget.now()
    try:
        yield got
    finally:
        stop = gpu_budget.now()
        gc.callbacks.remove(collector)
        fitting.stage_label = label
    after = counts()
    got["stages_s"] = {k: round(v, 3) for k, v in stages.items()}
    if edges:
        got["before_stages_s"], got["after_stages_s"] = round(min(edges) - start, 3), round(stop - max(edges), 3)
    got["gc_s"], got["gc_pauses"] = round(sum(t for t in pauses if t > 0), 3), len(pauses)
    got.update({k: after.get(k, 0) - before.get(k, 0) for k in ALLOCATOR_COUNTS if k in after})


def fit_stack(acts: dict, task, row_sets: list[tuple[int, str]], families: list[str], device: str,
              allowance: float) -> dict:
    """Every row set fitted as one batched problem (`evaluate_binding_sets`, as `bench evaluate`
    fits a backbone), stopped at `allowance` s; each row set's time is its share of the whole."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent", "row_sets_total": len(row_sets)}
    inputs = [{s: RowReader(a.get(layer, tokens)) for s, a in acts.items()} for layer, tokens in row_sets]
    t0 = gpu_budget.now()
    try:
        with gpu_budget.deadline(allowance), split_of(device) as split:
            results = evaluate_binding_sets(inputs, task, families, train=TrainConfig(device=device), n_boot=200)
            if device == "cuda":
                torch.cuda.synchronize()
    except gpu_budget.OutOfBudget:
        return {"status": "stopped", "reason": f"the stack was still fitting at this phase's {allowance:.0f} s",
                "seconds_at_least": round(gpu_budget.now() - t0, 2), "row_sets_total": len(row_sets)}
    wall = gpu_budget.now() - t0
    keys = [f"{layer}/{tokens}" for layer, tokens in row_sets]
    share = round(wall / len(row_sets), 3)
    return {"status": "done", "row_sets_total": len(row_sets), "row_sets_done": len(row_sets),
            "seconds": round(wall, 2), "per_row_set_s": share, "all_row_sets_s": round(wall, 2),
            "all_row_sets_extrapolated": False, "stacked": True, "split": split, "times": {k: share for k in keys},
            "beta": {k: {f: _num(r.metrics.get("beta_star")) for f, r in res.items()}
                     for k, res in zip(keys, results)}}


def fit_attention(acts: dict, task, layer: int, device: str, allowance: float) -> dict:
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent"}
    t0 = gpu_budget.now()
    try:
        with gpu_budget.deadline(allowance):
            wall, beta = fit(acts, task, layer, "all", ["attention"], device)
    except gpu_budget.OutOfBudget:
        return {"status": "stopped", "reason": f"still training at this phase's {allowance:.0f} s",
                "seconds_at_least": round(gpu_budget.now() - t0, 2)}
    return {"status": "done", "seconds": round(wall, 2), "beta_star": beta["attention"]}


def power(ds: Dataset, task, families: list[str], device: str, cache: Path, allowance: float) -> dict:
    """β* of each oracle's cls row set (extraction included in its time)."""
    out: dict = {"status": "done", "beta": {}, "seconds": 0.0}
    start = gpu_budget.now()
    for spec in ORACLES:
        left = allowance - (gpu_budget.now() - start)
        if left <= 0:
            out.update(status="partial" if out["beta"] else "skipped", reason=f"budget spent before {spec}")
            break
        try:
            with gpu_budget.deadline(left):
                acts, _ = extract(spec, ds, "last", ["cls"], device, "fp32", cache)
                _, beta = fit(acts, task, acts["train"].layers[-1], "cls", families, device)
        except gpu_budget.OutOfBudget:
            out.update(status="partial" if out["beta"] else "stopped", reason=f"{spec} stopped at {allowance:.0f} s")
            break
        out["beta"][spec] = beta
    out["seconds"] = round(gpu_budget.now() - start, 2)
    return out
