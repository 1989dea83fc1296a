"""The segmentation task's run (its `Task.runner`): per-patch heads on a layer's spatial tokens, one row
per (backbone, layer, head, seed), with the same provenance, keys and crash safety as the other tasks'
rows; and the library call `evaluate_segmentation` (any backbone, an intervened one included, reads
its tokens through `extract_activations` unchanged)."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import layer_row, write_run
from evaluators.fitting import resolve_device
from evaluators.runner.planning import BackbonePlan, backbone_plans, check_cache, effective_limit
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.run import local_threads, run_start
from evaluators.tasks.binding.rows import common_columns, extraction_failure
from evaluators.tasks.issameobject.evaluate import maybe_progress
from evaluators.tasks.segmentation import DEFAULT_HEADS, HEADS
from evaluators.tasks.segmentation.heads import HeadConfig, fit_head
from evaluators.tasks.segmentation.labels import class_names, split_labels
from evaluators.tasks.segmentation.metrics import class_counts, instance_scores, mean_iou, semantic_scores

SPLITS = ("train", "val", "test")


def validation_scores(name: str, pred: np.ndarray, labels: np.ndarray, n_classes: int) -> dict[str, float | None]:
    """A head's metrics on the validation images as `val_<metric>` point values (no interval: they
    choose a layer, they are not reported)."""
    if name == "semantic":
        inter, union = class_counts(pred, labels, n_classes)
        present = np.flatnonzero(np.bincount(labels.ravel(), minlength=n_classes) > 0)
        value = float(mean_iou(inter.sum(0).astype(np.float64), union.sum(0).astype(np.float64), present))
        return {"val_semantic_miou": value if np.isfinite(value) else None}
    scores = instance_scores(pred, labels, n_boot=1)
    return {"val_instance_miou": scores["instance_miou"], "val_instance_ari": scores["instance_ari"]}


def evaluate_layer(tokens: dict[str, np.ndarray], labels: dict[str, dict[str, np.ndarray]], heads: Sequence[str],
                   n_classes: int, config: HeadConfig, n_boot: int = 1000) -> list[dict[str, Any]]:
    """Fit and score every head at one layer: one metrics dict per head (a failed fit is an error row).
    `labels[split]` holds that split's "semantic" (classes) and "instance" (instance ids) maps."""
    out = []
    for name in heads:
        start = time.perf_counter()
        row: dict[str, Any] = {"probe": name, "n_train": len(tokens["train"]), "n_test": len(tokens["test"])}
        try:
            if not all(np.isfinite(t).all() for t in tokens.values()):
                raise FloatingPointError("the activations hold NaN or inf")
            n_out = n_classes if name == "semantic" else max(
                config.slots, *(len(np.unique(r)) for r in labels["train"]["instance"]))
            head = fit_head(name, (tokens["train"], labels["train"][name]), (tokens["val"], labels["val"][name]),
                            n_out, config)
            pred = head.predict(tokens["test"])
            truth = labels["test"][name]
            row.update(semantic_scores(pred, truth, n_classes, n_boot=n_boot, seed=config.seed) if name == "semantic"
                       else instance_scores(pred, truth, n_boot=n_boot, seed=config.seed))
            row.update(validation_scores(name, head.predict(tokens["val"]), labels["val"][name], n_classes))
            row.update(status="ok", error=None, best_epoch=head.best_epoch)
        except (BenchError, FloatingPointError, RuntimeError) as e:
            row.update(status="error", error=f"{type(e).__name__}: {e}".splitlines()[0])
        row["wall_time_s"] = time.perf_counter() - start
        out.append(row)
    return out


def evaluate_activations(acts: dict[str, Any], ds: Dataset, *, heads: Sequence[str] = DEFAULT_HEADS,
                         seeds: Sequence[int] = (0,), config: HeadConfig = HeadConfig(), limit: int | None = None,
                         progress: bool = True, n_boot: int = 1000,
                         extra_config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of `evaluate_segmentation` from per-split `Activations` (anything with `.info`,
    `.layers`, `.grid` and `.get(layer, "all")`)."""
    HEADS.check(heads)
    test = acts["test"]
    if test.grid is None:
        raise BenchError(f"segmentation: backbone {test.info.spec!r} has no spatial tokens (it needs a patch grid)")
    labels = {}
    for s in SPLITS:
        instances, classes = split_labels(ds, s, test.grid, limit)
        labels[s] = {"instance": instances, "semantic": classes}
    n_classes, info = len(class_names(ds)), test.info
    rows = []
    with maybe_progress(progress, f"segmentation {info.spec}", len(test.layers) * len(seeds)) as bar:
        for seed in seeds:
            cfg_seed = replace(config, seed=int(seed))
            for layer in test.layers:
                tokens = {s: acts[s].get(layer, "all")[: len(labels[s]["semantic"])] for s in SPLITS}
                for r in evaluate_layer(tokens, labels, heads, n_classes, cfg_seed, n_boot):
                    cfg = {"task": "segmentation", "probe": r["probe"], "layer": int(layer), "seed": int(seed),
                           "train": {k: v for k, v in asdict(cfg_seed).items() if k != "device"},
                           "classes": n_classes, "limit": limit, **(extra_config or {})}
                    rows.append(layer_row(info, ds, task="segmentation", layer=layer, seed=seed, cfg=cfg, **r))
                if bar:
                    bar.advance(1)
    return rows


def evaluate_segmentation(spec: str | Any, dataset: Path | Dataset, *, layers: str | Sequence[int] = "last",
                          heads: Sequence[str] = DEFAULT_HEADS, seeds: Sequence[int] = (0,), device: str = "auto",
                          dtype: str = "fp32", epochs: int | None = None, limit: int | None = None,
                          progress: bool = True, config: HeadConfig | None = None,
                          n_boot: int = 1000) -> list[dict[str, Any]]:
    """Segmentation result rows (task "segmentation", tokens "all", probe = the head): one per
    (layer, head, seed). `spec` is a backbone spec or an already resolved Backbone (an
    `IntervenedBackbone` too); every split's tokens come from `extract_activations` (cached).
    Provenance columns are left to the caller."""
    from evaluators.cache.extract import extract_activations  # the extraction stage is only needed here

    HEADS.check(heads)
    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    cfg = replace(config or HeadConfig(), device=resolve_device(device))
    cfg = cfg if epochs is None else replace(cfg, epochs=epochs)
    acts = {s: extract_activations(spec, ds, s, layers=layers, token_choices=("all",), device=device, dtype=dtype,
                                   progress=progress, limit=limit) for s in SPLITS}
    return evaluate_activations(acts, ds, heads=heads, seeds=seeds, config=cfg, limit=limit, progress=progress,
                                n_boot=n_boot, extra_config={"dtype": dtype})


def run_segmentation(request: EvaluationRequest, ds: Dataset, progress: bool,
                     on_skipped: Callable[[int], None] | None) -> Path | None:
    """Segmentation rows of every backbone (the task's runner), keyed, stamped and written as the other
    tasks' rows are; a backbone that fails to run gives error rows, not a stopped run."""
    limit = effective_limit(ds, request.limit)
    test_fp, done, run_id, prov = run_start(ds, limit, request.results_dir, request.overwrite,
                                             resolve_device(request.device), request.command)
    plans = backbone_plans(request, ds, done=done, test_fp=test_fp, limit=limit, progress=progress)
    check_cache(plans, ds, request.dtype, limit, progress, on_skipped)
    with local_threads(request.threads, progress, plans, local=True):
        rows: list[dict[str, Any]] = []
        path = None
        for one in plans:
            todo = {(w.layer, head, w.seed) for w in one.todo for head in w.families}
            if not todo:
                continue
            common = {**common_columns(prov, one, ds.name, test_fp, request.task, limit), "tokens": "all"}
            rows += one.stamp([{**r, **common} for r in plan_rows(one, request, ds, todo, limit, progress)])
            path = write_run(rows, request.results_dir, run_id)
    return path


def plan_rows(one: BackbonePlan, request: EvaluationRequest, ds: Dataset, todo: set[tuple[int, str, int]],
              limit: int | None, progress: bool) -> list[dict[str, Any]]:
    """The rows `todo` (layer, head, seed) of one backbone: evaluated, or error rows when it fails to run."""
    layers = sorted({layer for layer, _, _ in todo})
    heads = [h for h in request.families if any(h == head for _, head, _ in todo)]
    try:
        new = evaluate_segmentation(one.backbone, ds, layers=layers, heads=heads, seeds=request.seeds,
                                    device=request.device, dtype=request.dtype, epochs=request.epochs, limit=limit,
                                    progress=progress)
    except BenchError:
        raise
    except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
        message = extraction_failure(e, one.spec)
        new = [{"layer": layer, "probe": head, "seed": seed, "status": "error", "error": message}
               for layer, head, seed in sorted(todo, key=str)]
    return [r for r in new if (r["layer"], r["probe"], r["seed"]) in todo]
