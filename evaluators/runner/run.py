"""The evaluation orchestrator behind `bench evaluate` (and `bench demo`, studies and the Python API).

`run_evaluation` takes an `EvaluationRequest` and hands it to its task's runner (`Task.runner`,
bench/core/tasks.py: the binding task's in `evaluators.tasks.binding.run`, IsSameObject's in
`evaluators.tasks.issameobject.run`, a plugin task's wherever its record says); every runner starts
from `run_start` (keys of rows already written, a run id, provenance) and runs its in-process work
under `local_threads`, so every task writes rows with the same provenance, keys and crash safety.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import check_writable, existing_keys, new_run_id, provenance
from bench.core.tasks import TASKS
from evaluators.cache.keys import split_fingerprint
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.planning import BackbonePlan, held_rows, say
from evaluators.runner.threads import chosen_threads
from evaluators.tasks.binding.task import open_dataset


def run_evaluation(request: EvaluationRequest, *, progress: bool = True,
                   on_skipped: Callable[[int], None] | None = None) -> Path | None:
    """Evaluate the request's backbones on its dataset; returns the results file written (None if
    nothing to do). The CLI, the Python API, `bench demo` and the Ray path all come here with
    an `EvaluationRequest`, so they compute the same rows.

    A run whose rows the results folder holds already, as the registry's metadata tells
    (`held_by_metadata`), ends before any model code loads. Otherwise every backbone is resolved
    and checked, and the activation cache's growth estimated against free disk, before any
    extraction; `on_skipped(n)` hears how many requested rows already
    exist (and are skipped). `progress` shows bars and notes on stderr.
    """
    task = TASKS.get(request.task)
    if request.executor != "local":
        from evaluators.runner.ray_tasks import check_options

        if task.ray_runner is None:
            raise BenchError(f"executor: task {request.task} runs in this process only; use --executor local")
        check_options(request.executor, request.task, request.gpus_per_task, request.address)
    ds = open_dataset(request.dataset, need_codes=task.needs_codes)
    check_writable(request.results_dir)
    if not request.overwrite:  # nothing owed: said before any model code (torch) is imported
        held = held_rows(request, ds)
        if held is not None:
            if held and on_skipped is not None:
                on_skipped(held)
            return None
    return task.hook("runner")(request, ds, progress, on_skipped)


__all__ = ["run_evaluation", "run_start", "local_threads"]


def local_threads(threads: int | None, progress: bool, plans: Sequence[BackbonePlan],
                  local: bool = True, note: str = "") -> ContextManager[Any]:
    """The torch threads of the in-process work: `threads`, or the default `evaluators.runner.threads`
    picks (None), chosen once the run has work and said once (with `note`); Ray tasks pin their own (one)."""
    if not local or not any(p.todo for p in plans):
        return nullcontext()
    return chosen_threads(threads, say=lambda text: say(progress, text + note))


def run_start(ds: Dataset, limit: int | None, results_dir: Path, overwrite: bool, device: str,
              command: str | None = None) -> tuple[str, set[tuple], str, dict[str, Any]]:
    """What every run starts from: the evaluated test fingerprint, the keys of rows already
    finished (none when overwriting), a new run id and its provenance columns."""
    done = set() if overwrite else existing_keys(results_dir)
    run_id = new_run_id()
    return split_fingerprint(ds, "test", limit), done, run_id, provenance(run_id, device, command)
