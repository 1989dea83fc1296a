"""How a binding probe is built, in one place: from its family's registry entry
(`evaluators.probes.families.BINDING_PROBES`) to a module (`build_probe`: the class, its
constructor arguments `constructor_args`, its seed) and to its optimiser's settings (`probe_optim`,
the learning rate scaled to the input width by `probe_lr`); whether a family reads a tokens choice
(`check_family`); and the wrappers that change what a probe reads: the blind reference of real
images (`BlindProbe`) and the planted task's probe (`PlantedProbe`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from evaluators.fitting import RowReader, feature_stats
from evaluators.probes.base import Probe
from evaluators.probes.families import BINDING_PROBES, OPTIM_KEYS, ProbeFamily, ProbeOptim

LR_WIDTH = 64


def probe_lr(lr: float, in_dim: int) -> float:
    """`lr` for inputs of width `in_dim`. Adam moves every weight by about lr per step, so a
    unit reading in_dim standardised inputs moves its pre-activation by about lr·sqrt(in_dim):
    scaling lr by 1/sqrt(in_dim) keeps that step, and the epoch the probe peaks at, the same
    across backbones (at z = 1024 and 1e-2, probes peaked after one epoch, far from the optimum)."""
    return lr * min(1.0, math.sqrt(LR_WIDTH / in_dim))


def constructor_args(entry: ProbeFamily, **overrides: Any) -> dict[str, Any]:
    """The hyper-parameters a family's class is built with: its entry's defaults with `overrides`,
    less the optimiser's (`OPTIM_KEYS`, which `probe_optim` reads)."""
    return {k: v for k, v in {**entry.defaults, **overrides}.items() if k not in OPTIM_KEYS}


def probe_optim(family: str, in_dim: int, **overrides: Any) -> ProbeOptim:
    """The optimiser settings of a `family` probe over inputs of width `in_dim`: its entry's
    defaults (with `overrides`), the learning rate scaled by `probe_lr` unless the entry says `raw_lr`."""
    entry = BINDING_PROBES.get(family)
    params = {**entry.defaults, **overrides}
    lr = params["lr"] if entry.raw_lr else probe_lr(params["lr"], in_dim)
    return ProbeOptim(lr, params.get("weight_decay", ProbeOptim.weight_decay), params.get("ema"), entry.device_batches,
                      entry.patience, entry.lr_patience, entry.cpu_steps, entry.amp)


def build_probe(family: str, in_dim: int, n_bits: int, *, cond_dim: int = 0, seed: int = 0, anchored: bool = False,
                **hparams: Any) -> Probe:
    """A probe of `family` over inputs of width `in_dim` (per token for spatial families)
    predicting `n_bits` bits, optionally also given a `cond_dim`-bit condition (F). `hparams`
    override the entry's constructor defaults or add what its hook gives (`ProbeFamily.conjunction_args`);
    optimiser settings are not the module's (`probe_optim`).

    `anchored`: the probe will be added to an exact prior logit, so it has no linear
    context of earlier bits: the exact prior already says all that they say, and the term
    could only refit it from finite data — on calibration oracles it leaked 1.9 bits per
    scene of noise into scenes whose input carries nothing (linear probe, oracle:mix-0.5,
    2,000 scenes). The bias stays: with it a residual can set the threshold at which it
    reads an input feature (F-bits are ORs of O-bits: 2.3 bits of L_F without it).

    Its initial weights depend on `seed` alone (not on what the global RNG did before),
    so a result row is reproducible whichever other probes were built beside it.
    """
    entry = BINDING_PROBES.get(family)
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only (the modules are built on the CPU): `torch.manual_seed` also
        # queues a seed for every accelerator not yet started, with a stack trace each (1.3 ms a
        # probe, ~0.5 s of a 26-row-set fit), and would reseed the user's CUDA generator
        torch.default_generator.manual_seed(seed)
        probe = entry.probe_class()(in_dim, n_bits, cond_dim, **constructor_args(entry, **hparams))
    if anchored:
        frozen = probe.context.detach()
        del probe.context
        probe.register_buffer("context", frozen)
    return probe


class WrappedProbe(torch.nn.Module):
    """A probe around another (`probe`) that changes what it reads: its linear part, and what the
    fit asks of it, are the wrapped probe's."""

    def __init__(self, probe: torch.nn.Module) -> None:
        super().__init__()
        self.probe = probe

    def linear_parameters(self) -> list[torch.nn.Parameter]:
        return self.probe.linear_parameters()

    def nonlinear_parameters(self) -> list[torch.nn.Parameter]:
        return self.probe.nonlinear_parameters()

    @property
    def trains_context(self) -> bool:
        return self.probe.trains_context

    def set_linear(self, *solution: torch.Tensor | None) -> None:
        self.probe.set_linear(*solution)


class BlindProbe(WrappedProbe):
    """A probe that never sees the image: the F code stands in for Z, so it learns only what F
    and the earlier bits say about O. It is the empirical reference of real images, where no
    exact prior exists: B* = L^ref_O|F − L_O|F. F goes where Z would go (standardised, as Z
    is), not only through the conditioning path: a reference that read F only there trained
    slower than a probe handed F as Z, and oracle:features (whose Z is F) read B* ≈ 2.7 bits
    on a small VG import instead of 0. Given F as its Z, the reference is the image probe of
    a backbone that carries F and nothing else."""

    def __init__(self, probe: torch.nn.Module, f_train: np.ndarray) -> None:
        super().__init__(probe)
        f = np.asarray(f_train)
        # as the image's statistics are taken (`feature_stats`): where Z is F, the two inputs are the same bits
        probe.set_standardization(*feature_stats(RowReader(f.astype(np.float32))))

    def set_standardization(self, mean: np.ndarray, std: np.ndarray) -> None:
        """The image's statistics do not apply: the input is F, standardised at construction."""

    def linear_design(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.probe.linear_design(cond.to(x.dtype), cond)

    def forward(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        z = cond.to(x.dtype)
        return self.probe(z.unsqueeze(1) if x.dim() == 3 else z, target, cond)  # one token for token probes


class PlantedProbe(WrappedProbe):
    """A probe of `Plant`'s task: it reads z with the planted features [m·O′, m] appended (to
    every token of a spatial input), which reach it through the job's condition. The planted
    features are standardised with their own training statistics, z with z's."""

    def __init__(self, probe: torch.nn.Module, planted_train: np.ndarray) -> None:
        super().__init__(probe)
        self.planted_mean, self.planted_std = planted_train.mean(0), planted_train.std(0)

    def set_standardization(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.probe.set_standardization(np.concatenate([mean, self.planted_mean]),
                                       np.concatenate([std, self.planted_std]))

    def linear_design(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.probe.linear_design(torch.cat([x, cond.to(x.dtype)], dim=-1), None)

    def forward(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        extra = cond.to(x.dtype)
        if x.dim() == 3:
            extra = extra[:, None, :].expand(-1, x.shape[1], -1)
        return self.probe(torch.cat([x, extra], dim=-1), target, None)
