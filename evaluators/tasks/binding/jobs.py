"""The probes of one binding family: one `ProbeJob` per target, built from the family's registry
entry (`evaluators.probes.families`) by `evaluators.probes.build`, the reference and planted
targets' probes wrapped there too (`BlindProbe`, `PlantedProbe`)."""

from __future__ import annotations

from typing import Sequence

from bench.core.hashing import derive_seed
from evaluators.fitting import ProbeJob
from evaluators.probes.build import BlindProbe, PlantedProbe, build_probe, probe_optim
from evaluators.probes.families import BINDING_PROBES
from evaluators.tasks.binding.task import TARGETS, BindingTask


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
