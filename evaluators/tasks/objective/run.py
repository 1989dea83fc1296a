"""The objective task's run (its `Task.runner`): each backbone's own training loss on val, one row
per backbone, with the same provenance, keys and crash safety as every task's rows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import write_run
from evaluators.fitting import resolve_device
from evaluators.runner.planning import backbone_plans, effective_limit
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.run import local_threads, run_start
from evaluators.tasks.binding.rows import common_columns, extraction_failure
from evaluators.tasks.objective.loss import ratio_interval, scene_losses
from evaluators.tasks.objective.pairing import scene_columns

#: The split the objective is measured on (`TASK.split`).
SPLIT = "val"


def run_objective(request: EvaluationRequest, ds: Dataset, progress: bool,
                  on_skipped: Callable[[int], None] | None) -> Path | None:
    """Objective rows of every backbone (the task's runner); a backbone without a head was refused
    when planned (`check_head`), before any row was written."""
    device = resolve_device(request.device)
    limit = effective_limit(ds, request.limit)
    test_fp, done, run_id, prov = run_start(ds, limit, request.results_dir, request.overwrite, device,
                                             request.command)
    plans = backbone_plans(request, ds, done=done, test_fp=test_fp, limit=limit, progress=progress)
    skipped = sum(p.skipped for p in plans)
    if skipped and on_skipped is not None:
        on_skipped(skipped)
    rows: list[dict[str, Any]] = []
    path = None
    with local_threads(request.threads, progress, plans):
        for one in plans:
            if not one.todo:
                continue
            common = {**common_columns(prov, one, ds.name, test_fp, request.task, limit), "split": SPLIT,
                      "tokens": "all"}
            start = time.perf_counter()
            try:
                sums, counts = scene_losses(one.backbone, ds, SPLIT, limit=limit, device=device, dtype=request.dtype,
                                            progress=progress)
                done_in = time.perf_counter() - start
                per_scene = scene_columns(sums, counts)
                measured = {w.seed: ratio_interval(sums, counts, seed=w.seed) for w in one.todo}
                new = [{"layer": w.layer, "probe": family, "seed": w.seed, "status": "ok", "error": None,
                        "objective_loss": measured[w.seed][0], "objective_loss_lo": measured[w.seed][1],
                        "objective_loss_hi": measured[w.seed][2], "n_test": len(sums), "wall_time_s": done_in,
                        **per_scene}
                       for w in one.todo for family in w.families]
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
                message = extraction_failure(e, one.spec)
                new = [{"layer": w.layer, "probe": family, "seed": w.seed, "status": "error", "error": message}
                       for w in one.todo for family in w.families]
            rows += one.stamp([{**r, **common} for r in new])
            path = write_run(rows, request.results_dir, run_id)
    return path
