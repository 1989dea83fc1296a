"""The probes of one binding family: one `ProbeJob` per target, built from the family's registry
entry (`evaluators.families`), and the wrappers of the reference and planted probes."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from bench.core.hashing import derive_seed
from evaluators.tasks.binding.task import TARGETS, BindingTask
from evaluators.fitting import ProbeJob, RowReader, feature_stats
from evaluators.families import BINDING_PROBES
from evaluators.probes import build_probe, probe_optim



def binding_jobs(family: str, in_dim: int, task: BindingTask, seed: int = 0,
                 targets: Sequence[str] | None = None) -> list[ProbeJob]:
    """The probes of one family, named `<family>/<target>`, each initialised from a seed
    derived from `seed` and its name. "F" and "O|F" are anchored on the exact priors (when
    the task has them: the O|F residual then reads Z alone, F being in its prior);
    "O_paper" and "F_paper" never are."""
    space, entry = task.space, BINDING_PROBES.get(family)
    # what the family's probes that predict O (conjunction bits) need beyond the defaults (its hook)
    o_args = entry.conjunction_kwargs(space.sizes)
    f_codes = {s: c[0] for s, c in task.codes.items()}
    o_codes = {s: c[1] for s, c in task.codes.items()}
    anchored = task.anchors or {}
    jobs = []
    targets_ = tuple(task.targets if targets is None else targets)
    for target in targets_:
        name = f"{family}/{target}"
        init = derive_seed("probe-init", seed, name)
        cond, prior, width = None, None, in_dim
        if target == "F" and anchored:
            model = build_probe(family, in_dim, space.n_features, seed=init, anchored=True)
            codes, prior = f_codes, {s: a[0] for s, a in anchored.items()}
        elif target in ("F", "F_paper"):
            model, codes = build_probe(family, in_dim, space.n_features, seed=init), f_codes
        elif target == "O|F" and anchored:
            # F enters through the exact prior p(o_k | o_<k, f): the residual reads only Z
            model = build_probe(family, in_dim, space.n_conjunctions, seed=init, anchored=True, **o_args)
            codes, prior = o_codes, {s: a[1] for s, a in anchored.items()}
        elif target == "O|F":
            model = build_probe(family, in_dim, space.n_conjunctions, cond_dim=space.n_features, seed=init, **o_args)
            codes, cond = o_codes, f_codes
        elif target == "O|F_ref":
            width = space.n_features
            model = build_probe(family, width, space.n_conjunctions, cond_dim=space.n_features, seed=init, **o_args)
            model, codes, cond = BlindProbe(model, f_codes["train"]), o_codes, f_codes
        elif target == "O_paper":
            model = build_probe(family, in_dim, space.n_conjunctions, seed=init, **o_args)
            codes = o_codes
        elif target == "O|F_planted" and task.plant is not None:
            plant = task.plant
            width = in_dim + plant.features["train"].shape[1]
            model = build_probe(family, width, space.n_conjunctions, seed=init, anchored=True, **o_args)
            model, codes = PlantedProbe(model, plant.features["train"]), plant.codes
            cond, prior = plant.features, plant.anchors
        else:
            raise ValueError(f"unknown probe target {target!r}; allowed: {', '.join(TARGETS)}")
        # one target's probes share their linear stage across families; a warm-starting family's
        # other targets start from the token encoder its O|F-probe learned (an attention F-probe
        # trained alone on raw pixels read β_F 0.63, from the O|F-probe's encoder 0.96)
        warm = f"{family}/O|F" if entry.warm_starts and target != "O|F" and "O|F" in targets_ else None
        jobs.append(ProbeJob(name, model, codes, cond=cond, prior=prior, linear_key=target, warm_start=warm,
                             optim=probe_optim(family, width)))
    return jobs


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
