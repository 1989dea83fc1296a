"""Interventions on a subspace of a backbone's tokens (issue 58): does a backbone use its binding?

- `subspace`: the binding subspace a fitted IsSameObject quadratic probe reads, and its controls
  (random, feature, shuffled labels), kept as a `.npz` artefact; principal angles between two.
- `fit`: `fit_subspace`, fitting one on a backbone's layer and a dataset.
- `intervene`: the tensor maths of `shuffle`, `inject` and `remove` on patch tokens.
- `backbone`: a backbone (from an `intervene:...:<base>` spec, its grammar in
  `bench.core.intervention_specs`) whose hidden state L is changed in the
  network by a forward hook, so every later layer and every task sees the change.
- `specs`: what the registry asks of an `intervene:` spec without building it (metadata, checks).

Importing the package imports no torch: the subspace file and the spec grammar are numpy and
plain Python, and the names of `backbone`, `fit` and `intervene` load with their modules when
first asked for, so a study's rerun with every row held reads its subspaces without torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from bench.core.intervention_specs import (INTERVENE_PREFIX, INTERVENTION_KINDS, SUBSPACE_KINDS, InterventionSpec,
                                           is_intervened, parse_intervention, reads_ground_truth)
from evaluators.interventions.subspace import (Subspace, load_subspace, principal_angles, save_subspace,
                                               subspace_from_quadratic)

#: The names whose modules bring torch, and those modules.
_LAZY = {"IntervenedBackbone": "backbone", "fit_subspace": "fit", "Intervention": "intervene",
         "apply_intervention": "intervene"}

__all__ = ["INTERVENE_PREFIX", "INTERVENTION_KINDS", "IntervenedBackbone", "Intervention", "InterventionSpec",
           "SUBSPACE_KINDS", "Subspace", "apply_intervention", "fit_subspace", "is_intervened", "load_subspace",
           "parse_intervention", "principal_angles", "reads_ground_truth", "save_subspace", "subspace_from_quadratic"]


def __getattr__(name: str) -> Any:
    """`IntervenedBackbone`, `fit_subspace`, `Intervention` and `apply_intervention`, imported when
    first asked for (they bring torch)."""
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
