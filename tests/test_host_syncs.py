"""The batched fit waits on the host a fixed number of times: not once per strength, per bit or
per row set.

Every way a tensor's value reaches Python (`Tensor.item`, `.cpu()`, `.numpy()`, `.tolist()`,
`float()`/`int()`/`bool()` of a tensor) is counted while the linear stage fits every target of
a family along a penalty path of 5 and then of 25 strengths, and while a stack of 1 and of 4 row
sets is fitted whole: the counts must be equal. On a GPU each such read stalls the device until
its queue drains (torch's L-BFGS read the loss at every closure: about 20,000 reads per row set)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from evaluators import fitting
from evaluators.fitting import ProbeJob, RowReader, TrainConfig, fit_probes, fit_row_sets, lbfgs, stacked
from evaluators.probes.build import build_probe

N = {"train": 300, "val": 100, "test": 100}
K, D = 6, 12

READS = ("item", "cpu", "numpy", "tolist", "__float__", "__int__", "__bool__")


@contextmanager
def counted_reads() -> Iterator[list[int]]:
    """Count the host reads of tensor values inside the block."""
    count = [0]
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name: str):
        original = saved[name]

        def read(self, *args, **kwargs):
            count[0] += 1
            return original(self, *args, **kwargs)
        return read

    for name in READS:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield count
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


def _jobs_and_inputs(seed: int = 0) -> tuple[list[ProbeJob], dict[str, RowReader]]:
    rng = np.random.default_rng(seed)
    inputs, targets, prior = {}, {}, {}
    for s, n in N.items():
        o = (rng.random((n, K)) < 0.3).astype(np.uint8)
        z = np.concatenate([o + 0.5 * rng.normal(size=(n, K)), rng.normal(size=(n, D - K))], 1).astype(np.float32)
        inputs[s], targets[s] = RowReader(z), o
        prior[s] = np.full((n, K), math.log(0.3 / 0.7), dtype=np.float32)
    jobs = [ProbeJob("anchored", build_probe("linear", D, K, anchored=True), targets, prior=prior),
            ProbeJob("free", build_probe("linear", D, K), targets)]
    return jobs, inputs


def _reads(strengths: int) -> tuple[int, dict]:
    jobs, inputs = _jobs_and_inputs()
    path = tuple(float(10.0 ** -(e * 24 / (4 * (strengths - 1)))) for e in range(strengths))
    config = TrainConfig(epochs=0, l2_path=path, l1_path=(1e-2, 1e-3))
    with counted_reads() as count:
        res = fit_probes(jobs, inputs, config)
    return count[0], res


def test_the_linear_stage_reads_the_host_as_often_for_5_strengths_as_for_25():
    few, res_few = _reads(5)
    many, res_many = _reads(25)
    assert all(r.error is None for r in [*res_few.values(), *res_many.values()])
    refined = 2 * len(TrainConfig().l2_refine)  # and the refined strengths
    assert len(res_many["free"].l2_path) == 25 + refined and len(res_few["free"].l2_path) == 5 + refined
    assert few == many, (few, many)
    # and the count is small: a few reads per target and split, none per strength or per bit
    assert many < 60, many


def test_a_stacks_whole_fit_reads_the_host_as_often_for_4_row_sets_as_for_1(monkeypatch):
    """Every stage of linear, quadratic and dnn probes, their gradient stage stacked as CUDA runs it
    (`evaluators.fitting.stacked`, here on the CPU): 4 row sets (copies, so that every one trains
    for as many epochs) read the host as often as 1 — once per stage and epoch, not per row set."""
    monkeypatch.setattr(stacked, "STACKED_DEVICES", ("cuda", "cpu"))
    config = TrainConfig(epochs=3, l2_path=(1e-1, 1e-2), l1_path=(1e-2,))
    counts = []
    for n in (1, 4):
        row_sets = []
        for _ in range(n):
            jobs, inputs = _jobs_and_inputs()
            targets, prior = jobs[0].targets, jobs[0].prior
            jobs += [ProbeJob(f"{family}/{name}", build_probe(family, D, K, anchored=anchored), targets,
                              prior=prior if anchored else None)
                     for family in ("quadratic", "dnn") for name, anchored in (("anchored", True), ("free", False))]
            row_sets.append((jobs, inputs))
        with counted_reads() as count:
            results = fit_row_sets(row_sets, config)
        assert all(r.error is None for rs in results for r in rs.values())
        assert max(r.best_epoch for rs in results for r in rs.values()) > 0  # the gradient stage trained
        counts.append(count[0])
    assert counts[0] == counts[1], counts


class _Operations(TorchDispatchMode):
    """Counts the tensor operations other than views (on a GPU, kernels launched from Python) run
    inside `counted`."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.on = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += self.on and not func.is_view
        return func(*args, **(kwargs or {}))

    def counted(self, fn):  # noqa: ANN001, ANN201
        def inner(*args, **kwargs):
            self.on = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.on = False
        return inner


def test_a_stacks_scoring_and_linear_iterations_launch_as_much_for_4_row_sets_as_for_2(monkeypatch):
    """Launched one by one from Python, kernels kept a GPU idle: a stack's splits are scored in one
    vmap'd forward per probe for all its row sets, and an L-BFGS iteration steps all of them, so
    the operations they run are as many for 4 row sets as for 2 (one row set takes a product
    without its batch's copy)."""
    monkeypatch.setattr(stacked, "STACKED_DEVICES", ("cuda", "cpu"))
    config = TrainConfig(epochs=2, l2_path=(1e-1, 1e-2), l1_path=(1e-2,))
    counts = []
    for n in (2, 4):
        mode = _Operations()
        monkeypatch.setattr(fitting, "score_sets", mode.counted(stacked.score_sets))
        monkeypatch.setattr(lbfgs.BatchedLBFGS, "iterate", mode.counted(lbfgs.BatchedLBFGS.__dict__["iterate"]))
        row_sets = []
        for _ in range(n):
            jobs, inputs = _jobs_and_inputs()
            jobs += [ProbeJob(f"dnn/{j.name}", build_probe("dnn", D, K, anchored=j.prior is not None), j.targets,
                              prior=j.prior) for j in list(jobs)]
            row_sets.append((jobs, inputs))
        with mode:
            results = fit_row_sets(row_sets, config)
        assert all(r.error is None for rs in results for r in rs.values())
        counts.append(mode.count)
    assert counts[0] == counts[1] > 0, counts
