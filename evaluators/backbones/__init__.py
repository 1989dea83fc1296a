"""The backbone registry: one spec string per backbone (DESIGN §6).

Spec forms: a preset name (`dinov2-large`), a Hugging Face id (`facebook/dinov2-large`,
optionally `@revision`), a local checkpoint directory, `random:<preset>`,
`pixels[:P]`, `oracle:<kind>` and `timm:<name>` (when timm is installed).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from bench.errors import BenchError
from evaluators.backbones.base import Backbone, BackboneInfo
from evaluators.backbones.ground_truth import DEFAULT_PIXEL_PATCH, ORACLE_KINDS, parse_oracle, parse_pixels
from evaluators.backbones.presets import PRESETS, Preset

__all__ = ["Backbone", "BackboneInfo", "PRESETS", "list_backbones", "resolve_backbone", "known_specs"]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")


def resolve_backbone(spec: str, **options: object) -> Backbone:
    """The backbone a spec names; options: `seed` (random: and oracle:mix, default 0).

    Unknown specs raise BenchError naming the closest known ones.
    """
    unknown = set(options) - {"seed"}
    if unknown:
        raise BenchError(f"backbone option: unknown {', '.join(sorted(unknown))}; allowed: seed")
    seed = int(options.get("seed", 0))  # type: ignore[arg-type]
    spec = spec.strip()
    if spec.startswith("random:"):
        name = spec.split(":", 1)[1]
        if name not in PRESETS:
            raise _unknown(spec, [f"random:{p}" for p in PRESETS])
        from evaluators.backbones.hf import build_random

        return build_random(spec, PRESETS[name], seed=seed)
    if spec == "pixels" or spec.startswith("pixels:"):
        return parse_pixels(spec)
    if spec.startswith("oracle:"):
        return parse_oracle(spec, seed=seed)
    if spec.startswith("timm:"):
        from evaluators.backbones.timm_models import load_timm

        return load_timm(spec)
    if spec in PRESETS:
        from evaluators.backbones.hf import load_hub

        return load_hub(spec, PRESETS[spec].hub_id)
    path = Path(spec).expanduser()
    if path.is_dir():
        from evaluators.backbones.hf import load_local

        return load_local(spec, path.resolve())
    if spec.startswith((".", "/", "~")) or path.exists():
        raise BenchError(f"model: {spec} is not a checkpoint directory")
    if _HUB_ID.fullmatch(spec):
        from evaluators.backbones.hf import load_hub

        repo, _, revision = spec.partition("@")
        return load_hub(spec, repo, revision or None)
    raise _unknown(spec, known_specs())


def known_specs() -> list[str]:
    """Every spec `bench models` lists (preset names, their hub ids, random:, pixels, oracles)."""
    return ([*PRESETS, *(p.hub_id for p in PRESETS.values()), *(f"random:{p}" for p in PRESETS),
             "pixels", f"pixels:{DEFAULT_PIXEL_PATCH}"] + [f"oracle:{k}" for k in ORACLE_KINDS])


def _unknown(spec: str, candidates: list[str]) -> BenchError:
    close = difflib.get_close_matches(spec, candidates, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "run `bench models` to list them"
    return BenchError(f"model: unknown backbone {spec!r}; {hint}")


def list_backbones() -> list[BackboneInfo]:
    """Presets, their random-init controls and the built-in baselines; needs no download."""
    out = []
    for name, preset in PRESETS.items():
        out.append(_preset_info(name, preset, _cached_revision(preset.hub_id)))
    out += [_preset_info(f"random:{name}", preset, "seed=0") for name, preset in PRESETS.items()]
    out.append(parse_pixels("pixels").info)
    out += [parse_oracle(f"oracle:{k}").info for k in ("objects", "features", "patches", "mix-0.5")]
    return out


def _cached_revision(hub_id: str) -> str:
    from evaluators.backbones.hf import cached_snapshot

    path = cached_snapshot(hub_id)
    return path.name if path else "not cached"


def _preset_info(spec: str, preset: Preset, revision: str) -> BackboneInfo:
    n_reg = int(preset.config.get("num_register_tokens", 0))
    return BackboneInfo(
        spec=spec, family=preset.family, revision=revision, n_params=preset.n_params,
        patch_size=int(preset.config["patch_size"]), input_size=preset.input_size,
        n_layers=int(preset.config["num_hidden_layers"]), width=int(preset.config["hidden_size"]),
        n_prefix=1 + n_reg, cls_index=0, register_indices=tuple(range(1, 1 + n_reg)),
    )
