"""Interventions on a subspace of a backbone's tokens (issue 58): does a backbone use its binding?

- `subspace`: the binding subspace a fitted IsSameObject quadratic probe reads, and its controls
  (random, feature, shuffled labels), kept as a `.npz` artefact; principal angles between two.
- `fit`: `fit_subspace`, fitting one on a backbone's layer and a dataset.
- `intervene`: the tensor maths of `shuffle`, `inject` and `remove` on patch tokens.
- `backbone`: a backbone (from an `intervene:...:<base>` spec, its grammar in
  `bench.core.intervention_specs`) whose hidden state L is changed in the
  network by a forward hook, so every later layer and every task sees the change.
"""

from __future__ import annotations

from bench.core.intervention_specs import (INTERVENE_PREFIX, INTERVENTION_KINDS, SUBSPACE_KINDS, InterventionSpec,
                                           is_intervened, parse_intervention, reads_ground_truth)
from evaluators.interventions.backbone import IntervenedBackbone
from evaluators.interventions.fit import fit_subspace
from evaluators.interventions.intervene import Intervention, apply_intervention
from evaluators.interventions.subspace import (Subspace, load_subspace, principal_angles, save_subspace,
                                               subspace_from_quadratic)

__all__ = ["INTERVENE_PREFIX", "INTERVENTION_KINDS", "IntervenedBackbone", "Intervention", "InterventionSpec",
           "SUBSPACE_KINDS", "Subspace", "apply_intervention", "fit_subspace", "is_intervened", "load_subspace",
           "parse_intervention", "principal_angles", "reads_ground_truth", "save_subspace", "subspace_from_quadratic"]
