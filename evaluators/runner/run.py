"""The evaluation orchestrator behind `bench evaluate` (and `bench demo`).

Two tasks share it. `binding` (the default): for each backbone, activations of the train/val/test splits (cached, docs/explanation/architecture.md §2), then
for every (layer, token view, seed) all requested probe families are trained together
from one pass over the data: per family an F-probe and an O-probe given F, both anchored
on the generator's exact priors (the headline chain-rule estimator), and the paper's
unanchored direct O- and F-probes (docs/explanation/architecture.md §3). Each (backbone, layer, view, probe, seed) becomes one results row
(docs/explanation/architecture.md §3). The run's file is rewritten atomically after every backbone, so an
interrupted run keeps what it finished; bad input stops the run with a BenchError.
`issameobject`: pairwise patch probes on every layer's spatial tokens
(`evaluators.tasks.issameobject`), one row per (backbone, layer, probe, seed), written the
same way.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import torch

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import check_writable, existing_keys, new_run_id, provenance, write_run
from evaluators.tasks.binding.rows import (binding_common, common_columns, extraction_error_rows,
                                     extraction_failure, stack_bytes, stack_size, stacks)
from evaluators.tasks.binding.task import SPLITS, BindingTask, binding_task, check_control, check_priors, open_dataset
from evaluators.tasks.binding.workers import StackWorkers
from evaluators.cache.extract import extract_activations, split_fingerprint
from evaluators.fitting import TrainConfig, resolve_device, stacks_row_sets
from evaluators.tasks.issameobject import evaluate_issameobject
from evaluators.runner.plan import EvaluationPlan
from evaluators.runner.planning import BackbonePlan, backbone_plans, check_cache, effective_limit, say
from evaluators.runner.threads import chosen_threads


def run_evaluation(plan: EvaluationPlan, *, progress: bool = True,
                   on_skipped: Callable[[int], None] | None = None) -> Path | None:
    """Evaluate the plan's backbones on its dataset; returns the results file written (None if
    nothing to do). The CLI, the Python API, `bench demo` and the Ray path all come here with
    an `EvaluationPlan`, so they compute the same rows.

    Every backbone is resolved and checked, and the activation cache's growth estimated against
    free disk, before any extraction; `on_skipped(n)` hears how many requested rows already
    exist (and are skipped). `progress` shows bars and notes on stderr.
    """
    if plan.executor != "local":
        from evaluators.runner.ray_tasks import check_options

        check_options(plan.executor, plan.task, plan.gpus_per_task, plan.address)
    ds = open_dataset(plan.dataset, need_codes=plan.task == "binding")
    check_writable(plan.results_dir)
    if plan.task == "issameobject":
        return _run_issameobject(plan, ds, progress, on_skipped)
    return _run_binding(plan, ds, progress, on_skipped)


def _run_binding(plan: EvaluationPlan, ds: Dataset, progress: bool,
                 on_skipped: Callable[[int], None] | None) -> Path | None:
    """Binding rows of every backbone of `plan`: in this process, or with executor "ray" as Ray tasks."""
    limit = effective_limit(ds, plan.limit)
    base_train = replace(plan.train or TrainConfig(), device=resolve_device(plan.device))
    if plan.epochs is not None:
        base_train = replace(base_train, epochs=plan.epochs)
    check_priors(ds, plan.unanchored)
    check_control(ds, plan.control, plan.unanchored)
    task_data: BindingTask | None = None  # built when the first row needs training
    test_fp, done, run_id, prov = _run_start(ds, limit, plan.results_dir, plan.overwrite, base_train.device,
                                             plan.command)
    plans = backbone_plans(plan, ds, done=done, test_fp=test_fp, limit=limit, progress=progress)
    check_cache(plans, ds, plan.dtype, limit, progress, on_skipped)
    work = [w for p in plans for w in p.todo]
    if work:
        fits = sum(len(w.families) for w in work)
        together = stacks_row_sets(base_train.device, base_train.stack_bytes)
        how = ("in stacks fitted together" if together else
               "side by side, a Ray task each" if plan.executor == "ray" else
               "one after another (or, on a CPU given several threads, side by side in worker processes where "
               "that is sooner)")
        bars = "" if plan.executor == "ray" else "; each stack's bar counts its row sets' gradient epochs (at most)"
        say(progress, f"to fit: {len(work)} row set(s), {fits} family fit(s) "
                      f"({', '.join(dict.fromkeys(f for w in work for f in w.families))}), a backbone's row sets "
                      f"{how}{bars}")
    if plan.executor == "ray":
        from evaluators.runner.ray_executor import run_binding

        return run_binding([p for p in plans if p.todo], ds, unanchored=plan.unanchored, prov=prov, test_fp=test_fp,
                           base_train=base_train, device=plan.device, dtype=plan.dtype, limit=limit,
                           results_dir=plan.results_dir, run_id=run_id, progress=progress, address=plan.address,
                           gpus_per_task=plan.gpus_per_task, control=plan.control)
    fits_on_one = "; probes fit on one (the same numbers on any count)" if base_train.device == "cpu" else ""
    with _local_threads(plan.threads, progress, plans, note=fits_on_one), \
            StackWorkers(torch.get_num_threads() if base_train.device == "cpu" else 1) as workers:
        rows: list[dict[str, Any]] = []
        path = None
        for one in plans:
            if not one.todo:
                continue
            task_data = task_data or binding_task(ds, limit, plan.unanchored, plan.control)
            common = binding_common(prov, one, ds, test_fp, limit, task_data)
            try:
                acts = {s: extract_activations(one.backbone, ds, s, layers=one.layers, views=one.views,
                                               device=plan.device, dtype=plan.dtype, progress=progress, limit=limit)
                        for s in SPLITS}
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
                rows += one.stamp(extraction_error_rows(common, one, one.todo, e))
                path = write_run(rows, plan.results_dir, run_id)
                continue
            per_stack = stack_size(acts["train"], one.todo, task_data, base_train, limit)
            todo = stacks(one.todo, per_stack)
            calls = [(common, acts, task_data, [(w.layer, one.shown(w.view)) for w in stack], stack[0].seed,
                      stack[0].families, replace(base_train, seed=stack[0].seed), plan.dtype, limit) for stack in todo]
            started, fitted = time.perf_counter(), 0
            held = stack_bytes(acts["train"], one.todo, task_data, limit, per_stack)
            for stack, new in zip(todo, workers.fitted(calls, progress, one.name, held)):
                rows += one.stamp(new)
                path = write_run(rows, plan.results_dir, run_id)  # after every stack: a crash keeps what finished
                fitted += len(stack)
                if fitted < len(one.todo):  # the ETA from the stacks fitted so far
                    spent = time.perf_counter() - started
                    say(progress, f"{one.name}: {fitted}/{len(one.todo)} row sets fitted in {spent:.0f} s; about "
                                  f"{spent / fitted * (len(one.todo) - fitted):.0f} s to go")
    return path


def _run_issameobject(plan: EvaluationPlan, ds: Dataset, progress: bool,
                      on_skipped: Callable[[int], None] | None) -> Path | None:
    """IsSameObject rows of every backbone, with the same provenance, keys and crash safety as binding
    rows; with executor "ray", every backbone's rows are computed by Ray tasks first."""
    task, families, seeds, exclude_background = "issameobject", plan.families, plan.seeds, plan.exclude_background
    device, dtype, epochs, results_dir = plan.device, plan.dtype, plan.epochs, plan.results_dir
    limit = effective_limit(ds, plan.limit)
    test_fp, done, run_id, prov = _run_start(ds, limit, results_dir, plan.overwrite, resolve_device(device),
                                             plan.command)
    plans = backbone_plans(plan, ds, done=done, test_fp=test_fp, limit=limit, progress=progress)
    check_cache(plans, ds, dtype, limit, progress, on_skipped)
    if ds.card.get("generator", {}).get("name") == "colorshape" and any(p.todo for p in plans):
        say(progress, "note: on ColorShape, IsSameObject is nearly trivial (flat colours: raw pixels read about "
                       "96% against a 57% majority); compare backbones with pixels, not with the majority")

    def work(one: BackbonePlan) -> tuple[list[int], list[str]]:  # the layers and families it still owes
        return (sorted({w.layer for w in one.todo}), [f for f in families if any(f in w.families for w in one.todo)])

    computed: dict[str, Any] = {}
    if plan.executor == "ray":
        from evaluators.runner.ray_executor import run_issameobject

        computed = run_issameobject([(p, *work(p)) for p in plans if p.todo], ds, seeds=seeds, device=device,
                                    dtype=dtype, epochs=epochs, exclude_background=exclude_background, limit=limit,
                                    results_dir=results_dir, run_id=run_id, progress=progress, address=plan.address,
                                    gpus_per_task=plan.gpus_per_task)
    with _local_threads(plan.threads, progress, plans, local=plan.executor != "ray"):
        rows: list[dict[str, Any]] = []
        path = None
        for one in plans:
            spec = one.spec
            todo = {(w.layer, family, w.seed) for w in one.todo for family in w.families}
            if not todo:
                continue
            common = {**common_columns(prov, one, ds.name, test_fp, task, limit), "tokens": "all"}
            try:
                if spec in computed:
                    if isinstance(computed[spec], BaseException):
                        raise computed[spec]
                    new = computed[spec]
                else:
                    layer_ids, owed = work(one)
                    new = evaluate_issameobject(one.backbone, ds, layers=layer_ids, probes=owed, seeds=seeds,
                                                device=device, dtype=dtype, epochs=epochs,
                                                exclude_background=exclude_background, limit=limit, progress=progress)
            except BenchError:
                raise
            except Exception as e:  # noqa: BLE001 — a backbone that fails to run becomes error rows
                message = extraction_failure(e, spec)
                new = [{"layer": layer, "probe": family, "seed": seed, "status": "error", "error": message}
                       for layer, family, seed in sorted(todo, key=str)]
            mine = one.stamp([{**r, **common} for r in new
                               if (r["layer"], r["probe"], r["seed"]) in todo])
            if any(r["status"] == "ok" and r.get("auroc") is None for r in mine):
                say(progress, f"warning: {spec}: some test pair sets hold one class only (all 'same' or all 'different'"
                               f"{'; --exclude-background drops every background pair' if exclude_background else ''}), "
                               "so their balanced accuracy and AUROC are blank")
            rows += mine
            path = write_run(rows, results_dir, run_id)
    return path


def _local_threads(threads: int | None, progress: bool, plans: Sequence[BackbonePlan],
                   local: bool = True, note: str = "") -> ContextManager[Any]:
    """The torch threads of the in-process work: `threads`, or the default `evaluators.runner.threads`
    picks (None), chosen once the run has work and said once (with `note`); Ray tasks pin their own (one)."""
    if not local or not any(p.todo for p in plans):
        return nullcontext()
    return chosen_threads(threads, say=lambda text: say(progress, text + note))


def _run_start(ds: Dataset, limit: int | None, results_dir: Path, overwrite: bool, device: str,
               command: str | None = None) -> tuple[str, set[tuple], str, dict[str, Any]]:
    """What every run starts from: the evaluated test fingerprint, the keys of rows already
    finished (none when overwriting), a new run id and its provenance columns."""
    done = set() if overwrite else existing_keys(results_dir)
    run_id = new_run_id()
    return split_fingerprint(ds, "test", limit), done, run_id, provenance(run_id, device, command)
