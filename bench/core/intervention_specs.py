"""The intervened-backbone spec grammar, read and written without torch, for the views (board,
compare, the ablation plot) and the study sweeps that only need a spec's parts:

    intervene:<kind>=<strength>,layer=<L>,subspace=<path>[,seed=<S>]:<base spec>

The options are comma-separated `key=value`; the base spec is everything after the first `:`
that follows the options, so `intervene:shuffle=0.5,layer=2,subspace=s.npz:zoo:conjunctions` has
base `zoo:conjunctions`. A subspace path holding `,` or `:` cannot be written in it.

It lives in the core, torch-free, because the board, compare, the ablation plot and a study's plan
read specs without building a network; `evaluators.interventions.backbone` builds one from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import math
from typing import Any

from bench.core.errors import BenchError

INTERVENE_PREFIX = "intervene:"
GRAMMAR = "intervene:<kind>=<strength>,layer=<L>,subspace=<file.npz>[,seed=<S>]:<base spec>"
#: What an intervention does to the subspace component (`evaluators.interventions.intervene`).
INTERVENTION_KINDS = ("shuffle", "inject", "remove")
#: The strength at which each kind changes nothing (remove's 0 blends none of the mean in).
IDENTITY_STRENGTH = {"shuffle": 0.0, "inject": 1.0, "remove": 0.0}
#: The subspaces an intervention can act on: the binding probe's and its controls.
SUBSPACE_KINDS = ("binding", "random", "feature", "shuffled-labels")


@dataclass(frozen=True)
class InterventionSpec:
    """The parts of an `intervene:` spec."""

    kind: str
    strength: float
    layer: int
    subspace: str  # the subspace file
    seed: int
    base: str

    @property
    def spec(self) -> str:
        """The spec string these parts make (`parse_intervention`'s inverse)."""
        return intervention_spec(self.kind, self.strength, self.layer, self.subspace, self.base, seed=self.seed)


def is_intervened(spec: str) -> bool:
    """Whether a spec names an intervened backbone."""
    return spec.strip().startswith(INTERVENE_PREFIX)


def reads_ground_truth(spec: str) -> bool:
    """Whether an intervened backbone reads the dataset's instance masks (`inject`): its rows are
    marked and never ranked, as control rows are. A malformed spec reads as False."""
    if not is_intervened(spec):
        return False
    try:
        return parse_intervention(spec).kind == "inject"
    except BenchError:
        return False


def parse_intervention(spec: str) -> InterventionSpec:
    """The parts of `intervene:...:<base>`; one line (BenchError) for anything malformed."""
    spec = spec.strip()
    if not is_intervened(spec):
        raise BenchError(f"model: {spec}: not an intervention; expected {GRAMMAR}")
    options, sep, base = spec[len(INTERVENE_PREFIX):].partition(":")
    if not sep or not base.strip():
        raise BenchError(f"model: {spec}: no base backbone; expected {GRAMMAR}")
    found: dict[str, str] = {}
    for item in options.split(","):
        key, eq, value = (p.strip() for p in item.partition("="))
        if not eq or not value:
            raise BenchError(f"model: {spec}: option {item!r} is not key=value (a subspace path may hold neither "
                             f"',' nor ':'); expected {GRAMMAR}")
        if key in found or (key in INTERVENTION_KINDS and set(found) & set(INTERVENTION_KINDS)):
            raise BenchError(f"model: {spec}: {key} given twice (one kind, one of each option)")
        if key not in (*INTERVENTION_KINDS, "layer", "subspace", "seed"):
            raise BenchError(f"model: {spec}: unknown option {key!r}; allowed: {', '.join(INTERVENTION_KINDS)}, "
                             "layer, subspace, seed")
        found[key] = value
    kinds = [k for k in INTERVENTION_KINDS if k in found]
    missing = [k for k in ("layer", "subspace") if k not in found] + ([] if kinds else ["a kind"])
    if missing:
        raise BenchError(f"model: {spec}: names no {', '.join(missing)}; expected {GRAMMAR}")
    kind = kinds[0]
    strength = _number(spec, kind, found[kind], float)
    if not (math.isfinite(strength) and 0.0 <= strength <= 1.0):
        raise BenchError(f"model: {spec}: {kind} strength must be in [0, 1], got {found[kind]}")
    return InterventionSpec(kind, strength, _number(spec, "layer", found["layer"], int), found["subspace"],
                            _number(spec, "seed", found.get("seed", "0"), int), base.strip())


def _number(spec: str, name: str, text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise BenchError(f"model: {spec}: {name} must be {'an integer' if kind is int else 'a number'}, "
                         f"got {text!r}") from None


def intervention_spec(kind: str, strength: float, layer: int, subspace: str, base: str, *, seed: int = 0) -> str:
    """The spec of `base` with `kind` at `strength` on the subspace file `subspace` at hidden
    state `layer` (a path holding `,` or `:` is refused: the grammar could not read it back)."""
    if "," in subspace or ":" in subspace:
        raise BenchError(f"subspace: the path {subspace!r} holds ',' or ':', which an intervened spec cannot carry")
    return f"{INTERVENE_PREFIX}{kind}={strength:g},layer={layer},subspace={subspace},seed={seed}:{base}"
