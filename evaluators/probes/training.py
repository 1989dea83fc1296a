"""The training settings every probe fit shares (`TrainConfig`) and the device `auto` means:
importable without torch, so that a run works out its rows' probe fingerprints, and so whether it
has anything to do, before it loads any model or fitting code (`evaluators.fitting` re-exports
both)."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The `TrainConfig` fields that are the machine's, not the result's: how much memory a fit may take
#: changes how it reads its rows, never its numbers, so they join neither a row's key nor its config.
MACHINE_FIELDS = ("stack_bytes", "memory_budget")

#: Device files without which no GPU build of torch finds a device (NVIDIA's driver, ROCm's kernel driver).
GPU_NODES = ("/dev/nvidiactl", "/dev/kfd")


def resolve_device(device: str) -> str:
    """`auto` means CUDA when available. A machine without any of `GPU_NODES` has no device torch
    could use, which is told without importing torch (a run with nothing to do never loads it)."""
    if device == "auto":
        if not any(os.path.exists(node) for node in GPU_NODES):
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and stopping settings shared by every probe of one `fit_probes` call.

    `lr` / `weight_decay` / `ema` None mean each job's own (`ProbeJob.optim`, from its family's
    registry entry, `evaluators.probes.families`); a number overrides it for every probe.
    """

    epochs: int = 200
    #: None: `auto_batch_size(n_train, device, steps)`: the jobs' `ProbeOptim.cpu_steps` optimiser steps
    #: per epoch (16 to 128 rows) on a CPU, a quarter of the training split on CUDA.
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    #: Epochs without a `min_delta` improvement of the mean validation bits before a job stops, and
    #: before its learning rate drops by `lr_factor`; None: each job's own (its family's,
    #: `ProbeFamily.patience`: 3 and 1 for the pooled families, 5 and 2 for attention).
    patience: int | None = None
    lr_patience: int | None = None
    lr_factor: float = 0.3
    min_delta: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    #: L2 strengths (per scene, on the mean code length in nats) the linear stage tries,
    #: strongest first; the one with the lowest validation bits is kept.
    l2_path: tuple[float, ...] = tuple(float(10.0 ** -e) for e in range(7))
    #: After the L2 path, each target's best strength times and divided by each of these in turn (within
    #: the path's range) is tried too, each pair from the best solution so far (empty: not): decade steps
    #: refined by a half and then a quarter decade choose what the quarter-decade path chose wherever
    #: validation has one minimum, at 11 solves where that path takes 25.
    l2_refine: tuple[float, ...] | float = (float(10.0 ** 0.5), float(10.0 ** 0.25))
    #: L1 strengths the linear stage tries after the L2 path, strongest first, each warm-started
    #: from the last (the first from the best L2 solution); validation chooses among all of them.
    #: A binding that only some inputs carry (oracle:mix-0.5) is read by a few strong weights,
    #: which L2 shrinks as hard as it shrinks the noise of all the others.
    l1_path: tuple[float, ...] = (1e-2, 3e-3, 1e-3, 3e-4)
    #: The L1 penalty is smoothed, sqrt(w² + eps²) − eps, so that L-BFGS sees a smooth problem.
    l1_eps: float = 1e-2
    #: Iterations of the batched L-BFGS per L2 and per L1 strength (`evaluators.fitting.lbfgs`),
    #: warm-started along the path: a fixed budget, so that no iteration waits on the host. The first L1
    #: strength, which starts from the best L2 solution, takes `l1_first_iterations`. 8, 30 and 25 read
    #: every oracle, control and planted teacher as the 12 and 40 before version 8 did; 6 per L2, 18–20 per
    #: L1 strength, or 25 at the first after a decade path left oracle:mix-0.5's fit at 500 scenes
    #: unconverged (‡).
    linear_iterations: int = 8
    l1_iterations: int = 25
    l1_first_iterations: int = 30
    #: A fit replaces the exact prior only when its validation saving exceeds this many
    #: standard errors (`fit_probes`, the guard; Student's t at the same level for few groups).
    guard_se: float = 2.0
    #: The weights' moving-average decay for every probe (None: each job's own, `ProbeOptim.ema`).
    ema: float | None = None
    #: Bytes the row sets fitted together may take (`row_sets_per_stack`); None: one row set per
    #: stack on a CPU, a quarter of the GPU's free memory on CUDA. Also the host memory in which a
    #: stacked fit keeps its row sets' training rows read once (None: `STACK_BYTES`).
    stack_bytes: int | None = None
    #: Host bytes one fit may hold of activation rows at once (`evaluators.fitting.data.memory_budget`):
    #: the rows it reads in bulk (statistics, scoring and validation chunks, training batches) and the
    #: splits a fit on CUDA keeps in memory. None: `MEMORY_SHARE` of the machine's available memory when
    #: the fit starts. Bounds what is read at once, never what is computed: a fit's numbers are the same
    #: under any budget; one below a training batch of rows is refused.
    memory_budget: int | None = None
