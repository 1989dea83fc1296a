"""The intervened-backbone spec grammar, read and written without torch, for the views (board,
compare, the ablation plot) and the study sweeps that only need a spec's parts:

    intervene:<kind>=<strength>,layer=<L>,subspace=<path>[,seed=<S>]:<base spec>

The options are comma-separated `key=value`; the base spec is everything after the first `:`
that follows the options, so `intervene:shuffle=0.5,layer=2,subspace=s.npz:zoo:conjunctions` has
base `zoo:conjunctions`. A subspace path holding `,` or `:` cannot be written in it.

LEAD: the interventions core (`evaluators.interventions.backbone`) owns this grammar by the
contract; either it imports these names from here (torch-free, so the board needs no torch), or
the readers (leaderboards.compare, .board, .ablation, .site, bench.studies.sweeps) import its
`parse_intervention` instead and this module goes.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.core.errors import BenchError

INTERVENE_PREFIX = "intervene:"
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
    subspace: str
    seed: int
    base: str

    @property
    def spec(self) -> str:
        """The spec string these parts make (`parse_intervention`'s inverse)."""
        return intervention_spec(self.kind, self.strength, self.layer, self.subspace, self.base, seed=self.seed)


def is_intervened(spec: str) -> bool:
    """Whether `spec` names an intervened backbone."""
    return spec.startswith(INTERVENE_PREFIX)


def reads_ground_truth(spec: str) -> bool:
    """Whether the backbone reads the scene's ground truth (`inject` uses its instance masks), so
    its rows are shown marked and never ranked, as control rows are. A spec that does not parse
    reads none."""
    if not is_intervened(spec):
        return False
    try:
        return parse_intervention(spec).kind == "inject"
    except BenchError:
        return False


def parse_intervention(spec: str) -> InterventionSpec:
    """The parts of an `intervene:` spec; a malformed one is a one-line BenchError."""
    if not is_intervened(spec):
        raise BenchError(f"backbone: {spec!r} is not an intervened spec ({INTERVENE_PREFIX}...)")
    options, sep, base = spec[len(INTERVENE_PREFIX):].partition(":")
    if not sep or not base:
        raise BenchError(f"backbone: {spec!r} names no base backbone after its options ({INTERVENE_PREFIX}"
                         "KIND=S,layer=L,subspace=PATH:BASE)")
    parts: dict[str, str] = {}
    for item in options.split(","):
        key, eq, value = item.partition("=")
        if not eq or key in parts:
            raise BenchError(f"backbone: {spec!r}: option {item!r} is not key=value or is given twice")
        parts[key] = value
    kinds = [k for k in parts if k in INTERVENTION_KINDS]
    unknown = sorted(set(parts) - {*INTERVENTION_KINDS, "layer", "subspace", "seed"})
    if len(kinds) != 1 or unknown or "layer" not in parts or "subspace" not in parts:
        raise BenchError(f"backbone: {spec!r}: give one of {', '.join(INTERVENTION_KINDS)} with layer= and subspace= "
                         f"(and seed=){'; unknown ' + ', '.join(unknown) if unknown else ''}")
    try:
        strength, layer, seed = float(parts[kinds[0]]), int(parts["layer"]), int(parts.get("seed", "0"))
    except ValueError:
        raise BenchError(f"backbone: {spec!r}: strength must be a number, layer and seed integers") from None
    if not 0.0 <= strength <= 1.0:
        raise BenchError(f"backbone: {spec!r}: strength {strength:g} outside [0, 1]")
    return InterventionSpec(kinds[0], strength, layer, parts["subspace"], seed, base)


def intervention_spec(kind: str, strength: float, layer: int, subspace: str, base: str, *, seed: int = 0) -> str:
    """The spec of `base` with `kind` at `strength` on the subspace file `subspace` at hidden
    state `layer` (a path holding `,` or `:` is refused: the grammar could not read it back)."""
    if "," in subspace or ":" in subspace:
        raise BenchError(f"subspace: the path {subspace!r} holds ',' or ':', which an intervened spec cannot carry")
    return f"{INTERVENE_PREFIX}{kind}={strength:g},layer={layer},subspace={subspace},seed={seed}:{base}"
