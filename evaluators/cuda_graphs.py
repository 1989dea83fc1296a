"""A step replayed from CUDA graphs: the fitting's inner loops (an L-BFGS iteration of the linear
stage, a training step of a stacked probe) are trains of a hundred or more small kernels, each
launched from Python, and a GPU waits for them: an H200 sat 90 % idle. Captured once and
replayed, a step launches them all at once.

A step is a callable of no arguments that reads and writes only tensors that outlive it (its
inputs copied in and its outputs written in place), so that a replay reads and writes the same
memory its capture saw. Whatever the step cannot capture runs eagerly from then on: the same
kernels run, so the numbers are the same."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Hashable

import torch

#: Eager runs of a step before it is captured (on a side stream, as CUDA graphs ask): what the first
#: runs set up lazily, cuBLAS workspaces and autograd's state, is then in place.
WARMUP = 2


class GraphedStep:
    """A step as CUDA graphs, one per `key` (whatever the step's Python code reads that a graph
    would fix: shapes, an index into a ring of buffers), all in one memory pool (they never run
    at once, and a step's outputs live outside the pool)."""

    def __init__(self, warmup: int = WARMUP) -> None:
        self.warmup = warmup
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.warmed: Counter = Counter()
        self.pool: tuple | None = None
        self.broken: Exception | None = None  # why a step could not be captured, if one could not

    def run(self, key: Hashable, step: Callable[[], None], warm_key: Hashable | None = None,
            on_fail: Callable[[], None] | None = None) -> None:
        """Run `step` on the current CUDA stream: replayed where its graph for `key` is captured,
        else eagerly for the first `warmup` runs of `warm_key` (by default `key`: steps that share
        one warm up once), then captured and replayed. `on_fail` undoes what a failed capture left
        (a capture runs nothing, but may leave Python-side state such as gradients)."""
        if self.broken is not None:
            step()
            return
        graph = self.graphs.get(key)
        if graph is None:
            warm = key if warm_key is None else warm_key
            if self.warmed[warm] < self.warmup:
                self.warmed[warm] += 1
                _on_side_stream(step)
                return
            graph = self._capture(step, on_fail)
            if graph is None:
                step()
                return
            self.graphs[key] = graph
        graph.replay()

    def _capture(self, step: Callable[[], None], on_fail: Callable[[], None] | None) -> torch.cuda.CUDAGraph | None:
        """The step's graph (nothing runs while it is captured); None, and eager steps from now on,
        where something in it cannot be captured."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:  # `torch.cuda.graph` without its synchronize, gc.collect and empty_cache: steps capture often
            with torch.cuda.stream(side):
                graph.capture_begin(pool=self.pool)
                try:
                    step()
                finally:
                    graph.capture_end()
        except Exception as e:  # noqa: BLE001 — the step runs eagerly instead
            self.broken = e
            if on_fail is not None:
                on_fail()
            return None
        finally:
            torch.cuda.current_stream().wait_stream(side)
        return graph


def _on_side_stream(step: Callable[[], None]) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
