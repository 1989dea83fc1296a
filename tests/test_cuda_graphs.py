"""`GraphedStep`'s bookkeeping, on a machine without CUDA: torch.cuda's graph API is replaced by a
stand-in whose capture records the step (running nothing) and whose replay runs what it recorded,
so that what runs eagerly, what is captured and what is replayed can be counted."""

from __future__ import annotations

import contextlib

import pytest
import torch

from evaluators import cuda_graphs


class _Graph:
    capturing: "_Graph | None" = None  # the graph being captured, if one is

    def __init__(self) -> None:
        self.step = None

    def capture_begin(self, pool=None) -> None:  # noqa: ANN001
        _Graph.capturing = self

    def capture_end(self) -> None:
        _Graph.capturing = None

    def replay(self) -> None:
        self.step()


class _Stream:
    def wait_stream(self, other) -> None:  # noqa: ANN001
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))


def _step(log: list, name: str, fails: bool = False):
    """A step that records whether it ran eagerly or was being captured (capture runs nothing: the
    stand-in graph keeps the step and runs it at each replay)."""
    def step() -> None:
        graph = _Graph.capturing
        if graph is not None:
            if fails:
                raise RuntimeError("operation not permitted when stream is capturing")
            graph.step = lambda: log.append(("replay", name))
            return
        log.append(("eager", name))
    return step


def test_a_step_warms_up_then_is_captured_once_per_key_and_replayed(fake_cuda):
    log: list = []
    graphed = cuda_graphs.GraphedStep(warmup=2)
    for key in ["a", "a", "a", "a", "b", "b", "b", "a"]:
        graphed.run(key, _step(log, key))
    assert log == [("eager", "a"), ("eager", "a"), ("replay", "a"), ("replay", "a"),
                   ("eager", "b"), ("eager", "b"), ("replay", "b"), ("replay", "a")]
    assert set(graphed.graphs) == {"a", "b"} and graphed.broken is None


def test_steps_that_share_a_warm_key_warm_up_once(fake_cuda):
    log: list = []
    graphed = cuda_graphs.GraphedStep(warmup=1)
    for slot in [0, 1, 2, 0, 1]:
        graphed.run(("l2", slot), _step(log, f"l2/{slot}"), warm_key="l2")
    assert [kind for kind, _ in log] == ["eager", "replay", "replay", "replay", "replay"]
    assert set(graphed.graphs) == {("l2", 1), ("l2", 2), ("l2", 0)}


def test_a_step_that_cannot_be_captured_runs_eagerly_from_then_on(fake_cuda):
    log: list = []
    undone: list = []
    graphed = cuda_graphs.GraphedStep(warmup=1)
    for _ in range(4):
        graphed.run("a", _step(log, "a", fails=True), on_fail=lambda: undone.append(True))
    assert log == [("eager", "a")] * 4  # the failed capture's step ran eagerly too
    assert undone == [True] and "capturing" in str(graphed.broken) and not graphed.graphs
