"""A backbone's stacks fitted side by side in worker processes, where a CPU run has several threads.

A CPU fit runs on one torch thread (`fitting.fit_row_sets`: so its numbers are the same on any
thread count), so a run given N threads would leave N - 1 cores idle while it fits a backbone's
stacks one after another. `StackWorkers.fitted` fits the first stack in the run's own process
and times it; when the rest would finish sooner on N one-thread worker processes, start-up
included (`worth_workers`), it hands them over. Once the workers run, a later backbone's stacks
all go to them. A worker runs `rows.binding_rows` on a stack exactly as the loop does, and a
stack's numbers depend only on its config and seed (every stage seeds itself), so the rows are
the same bytes as one after another; they come back in the loop's order. Workers are spawned (a
fork of a process whose OpenMP threads have run can hang), started once and kept for the run's
later backbones.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import connection, get_context, parent_process
from types import TracebackType
from typing import Any, Iterator, Sequence

from bench.core.environ import environment
from bench.core.resources import available_memory
from evaluators.tasks.binding.rows import binding_rows
from evaluators.runner.planning import say

#: What starting the workers costs, in seconds: a spawned worker imports torch and the evaluators
#: (2.5-3 s each on a 2-core machine, side by side) before its first stack.
WORKER_START_S = 4.0
#: What a worker holds besides its stack: torch and the evaluators imported (0.76 GB peak RSS, measured).
WORKER_BYTES = 1 << 30
#: The thread-count variables of the libraries under torch and numpy, set to one in a worker's
#: environment: it fits on one thread, and N workers on N cores must not each start N threads.
ONE_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

#: One stack's `binding_rows` arguments, all but `progress`.
StackCall = tuple[Any, ...]


def worth_workers(first_s: float, remaining: int, workers: int, started: bool) -> bool:
    """Whether `remaining` stacks of about `first_s` seconds each finish sooner on `workers` worker
    processes (start-up included) than one after another in this process. Workers already
    `started` cost nothing to start, so two stacks or more gain whatever their time."""
    if workers < 2 or remaining < 2:
        return False
    return started or WORKER_START_S + first_s * math.ceil(remaining / workers) < first_s * remaining


def affordable_workers(n: int, stack_bytes: int) -> int:
    """How many of `n` workers the free memory holds, each with its imports and a stack of about
    `stack_bytes`: a worker killed for memory would cost its stacks' time twice."""
    return max(1, min(n, available_memory() // (WORKER_BYTES + stack_bytes)))


class StackWorkers:
    """Up to `threads` one-thread worker processes that fit stacks, started when first worth it and
    stopped when the `with` block ends (at once, their stacks dropped, if it ends by an error)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ProcessPoolExecutor | None = None
        self._size = 0  # the pool's workers, fixed once it starts

    def __enter__(self) -> "StackWorkers":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=kind is None, cancel_futures=True)
            self._pool = None

    def fitted(self, calls: Sequence[StackCall], progress: bool, label: str,
               stack_bytes: int = 0) -> Iterator[list[dict[str, Any]]]:
        """The rows of each stack of `calls`, in order: the first fitted here (its epoch bar shown)
        unless the workers already run, the rest side by side on the workers where `worth_workers`
        and the free memory holds every worker (`WORKER_BYTES` and a stack of about `stack_bytes`
        each), else here too. Should the workers die (a worker killed, out of memory), the stacks
        they had not returned are fitted here, and the run says so."""
        done = 0
        started = time.perf_counter()
        while done < len(calls):
            room = affordable_workers(self.threads, stack_bytes) if done or self._pool is not None else 1
            size = self._size if self._pool is not None else room
            if room >= size and worth_workers((time.perf_counter() - started) / max(done, 1), len(calls) - done,
                                              min(size, len(calls) - done), self._pool is not None):
                try:
                    for rows in self._side_by_side(calls[done:], size, progress, label, after_first=done > 0):
                        done += 1
                        yield rows
                except BrokenProcessPool:
                    say(progress, f"{label}: a worker process died (killed, or out of memory); the "
                                  f"{len(calls) - done} stack(s) not yet back are fitted in this process")
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._pool, self.threads = None, 1  # no more workers this run
                continue
            yield binding_rows(*calls[done], progress=progress)
            done += 1

    def _side_by_side(self, calls: Sequence[StackCall], size: int, progress: bool, label: str,
                      after_first: bool) -> Iterator[list[dict[str, Any]]]:
        """The rows of `calls` fitted on the workers (`size` of them, started if not yet), in order:
        a stack that finishes early waits for the ones before it (the caller's lines say each one's
        arrival)."""
        if self._pool is None:
            self._pool, self._size = ProcessPoolExecutor(max_workers=size, mp_context=get_context("spawn"),
                                                         initializer=_end_with_parent), size
        with environment(dict.fromkeys(ONE_THREAD_ENV, "1")):  # the workers spawned by these submits inherit it
            futures: list[Future] = [self._pool.submit(_fit, call) for call in calls]
        which = f"the other {len(calls)}" if after_first else f"its {len(calls)}"
        say(progress, f"{label}: {which} stack(s) side by side on {min(size, len(calls))} worker "
                      "processes (one thread each, the same numbers)")
        for future in futures:
            yield future.result()


def _end_with_parent() -> None:
    """A worker's start: a thread that ends the worker when the run's process ends, however (a
    `kill -9` leaves the pool's queue open, so a worker would otherwise wait on it for ever)."""
    parent = parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (connection.wait([parent.sentinel]), os._exit(1)), daemon=True).start()


def _fit(call: StackCall) -> list[dict[str, Any]]:
    """A worker's stack: `binding_rows` as the loop runs it, without bars."""
    return binding_rows(*call, progress=False)

