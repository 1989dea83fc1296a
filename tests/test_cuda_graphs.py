"""What keeps a GPU busy, checked on a machine without CUDA: torch.cuda's graph and stream API is
replaced by stand-ins. A stand-in graph's capture records the step (running nothing) and its replay
runs what it recorded, so that what runs eagerly, what is captured and what is replayed can be
counted (`GraphedStep`); a stand-in stream logs what waits on what (`SideStreams`)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from evaluators.fitting import cuda_graphs


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


class _Lane:
    """A stand-in CUDA stream that logs what waits on what (`wait_stream`) and which stream is current."""

    current: "_Lane"
    log: list = []
    made = 0

    def __init__(self, device=None, name: str | None = None) -> None:  # noqa: ANN001
        if name is None:
            name, _Lane.made = f"side{_Lane.made}", _Lane.made + 1
        self.name = name

    def wait_stream(self, other: "_Lane") -> None:
        _Lane.log.append(("wait", self.name, other.name))


@contextlib.contextmanager
def _on(stream: _Lane):
    before, _Lane.current = _Lane.current, stream
    try:
        yield
    finally:
        _Lane.current = before


@pytest.fixture
def fake_streams(monkeypatch):
    _Lane.log, _Lane.made = [], 0
    _Lane.current = _Lane(name="main")
    monkeypatch.setattr(cuda_graphs, "_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", _Lane)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Lane.current)
    monkeypatch.setattr(torch.cuda, "stream", _on)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: _Lane.log.append(("keep", tuple(t.shape), s.name)))
    return _Lane


@pytest.fixture
def fake_cuda(monkeypatch, fake_streams):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    return fake_streams




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


def test_warm_ups_captures_and_lanes_reuse_the_same_streams(fake_cuda):
    """One stream for every warm-up and capture of a device, and the same lanes for every stage: the
    caching allocator keeps memory per stream, so a new stream each time allocated afresh."""
    for _ in range(2):  # two solvers' graphs, as two fits make
        graphed = cuda_graphs.GraphedStep(warmup=2)
        for key in ["a", "a", "a", "b", "b", "b"]:
            graphed.run(key, _step([], key))
    assert fake_cuda.made == 1
    first = cuda_graphs.SideStreams(3, "cuda").streams
    assert cuda_graphs.SideStreams(2, "cuda").streams == first[:2] and fake_cuda.made == 4


def test_side_streams_queue_each_lane_after_the_current_stream_and_join_back(fake_streams):
    streams = cuda_graphs.SideStreams(3, "cuda")
    ran: list = []
    with streams.lane(4, torch.zeros(2), None, "not a tensor"):
        ran.append(fake_streams.current.name)
    streams.join()
    assert ran == ["side1"] and fake_streams.current.name == "main"
    assert fake_streams.log == [("wait", "side1", "main"), ("keep", (2,), "side1"),
                                ("wait", "main", "side0"), ("wait", "main", "side1"), ("wait", "main", "side2")]
    one = cuda_graphs.SideStreams(1, "cuda")  # one lane: nothing to run beside, the work stays where it is
    with one.lane(0, torch.zeros(2)):
        ran.append(fake_streams.current.name)
    assert ran[-1] == "main" and not one.streams


def test_the_stacks_of_a_stage_step_on_lanes_of_their_own_joined_before_validation(fake_streams, monkeypatch,
                                                                                     balanced_small):
    """Each stack's steps run on its own stream, and the main stream waits for every lane before
    validation reads the weights (or their steps could still be running there)."""
    from bench.core.dataset import Dataset
    from evaluators.tasks.binding.task import binding_task
    from evaluators.tasks.binding.columns import evaluate_binding_sets
    from evaluators.fitting import stacked
    from evaluators.fitting.stack import Stack
    from tests.test_stacking import CONFIG, _row_sets

    monkeypatch.setattr(stacked, "STACKED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(stacked, "CONCURRENT_DEVICES", ("cuda", "cpu"))
    task = binding_task(Dataset(balanced_small))
    lanes_of: dict[int, set] = {}
    dirty: set = set()
    train, validate = Stack.train, stacked.validate_stacks

    def step(self, *args, **kwargs):  # noqa: ANN001
        lane = fake_streams.current.name
        assert lane != "main"
        lanes_of.setdefault(id(self), set()).add(lane)
        dirty.add(lane)
        return train(self, *args, **kwargs)

    def validated(*args, **kwargs):  # noqa: ANN001
        joined = {e[2] for e in fake_streams.log if e[:2] == ("wait", "main")}
        assert dirty <= joined, f"validation before the main stream waited for {dirty - joined}"
        dirty.clear()
        del fake_streams.log[:]
        return validate(*args, **kwargs)

    monkeypatch.setattr(Stack, "train", step)
    monkeypatch.setattr(stacked, "validate_stacks", validated)
    evaluate_binding_sets(_row_sets(task, 2), task, ["quadratic", "dnn"], train=CONFIG, n_boot=20)
    assert len(lanes_of) >= 4 and all(len(lanes) == 1 for lanes in lanes_of.values())
    assert len({next(iter(lanes)) for lanes in lanes_of.values()}) >= 4  # stacks of a stage on different lanes


def test_host_arrays_go_to_cuda_through_pinned_memory_without_waiting(monkeypatch):
    """`to_device`: to CUDA a pinned copy queued with non_blocking (a copy from pageable memory
    waits for everything the stream has queued); elsewhere a plain copy."""
    from evaluators.fitting.data import to_device

    calls: list = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: calls.append("pinned") or t.clone())
    real_to = torch.Tensor.to

    def to(t, device, *args, **kwargs):  # noqa: ANN001
        calls.append((str(device), kwargs.get("non_blocking", False)))
        return real_to(t, "cpu")
    monkeypatch.setattr(torch.Tensor, "to", to)
    out = to_device(np.arange(3.0), "cuda:0")
    assert calls == ["pinned", ("cuda:0", True)] and out.tolist() == [0.0, 1.0, 2.0]
    calls.clear()
    to_device(torch.ones(2), "cpu")
    assert calls == [("cpu", False)]


def test_the_linear_path_replays_one_graph_per_penalty_kind_with_the_numbers_of_eager_runs(fake_streams,
                                                                                           monkeypatch):
    """Graphed, an L-BFGS iteration is one graph per penalty kind (the curvature pairs move down the
    ring; the head, which a graph would fix, stays), as are a solve's start and end, and the path's
    numbers are those of the eager ring. The stand-in capture keeps the step and each replay runs it again, which is what a graph
    does as long as nothing the step's Python reads changes between replays: the head is the one
    such thing, and it must not move."""
    from evaluators.fitting import lbfgs
    from tests.test_training import D, K, _splits
    from evaluators.probes.build import build_probe, probe_optim
    from evaluators.fitting import ProbeJob, fit_probes

    inputs, targets, prior = _splits(informative=True)

    def fit() -> tuple[dict, list]:
        solvers: list = []
        init = lbfgs.BatchedLBFGS.__init__

        def kept(self, *args, **kwargs):  # noqa: ANN001
            init(self, *args, **kwargs)
            solvers.append(self)
        with monkeypatch.context() as m:
            m.setattr(lbfgs.BatchedLBFGS, "__init__", kept)
            job = ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))
            res = fit_probes([job], inputs)["l"]
        return {"val": res.val_scene_bits.copy(), **{k: v.clone() for k, v in job.model.state_dict().items()}}, solvers

    eager, _ = fit()
    monkeypatch.setattr(lbfgs, "GRAPHED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(cuda_graphs.GraphedStep, "_capture", lambda self, step, on_fail: type("G", (), {
        "replay": staticmethod(step)})())
    graphed, solvers = fit()
    per_solver = {"l2", "l1", ("start", "l2"), ("start", "l1"), "left"}  # iterations, a solve's start and end
    assert solvers and all(set(s.graphs.graphs) == per_solver and s.head == 0 for s in solvers)
    assert graphed.keys() == eager.keys()
    assert all(np.array_equal(np.asarray(graphed[k]), np.asarray(eager[k])) for k in eager)


def test_modules_go_to_cuda_in_one_transfer_per_module_and_type(monkeypatch):
    """`modules_to_device`: to CUDA each module's tensors of one type in one transfer (`to_device`),
    the parameters the same objects (tied ones still tied, requires_grad kept) and equal; each module
    its own transfer, so that copying one module's state copies only its own."""
    from evaluators.fitting import data

    moved: list = []

    def to_device(t, device):  # noqa: ANN001
        moved.append((str(device), t.dtype, t.numel()))
        return t.clone()
    monkeypatch.setattr(data, "to_device", to_device)

    def model() -> torch.nn.Module:
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 3, bias=False))
        m[1].weight = torch.nn.Parameter(m[0].weight.detach().T.clone())
        m.extra = torch.nn.Linear(4, 3, bias=False)
        m.extra.weight = m[1].weight  # tied
        m.register_buffer("mask", torch.tensor([True, False]))
        m.register_buffer("count", torch.zeros(2, dtype=torch.long))
        m[0].weight.requires_grad_(False)
        return m

    models = [model(), model()]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    params = [[id(p) for p in m.parameters()] for m in models]
    data.modules_to_device(models, "cuda")
    one = [("cuda", torch.bool, 2), ("cuda", torch.int64, 2), ("cuda", torch.float32, 12 + 4 + 12)]  # tied: once
    assert moved == one * 2
    for m, state, ids in zip(models, before, params):
        assert [id(p) for p in m.parameters()] == ids and m.extra.weight is m[1].weight
        assert not m[0].weight.requires_grad and m[0].bias.requires_grad
        assert all(torch.equal(m.state_dict()[k], v) for k, v in state.items())
        assert len({p.untyped_storage().data_ptr() for p in m.parameters()}) == 1  # views of its transfer
    assert models[0][0].weight.untyped_storage().data_ptr() != models[1][0].weight.untyped_storage().data_ptr()


def test_the_subspace_iteration_replays_one_gram_schmidt_graph_per_shape_with_the_eager_numbers(fake_streams,
                                                                                                monkeypatch):
    """`GraphedGramSchmidt`: the moment stage's orthonormalisations (22 a target) are one graph per
    input shape, copied in and out; the directions are those of the eager Gram–Schmidt, bit for bit.
    The stand-in capture keeps the step and each replay runs it again: nothing its Python reads
    changes between calls but the input, which is copied into the graph's own."""
    from evaluators.fitting import moments

    monkeypatch.setattr(cuda_graphs.GraphedStep, "_capture", lambda self, step, on_fail: type("G", (), {
        "replay": staticmethod(step)})())
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 40, 40, generator=gen)
    delta = a + a.transpose(1, 2)
    graphed = moments.GraphedGramSchmidt("cuda")
    eager = moments._top_eigenvectors(delta, 4, orthonormal=moments.gram_schmidt)
    replayed = moments._top_eigenvectors(delta, 4, orthonormal=graphed)
    again = moments._top_eigenvectors(delta[:3], 4, replayed[1][:3], 5, graphed)  # another shape
    assert all(torch.equal(x, y) for x, y in zip(eager, replayed))
    assert torch.equal(again[0], moments._top_eigenvectors(delta[:3], 4, eager[1][:3], 5, moments.gram_schmidt)[0])
    assert set(graphed.graphs.graphs) == {((6, 40, 12), torch.float32), ((3, 40, 12), torch.float32)}
