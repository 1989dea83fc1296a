"""The binding task's run (its `Task.runner`): for each backbone, activations of the train/val/test
splits (cached, docs/explanation/architecture.md §2), then for every (layer, tokens choice, seed) all
requested probe families trained together from one pass over the data: per family an F-probe and
an O-probe given F, both anchored on the generator's exact priors (the headline chain-rule
estimator), and the paper's unanchored direct O- and F-probes (docs/explanation/architecture.md §3).
Each (backbone, layer, tokens, probe, seed) becomes one results row; the run's file is rewritten
atomically after every stack, so an interrupted run keeps what it finished.

Its request hooks are in `evaluators.tasks.binding.request`, its dataset check before a study runs
in `evaluators.tasks.binding.task` (`check_dataset`): neither imports torch."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import write_run
from bench.core.tasks import TASKS
from evaluators.cache.extract import extract_selections
from evaluators.fitting import TrainConfig, resolve_device, stacks_row_sets
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.planning import backbone_plans, check_cache, effective_limit, say
from evaluators.runner.run import local_threads, run_start
from evaluators.tasks.binding.rows import binding_common, extraction_error_rows, stack_bytes, stack_size, stacks
from evaluators.tasks.binding.task import SPLITS, BindingTask, binding_task, check_control, check_priors
from evaluators.tasks.binding.workers import StackWorkers


def run_binding(request: EvaluationRequest, ds: Dataset, progress: bool,
                on_skipped: Callable[[int], None] | None) -> Path | None:
    """Binding rows of every backbone of `request` (the task's runner): in this process, or with executor
    "ray" as Ray tasks."""
    limit = effective_limit(ds, request.limit)
    base_train = replace(request.train or TrainConfig(), device=resolve_device(request.device))
    if request.epochs is not None:
        base_train = replace(base_train, epochs=request.epochs)
    if request.memory_budget is not None:
        base_train = replace(base_train, memory_budget=request.memory_budget)
    check_priors(ds, request.unanchored)
    check_control(ds, request.control, request.unanchored)
    task_data: BindingTask | None = None  # built when the first row needs training
    test_fp, done, run_id, prov = run_start(ds, limit, request.results_dir, request.overwrite, base_train.device,
                                             request.command)
    plans = backbone_plans(request, ds, done=done, test_fp=test_fp, limit=limit, progress=progress)
    check_cache(plans, ds, request.dtype, limit, progress, on_skipped)
    work = [w for p in plans for w in p.todo]
    if work:
        fits = sum(len(w.families) for w in work)
        together = stacks_row_sets(base_train.device, base_train.stack_bytes)
        how = ("in stacks fitted together" if together else
               "side by side, a Ray task each" if request.executor == "ray" else
               "one after another (or, on a CPU given several threads, side by side in worker processes where "
               "that is sooner)")
        bars = "" if request.executor == "ray" else "; each stack's bar counts its row sets' gradient epochs (at most)"
        say(progress, f"to fit: {len(work)} row set(s), {fits} family fit(s) "
                      f"({', '.join(dict.fromkeys(f for w in work for f in w.families))}), a backbone's row sets "
                      f"{how}{bars}")
    if request.executor == "ray":
        on_ray = TASKS.get(request.task).hook("ray_runner")  # evaluators.runner.ray_executor.run_binding
        return on_ray([p for p in plans if p.todo], ds, unanchored=request.unanchored, prov=prov, test_fp=test_fp,
                      base_train=base_train, device=request.device, dtype=request.dtype, limit=limit,
                      results_dir=request.results_dir, run_id=run_id, progress=progress, address=request.address,
                      gpus_per_task=request.gpus_per_task, control=request.control)
    fits_on_one = "; probes fit on one (the same numbers on any count)" if base_train.device == "cpu" else ""
    with local_threads(request.threads, progress, plans, note=fits_on_one), \
            StackWorkers(torch.get_num_threads() if base_train.device == "cpu" else 1) as workers:
        rows: list[dict[str, Any]] = []
        path = None
        for one in plans:
            if not one.todo:
                continue
            task_data = task_data or binding_task(ds, limit, request.unanchored, request.control)
            common = binding_common(prov, one, ds, test_fp, limit, task_data)
            try:
                acts = {s: extract_selections(one.backbone, ds, s, one.selections, device=request.device,
                                              dtype=request.dtype, progress=progress, limit=limit)[0]
                        for s in SPLITS}
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
                rows += one.stamp(extraction_error_rows(common, one, one.todo, e))
                path = write_run(rows, request.results_dir, run_id)
                continue
            per_stack = stack_size(acts["train"], one.todo, task_data, base_train, limit)
            todo = stacks(one.todo, per_stack)
            calls = [(common, acts, task_data, [(w.layer, one.shown(w.tokens)) for w in stack], stack[0].seed,
                      stack[0].families, replace(base_train, seed=stack[0].seed), request.dtype, limit)
                     for stack in todo]
            started, fitted = time.perf_counter(), 0
            held = stack_bytes(acts["train"], one.todo, task_data, limit, per_stack)
            for stack, new in zip(todo, workers.fitted(calls, progress, one.name, held)):
                rows += one.stamp(new)
                path = write_run(rows, request.results_dir, run_id)  # after every stack: a crash keeps what finished
                fitted += len(stack)
                if fitted < len(one.todo):  # the ETA from the stacks fitted so far
                    spent = time.perf_counter() - started
                    say(progress, f"{one.name}: {fitted}/{len(one.todo)} row sets fitted in {spent:.0f} s; about "
                                  f"{spent / fitted * (len(one.todo) - fitted):.0f} s to go")
    return path
