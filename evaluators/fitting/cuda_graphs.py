"""What keeps a GPU busy through the fitting's inner loops: a step replayed from CUDA graphs
(`GraphedStep`), and independent steps run at once on side streams (`SideStreams`).

The fitting's inner loops (an L-BFGS iteration of the linear stage, a training step of a stacked
probe) are trains of a hundred or more small kernels, each launched from Python, and a GPU waits
for them: an H200 sat 90 % idle. Captured once and replayed, a step launches them all at once.

A step is a callable of no arguments that reads and writes only tensors that outlive it (its
inputs copied in and its outputs written in place), so that a replay reads and writes the same
memory its capture saw. Whatever the step cannot capture runs eagerly from then on: the same
kernels run, so the numbers are the same."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Callable, Hashable, Iterator

import torch

#: Eager runs of a step before it is captured (on a side stream, as CUDA graphs ask): what the first
#: runs set up lazily, cuBLAS workspaces and autograd's state, is then in place.
WARMUP = 2

#: Each device's side streams, made once and reused by every warm-up, capture and lane of a process:
#: the caching allocator keeps the memory a stream allocated for that stream, and with a new stream
#: for each (PyTorch hands out its pool of 32 in turn) a process's first fits allocated afresh on each.
_STREAMS: dict[tuple[str, str, int], "torch.cuda.Stream"] = {}


def side_stream(device: str | torch.device, role: str, k: int = 0) -> "torch.cuda.Stream":
    """Side stream `k` for `role` ("graph": warm-ups and captures; "lane": `SideStreams`) on `device`,
    the same one at each call."""
    key = (str(device), role, k)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device=device)
    return _STREAMS[key]


class GraphedStep:
    """A step as CUDA graphs, one per `key` (whatever the step's Python code reads that a graph
    would fix: shapes, an index into a ring of buffers), all in one memory pool (they never run
    at once, and a step's outputs live outside the pool)."""

    def __init__(self, device: str | torch.device = "cuda", warmup: int = WARMUP) -> None:
        self.device, self.warmup = device, warmup
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.warmed: Counter = Counter()
        self.pool: tuple | None = None
        self.broken: Exception | None = None  # why a step could not be captured, if one could not
        self.io: dict[Hashable, tuple[tuple[torch.Tensor, ...], torch.Tensor]] = {}  # `call`'s, per key

    def call(self, key: Hashable, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        """`fn(*inputs)` (a tensor), replayed from the graph for `key`: the inputs are copied into
        tensors of the step's own and the output is the tensor the first call made (a warm-up run,
        which gives its shape), overwritten by each later call of `key`."""
        if key not in self.io:
            given, made = tuple(t.clone() for t in inputs), []
            if self.broken is None and self.warmed[key] < self.warmup:
                self.warmed[key] += 1
                self._on_side_stream(lambda: made.append(fn(*given)))
            else:
                made.append(fn(*given))
            self.io[key] = (given, made[0])
            return made[0]
        given, out = self.io[key]
        for mine, t in zip(given, inputs):
            mine.copy_(t)
        self.run(key, lambda: out.copy_(fn(*given)))
        return out

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
                self._on_side_stream(step)
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
        graph, side = torch.cuda.CUDAGraph(), side_stream(self.device, "graph")
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

    def _on_side_stream(self, step: Callable[[], None]) -> None:
        """A warm-up run, on the stream captures use (as CUDA graphs ask)."""
        side = side_stream(self.device, "graph")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)


class SideStreams:
    """Side CUDA streams on which independent trains of kernels run at once: each stack of the
    gradient stage steps on its own stream (`lane`), so that the GPU runs the steps of several
    stacks together. A step of a probe is a few hundred kernels each too small to fill a GPU (the
    attention probe on pixels: 0.9 ms a step, an H200 73 % busy with one kernel at a time).

    Within a lane the kernels run in the order they were queued, as they would on one stream, so
    the numbers are those of one stream. With fewer than two lanes (the caller's choice off CUDA)
    nothing changes: the work runs where it is."""

    def __init__(self, lanes: int, device: str) -> None:
        self.streams = [side_stream(device, "lane", k) for k in range(lanes)] if lanes > 1 else []

    @contextmanager
    def lane(self, k: int, *inputs: object) -> Iterator[None]:
        """Queue the block's work on lane `k` after all the current stream has queued so far; the
        tensors among `inputs`, made on the current stream, are kept from the allocator until the
        lane has read them (`Tensor.record_stream`)."""
        if not self.streams:
            yield
            return
        side = self.streams[k % len(self.streams)]
        side.wait_stream(torch.cuda.current_stream())
        for t in inputs:
            if isinstance(t, torch.Tensor):
                t.record_stream(side)
        with torch.cuda.stream(side):
            yield

    def join(self) -> None:
        """The current stream waits for all that the lanes have queued (before anything reads what they wrote)."""
        for side in self.streams:
            torch.cuda.current_stream().wait_stream(side)
