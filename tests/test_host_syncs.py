"""The batched fit waits on the host a fixed number of times: not once per strength or per bit.

Every way a tensor's value reaches Python (`Tensor.item`, `.cpu()`, `.numpy()`, `.tolist()`,
`float()`/`int()`/`bool()` of a tensor) is counted while the linear stage fits every target of
a family along a penalty path of 5 and then of 25 strengths: the counts must be equal. On a GPU
each such read stalls the device until its queue drains (torch's L-BFGS read the loss at every
closure: about 20,000 reads per row set)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch

from evaluators.probes import build_probe
from evaluators.training import ProbeJob, RowReader, TrainConfig, fit_probes

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
    assert len(res_many["free"].l2_path) == 25 and len(res_few["free"].l2_path) == 5
    assert few == many, (few, many)
    # and the count is small: a few reads per target and split, none per strength or per bit
    assert many < 60, many
