"""The GPU benchmark's CPU path: row sets fitted side by side in spawned one-thread worker processes,
one a core, stopped at the phase's share (a part of `benchmarks/gpu.py`)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np

from benchmarks import gpu_budget
from benchmarks.gpu_fits import fit_inputs
from evaluators.fitting import RowReader


def fit_side_by_side(acts: dict, task, row_sets: list[tuple[int, str]], families: list[str], workers: int,
                     allowance: float) -> dict:
    """The CPU path on every core: a fit on a CPU runs on one torch thread (version 14: the same
    numbers on any thread count), so the cores fit row sets side by side, one a process (`workers`
    spawned, started before the clock, as `--executor ray` fits them on one-thread tasks). The
    phase's time is the wall until the last row set is fitted (each row set's own time is in
    `times`); those not finished at `allowance` s are stopped, and the whole is extrapolated from
    the rate so far."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent", "row_sets_total": len(row_sets)}
    out: dict = {"row_sets_total": len(row_sets), "row_sets_done": 0, "workers": workers, "times": {}, "beta": {}}
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Barrier(workers + 1)
    with ctx.Pool(workers, initializer=_started, initargs=(started,)) as pool:
        try:  # every worker started and its imports done, outside the time
            started.wait(timeout=max(allowance, 60))
        except threading.BrokenBarrierError:
            return {"status": "skipped", "reason": f"the {workers} worker processes did not start",
                    "row_sets_total": len(row_sets)}
        t0 = gpu_budget.now()
        pending = {f"{layer}/{tokens}": pool.apply_async(fit_one_on_cpu, (
            {s: np.asarray(a.get(layer, tokens)) for s, a in acts.items()}, task, families))
                   for layer, tokens in row_sets}
        while pending and gpu_budget.now() - t0 < allowance:
            for key in [k for k, r in pending.items() if r.ready()]:
                try:
                    seconds, out["beta"][key] = pending.pop(key).get()
                    out["times"][key] = round(seconds, 2)
                except Exception as e:  # noqa: BLE001 — a row set that fails is said, the others go on
                    out.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}".splitlines()[0]
            time.sleep(0.02)
        wall = gpu_budget.now() - t0
        pool.terminate()
    done = out["row_sets_done"] = len(out["times"])
    if pending or out.get("errors"):
        out["reason"] = "; ".join(filter(None, (
            f"{len(pending)} row set(s) still fitting at this phase's {allowance:.0f} s" if pending else "",
            f"{len(out['errors'])} row set(s) failed" if out.get("errors") else "")))
    if not done:
        return {"status": "stopped", "reason": out["reason"], "seconds_at_least": round(wall, 2),
                "row_sets_total": len(row_sets)}
    out.update(status="done" if done == len(row_sets) else "partial", seconds=round(wall, 2),
               per_row_set_s=round(wall / done, 3), all_row_sets_s=round(wall * len(row_sets) / done, 2),
               all_row_sets_extrapolated=done < len(row_sets))
    return out


def _started(barrier: threading.Barrier) -> None:
    """A worker of `fit_side_by_side`, its imports done: say so (once every worker has, the clock starts)."""
    try:
        barrier.wait()
    except threading.BrokenBarrierError:  # the parent gave up waiting: a worker started later just works
        pass


def fit_one_on_cpu(arrays: dict, task, families: list[str]) -> tuple[float, dict]:
    """A worker of `fit_side_by_side`: one row set's (wall s, β* per family) on the CPU."""
    return fit_inputs({s: RowReader(a) for s, a in arrays.items()}, task, families, "cpu")
