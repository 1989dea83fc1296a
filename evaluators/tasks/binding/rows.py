"""Result rows as the local loop and the Ray tasks both make them: the columns a backbone's rows
share (both tasks), the binding rows of one (backbone, layer, tokens, seed), and the error of a
backbone that failed to run (both tasks)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.resources import disk_full
from evaluators.backbones.base import BackboneInfo
from evaluators.tasks.binding.columns import evaluate_binding_sets, result_columns
from evaluators.tasks.binding.task import SPLITS, BindingTask
from evaluators.fitting import RowReader, TrainConfig, row_set_bytes, row_sets_per_stack
from evaluators.runner.planning import BackbonePlan, Work


def binding_common(prov: dict[str, Any], plan: BackbonePlan, ds: Dataset, test_fp: str, limit: int | None,
                   task_data: BindingTask) -> dict[str, Any]:
    """The columns every binding row of one backbone shares."""
    return {**common_columns(prov, plan, ds.name, test_fp, "binding", limit),
            "control": task_data.control,
            "n_train": len(task_data.codes["train"][1]), "n_test": len(task_data.codes["test"][1])}


def refuse_full_disk(error: BaseException, backbone: str) -> None:
    """A full disk is the machine's state, not the backbone's: end the run in one line rather than
    write error rows that would stand as the backbone's result. The rows written so far stay, and
    the rows extracted into the cache are resumed by the next run."""
    if disk_full(error):
        where = getattr(error, "filename", None) or "the activations cache"
        raise BenchError(f"disk full while extracting {backbone} ({where}): free space and run the same command "
                         "again; the rows written so far are kept") from None


def extraction_failure(error: BaseException, backbone: str) -> str:
    """The one-line error of every row of a backbone that failed to run, binding or IsSameObject
    (a full disk ends the run instead: `refuse_full_disk`)."""
    refuse_full_disk(error, backbone)
    return f"extraction failed: {type(error).__name__}: {error}".splitlines()[0]


def extraction_error_rows(common: dict[str, Any], plan: BackbonePlan, todo: Sequence[Work],
                          error: BaseException) -> list[dict[str, Any]]:
    """Error rows for every row of `todo` when the backbone failed to run (`extraction_failure`)."""
    message = extraction_failure(error, common["backbone"])
    return [_row(common, w.layer, v, family, w.seed, {"status": "error", "error": message})
            for w in todo for v in plan.shown(w.tokens) for family in w.families]


def binding_rows(common: dict[str, Any], acts: dict[str, Any], task_data: BindingTask,
                 row_sets: Sequence[tuple[int, Sequence[str]]], seed: int, families: Sequence[str], cfg: TrainConfig,
                 dtype: str, limit: int | None, progress: bool) -> list[dict[str, Any]]:
    """The rows of a stack of (layer, tokens) row sets of one backbone at one seed, fitted as one
    batched problem (`evaluate_binding_sets`): every family trained on the cached rows of the
    first tokens choice of each row set, rows written under each of them. A plain function so that a Ray task runs
    exactly what the local loop runs.

    `wall_time_s` of a row is the stack's wall time shared equally among its row sets and
    families: a batched fit has no time of its own per row."""
    inputs = [{s: RowReader(acts[s].get(layer, shown[0]), limit) for s in SPLITS} for layer, shown in row_sets]
    t0 = time.perf_counter()
    where = ", ".join(f"{layer} {shown[0]}" for layer, shown in row_sets)
    label = f"train {','.join(families)} · {common['backbone']} layer {where} seed {seed}"
    with _epoch_bar(progress, label, cfg.epochs * len(row_sets)) as advance:
        results = evaluate_binding_sets(inputs, task_data, families, train=cfg, progress=advance)
    wall = (time.perf_counter() - t0) / (len(families) * len(row_sets))
    rows = []
    for (layer, shown), result in zip(row_sets, results):
        for family in families:
            columns = result_columns(result[family], cfg, wall, dtype, limit, task_data)
            rows += [_row(common, layer, v, family, seed, columns) for v in shown]
    return rows


def stack_size(train_acts: Any, todo: Sequence[Work], task_data: BindingTask, cfg: TrainConfig,
               limit: int | None) -> int:
    """Row sets per stack for a backbone's activations (`fitting.row_sets_per_stack`)."""
    return row_sets_per_stack(*_row_set_shape(train_acts, todo, task_data, limit), cfg.device, cfg.stack_bytes)


def stack_bytes(train_acts: Any, todo: Sequence[Work], task_data: BindingTask, limit: int | None,
                per_stack: int) -> int:
    """About the bytes a stack of `per_stack` of a backbone's row sets holds (`fitting.row_set_bytes`)."""
    return per_stack * row_set_bytes(*_row_set_shape(train_acts, todo, task_data, limit))


def _row_set_shape(train_acts: Any, todo: Sequence[Work], task_data: BindingTask,
                   limit: int | None) -> tuple[int, tuple[int, ...], int]:
    """What a backbone's row sets' memory depends on: their training and validation rows, the largest
    row among the tokens choices of `todo`, and the bits of every target."""
    shapes = [tuple(train_acts.get(w.layer, w.tokens).shape) for w in todo]
    n_rows = min(shapes[0][0], limit or shapes[0][0]) + len(task_data.codes["val"][1])
    space = task_data.space
    return (n_rows, max((s[1:] for s in shapes), key=lambda s: int(np.prod(s))),
            2 * space.n_features + 3 * space.n_conjunctions)


def stacks(todo: Sequence[Work], per_stack: int) -> list[list[Work]]:
    """The rows a backbone owes as stacks fitted together: work of the same seed and families,
    in order, at most `per_stack` row sets each (`fitting.row_sets_per_stack`)."""
    grouped: dict[tuple[int, tuple[str, ...]], list[Work]] = {}
    for w in todo:
        grouped.setdefault((w.seed, tuple(w.families)), []).append(w)
    return [group[i : i + per_stack] for group in grouped.values() for i in range(0, len(group), max(per_stack, 1))]


def common_columns(prov: dict[str, Any], plan: BackbonePlan, dataset: str, test_fp: str, task: str,
                   limit: int | None) -> dict[str, Any]:
    """The columns every row of one backbone shares: provenance, backbone, dataset, task, limit."""
    info: BackboneInfo = plan.backbone.info
    return {**prov, "backbone": plan.name, "spec": plan.spec, "backbone_family": info.family,
            "backbone_revision": info.revision,
            "weights_fingerprint": info.revision,
            "dataset": dataset, "dataset_fingerprint": test_fp, "limit": limit, "split": "test",
            "n_layers": info.n_layers, "task": task}


def _row(common: dict[str, Any], layer: int, tokens: str, family: str, seed: int,
         extra: dict[str, Any]) -> dict[str, Any]:
    return {**common, "layer": layer, "tokens": tokens, "probe": family, "seed": seed, **extra}


@contextmanager
def _epoch_bar(enabled: bool, label: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A per-stage progress bar over epochs (nothing when progress is off)."""
    if not enabled:
        yield None
        return
    from bench.core.console import progress_bar

    with progress_bar(label, total) as bar:
        yield bar.advance
