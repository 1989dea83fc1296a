"""The IsSameObject task's run (its `Task.runner`): pairwise patch probes on every layer's spatial
tokens (`evaluators.tasks.issameobject.evaluate`), one row per (backbone, layer, probe, seed), with
the same provenance, keys and crash safety as binding rows. Its request hooks are in
`evaluators.tasks.issameobject.request` (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import write_run
from bench.core.tasks import TASKS
from evaluators.fitting import resolve_device
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.planning import BackbonePlan, backbone_plans, check_cache, effective_limit, say
from evaluators.runner.run import local_threads, run_start
from evaluators.tasks.binding.rows import common_columns, extraction_failure
from evaluators.tasks.issameobject.evaluate import evaluate_issameobject


def run_issameobject(request: EvaluationRequest, ds: Dataset, progress: bool,
                     on_skipped: Callable[[int], None] | None) -> Path | None:
    """IsSameObject rows of every backbone (the task's runner), with the same provenance, keys and crash safety as binding
    rows; with executor "ray", every backbone's rows are computed by Ray tasks first."""
    task, families, seeds, exclude_background = (request.task, request.families, request.seeds,
                                                 request.exclude_background)
    device, dtype, epochs, results_dir = request.device, request.dtype, request.epochs, request.results_dir
    limit = effective_limit(ds, request.limit)
    test_fp, done, run_id, prov = run_start(ds, limit, results_dir, request.overwrite, resolve_device(device),
                                             request.command)
    plans = backbone_plans(request, ds, done=done, test_fp=test_fp, limit=limit, progress=progress)
    check_cache(plans, ds, dtype, limit, progress, on_skipped)
    if ds.card.get("generator", {}).get("name") == "colorshape" and any(p.todo for p in plans):
        say(progress, "note: on ColorShape, IsSameObject is nearly trivial (flat colours: raw pixels read about "
                       "96% against a 57% majority); compare backbones with pixels, not with the majority")

    def work(one: BackbonePlan) -> tuple[list[int], list[str]]:  # the layers and families it still owes
        return (sorted({w.layer for w in one.todo}), [f for f in families if any(f in w.families for w in one.todo)])

    computed: dict[str, Any] = {}
    if request.executor == "ray":
        on_ray = TASKS.get(request.task).hook("ray_runner")  # evaluators.runner.ray_executor.run_issameobject
        computed = on_ray([(p, *work(p)) for p in plans if p.todo], ds, seeds=seeds, device=device,
                          dtype=dtype, epochs=epochs, exclude_background=exclude_background, limit=limit,
                          results_dir=results_dir, run_id=run_id, progress=progress, address=request.address,
                          gpus_per_task=request.gpus_per_task)
    with local_threads(request.threads, progress, plans, local=request.executor != "ray"):
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
