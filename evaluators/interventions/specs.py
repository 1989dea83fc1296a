"""What the registry asks of an `intervene:` spec without building a model or importing torch: its
rows' weights fingerprint (`intervened_revision`), its metadata (`intervened_metadata`) and what
loading it would refuse (`check_intervened`). A study plans its intervention sweeps from these,
so a rerun with every row held reads each subspace file with numpy alone.

The registry (evaluators/backbones/__init__.py) hands its own functions to the two last: it loads
this module, so this module does not import it back."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from bench.core.hashing import sha256_hex, stable_json
from bench.core.intervention_specs import InterventionSpec, parse_intervention
from evaluators.backbones.info import BackboneInfo
from evaluators.interventions.subspace import load_subspace


def intervened_revision(base_revision: str, parsed: InterventionSpec, subspace_fingerprint: str) -> str:
    """The weights fingerprint of an intervened backbone's rows: every part of what was done."""
    material = [base_revision, parsed.kind, parsed.strength, parsed.layer, parsed.seed, subspace_fingerprint]
    return f"sha256:{sha256_hex(stable_json(material))[:12]}"


def check_intervened(spec: str, check: Callable[[str], Any]) -> Any:
    """What loading `spec` would refuse without building a model (the spec, the subspace file,
    the base's own `check`); returns the base's download, if any."""
    parsed = parse_intervention(spec)
    load_subspace(parsed.subspace)
    return check(parsed.base)


def intervened_metadata(spec: str, metadata: Callable[[str], BackboneInfo | None]) -> BackboneInfo | None:
    """`backbone_metadata` of an intervened spec: the base's (`metadata`), with this spec and its
    fingerprint (None where the base's shape is known only by running it)."""
    parsed = parse_intervention(spec)
    subspace = load_subspace(parsed.subspace)
    info = metadata(parsed.base)
    if info is None:
        return None
    return dataclasses.replace(info, spec=spec.strip(),
                               revision=intervened_revision(info.revision, parsed, subspace.fingerprint))
