"""The generator that wrote a dataset card, rebuilt from the card's name, version and config:
exact priors, resampled object codes and F-code counts all read the distribution from it."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Mapping

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError
from bench.core.hashing import stable_json
from generators.priors import PriorsUnavailable

_GENERATORS: dict[str, Any] = {}


def generator_of(card: Mapping[str, Any]):
    """The generator that wrote a card, rebuilt from its name and full config (memoised).

    Raises PriorsUnavailable when the card has no generator or config, names an unknown
    generator, was written by another version of it, or its config no longer builds or
    no longer reproduces the card's feature space and split priors.
    """
    from generators.base import get_generator

    gen_info, config = card.get("generator"), card.get("config")
    if not isinstance(gen_info, Mapping) or "name" not in gen_info or not isinstance(config, Mapping):
        raise PriorsUnavailable(
            f"dataset card: no generator config (schema {card.get('schema_version', 0)}); regenerate it with "
            "`bench generate ...`, or pass --unanchored")
    name = gen_info["name"]
    regen = f"regenerate it with `bench generate {name} ...`, or pass --unanchored"
    key = stable_json([gen_info, config, card.get("feature_space")])
    if key in _GENERATORS:
        return _GENERATORS[key]
    try:
        cls = get_generator(name)
    except BenchError:
        raise PriorsUnavailable(f"dataset card: unknown generator {name!r}; {regen}") from None
    if gen_info.get("version") != cls.version:
        raise PriorsUnavailable(f"dataset card: written by {name} v{gen_info.get('version')}, this is "
                                f"v{cls.version} (its distribution may differ); {regen}")
    try:
        gen = cls(_config(cls.config_cls, config))
    except (BenchError, TypeError, ValueError) as e:
        raise PriorsUnavailable(f"dataset card: its {name} config no longer builds here ({_one_line(e)}); "
                                f"{regen}") from None
    if "feature_space" in card and gen.feature_space != FeatureSpace.from_dict(card["feature_space"]):
        raise PriorsUnavailable(f"dataset card: its {name} config rebuilds a different feature space; {regen}")
    for split, info in card.get("splits", {}).items():
        plan = gen.plans.get(split)
        if plan is None or not _same_priors(plan.priors.to_dict(), info):
            raise PriorsUnavailable(f"dataset card: its {name} config no longer reproduces split {split!r}'s "
                                    f"priors; {regen}")
    _GENERATORS[key] = gen
    return gen


def _config(cls: type, values: Mapping[str, Any]):
    """The config dataclass from a card's dict (JSON lists back to the tuple fields)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unknown parameter(s) {', '.join(unknown)}")
    out = {}
    for k, v in values.items():
        if isinstance(v, list) and typing.get_origin(hints.get(k)) is tuple:
            v = tuple(v)
        out[k] = v
    return cls(**out)


def _same_priors(rebuilt: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    for k in ("n_F_codes", "H_O", "H_F", "H_O_given_F"):
        if k in stored and not math.isclose(float(rebuilt[k]), float(stored[k]), rel_tol=1e-12, abs_tol=1e-12):
            return False
    return True


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())
