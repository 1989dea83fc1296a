"""The backbone registry: one spec string per backbone (docs/ARCHITECTURE.md §2).

Spec forms: a preset name (`dinov2-large`), a Hugging Face id (`facebook/dinov2-large`,
optionally `@revision`), a local checkpoint directory, `random:<preset>`,
`pixels[:P]`, `oracle:<kind>`, `timm:<name>`, `timm:<arch>@<state-dict file>`,
`py:<file>:<function>` and `open_clip:<arch>@<tag or file>`
(optional extras; `random:timm:<name>` and `random:open_clip:<arch>` build them untrained).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from bench.errors import BenchError
from evaluators.backbones.base import Backbone, BackboneInfo
from evaluators.backbones.module_adapter import ModuleAdapter
from evaluators.backbones.ground_truth import DEFAULT_PIXEL_PATCH, ORACLE_KINDS, parse_oracle, parse_pixels
from evaluators.backbones.presets import LIBRARY_PRESETS, PRESETS, LibraryPreset, Preset
from evaluators.zoo.listing import zoo_infos, zoo_specs

__all__ = ["Backbone", "BackboneInfo", "ModuleAdapter", "LIBRARY_PRESETS", "PRESETS", "list_backbones", "resolve_backbone",
           "spec_source", "known_specs"]

LIBRARIES = ("timm:", "open_clip:")
PREPROCESSING = ("image_size", "mean", "std")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")


def resolve_backbone(spec: str, **options: object) -> Backbone:
    """The backbone a spec names; options: `seed` (random: and oracle:mix, default 0), and
    `image_size`, `mean`, `std` in place of an image model's own preprocessing.

    Unknown specs raise BenchError naming the closest known ones.
    """
    unknown = set(options) - {"seed", *PREPROCESSING}
    if unknown:
        raise BenchError(f"backbone option: unknown {', '.join(sorted(unknown))}; allowed: seed, "
                         f"{', '.join(PREPROCESSING)}")
    overrides = {k: options[k] for k in PREPROCESSING if options.get(k) is not None}
    backbone = _resolve(spec, int(options.get("seed", 0)))  # type: ignore[arg-type]
    if not overrides:
        return backbone
    from evaluators.backbones.hf import HFBackbone

    if not isinstance(backbone, HFBackbone):
        raise BenchError(f"model: {spec} reads no images through a normaliser; "
                         f"{', '.join(sorted(overrides))} apply to image models only")
    return backbone.override_preprocessing(**overrides)  # type: ignore[arg-type]


def _resolve(spec: str, seed: int) -> Backbone:
    spec = spec.strip()
    if spec.startswith("random:"):
        name = spec.split(":", 1)[1]
        if name in LIBRARY_PRESETS or name.startswith(LIBRARIES):
            return _load_library(spec, name, seed)
        if name not in PRESETS:
            raise _unknown(spec, [f"random:{p}" for p in PRESETS])
        from evaluators.backbones.hf import build_random

        return build_random(spec, PRESETS[name], seed=seed)
    if spec == "pixels" or spec.startswith("pixels:"):
        return parse_pixels(spec)
    if spec.startswith("oracle:"):
        return parse_oracle(spec, seed=seed)
    if spec.startswith("py:"):
        from evaluators.backbones.module_adapter import load_py

        return load_py(spec, spec[3:])
    if spec.startswith("zoo:"):  # a checkpoint directory in the cache: the local-checkpoint path, nothing else
        from evaluators.backbones.hf import load_local
        from evaluators.zoo import model_path

        return load_local(spec, model_path(spec.split(":", 1)[1]).resolve())
    if spec in LIBRARY_PRESETS or spec.startswith(LIBRARIES):
        return _load_library(spec, spec, None)
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


def _load_library(spec: str, name: str, seed: int | None) -> Backbone:
    """A timm or OpenCLIP backbone (`name`: a library preset or `timm:`/`open_clip:` spec);
    `seed` builds it with random init instead of its weights."""
    if name in LIBRARY_PRESETS:
        name = LIBRARY_PRESETS[name].spec
    library, _, rest = name.partition(":")
    if library == "timm":
        from evaluators.backbones.timm_models import load_timm, load_timm_file

        arch, _, weights = rest.partition("@")
        if weights:
            if seed is not None:
                raise BenchError(f"model: {spec}: random: builds an untrained model; drop @{weights}")
            return load_timm_file(spec, arch, Path(weights))
        return load_timm(spec, rest, seed=seed)
    from evaluators.backbones.open_clip_models import load_open_clip

    arch, _, tag = rest.partition("@")
    return load_open_clip(spec, arch, tag or None, seed=seed)


def spec_source(spec: str) -> str:
    """Where a spec's weights come from, as `bench models` shows it: random init, a
    preset's hub id, hub, hf-folder, timm-file, timm, open_clip, py-file, zoo or builtin."""
    spec = spec.strip()
    if spec.startswith("random:"):
        return "random init"
    if spec in PRESETS:
        return PRESETS[spec].hub_id
    if spec in LIBRARY_PRESETS:
        return LIBRARY_PRESETS[spec].spec
    for prefix, source in (("py:", "py-file"), ("zoo:", "zoo"), ("open_clip:", "open_clip")):
        if spec.startswith(prefix):
            return source
    if spec.startswith("timm:"):
        return "timm-file" if "@" in spec else "timm"
    if spec == "pixels" or spec.startswith(("pixels:", "oracle:")):
        return "builtin"
    return "hf-folder" if Path(spec).expanduser().is_dir() else "hub"


def known_specs() -> list[str]:
    """Every spec `bench models` lists (preset names, their hub ids, random:, pixels, oracles)."""
    return ([*PRESETS, *(p.hub_id for p in PRESETS.values()), *(f"random:{p}" for p in PRESETS),
             "pixels", f"pixels:{DEFAULT_PIXEL_PATCH}"] + [f"oracle:{k}" for k in ORACLE_KINDS] + zoo_specs()
            + [*LIBRARY_PRESETS, *(p.spec for p in LIBRARY_PRESETS.values()), *(f"random:{p}" for p in LIBRARY_PRESETS)])


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
    out += [_library_info(name, p, _cached_weights(p)) for name, p in LIBRARY_PRESETS.items()]
    out += [_library_info(f"random:{name}", p, "seed=0") for name, p in LIBRARY_PRESETS.items()]
    out.append(parse_pixels("pixels").info)
    out += [parse_oracle(f"oracle:{k}").info for k in ("objects", "features", "patches", "mix-0.5")]
    out += zoo_infos()
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


def _cached_weights(preset: LibraryPreset) -> str:
    from evaluators.backbones.hub_weights import cached_hub_file

    return "cached" if cached_hub_file(preset.weights_repo, preset.weights_files) else "not cached"


def _library_info(spec: str, preset: LibraryPreset, revision: str) -> BackboneInfo:
    cls = int(preset.has_cls)
    return BackboneInfo(
        spec=spec, family=preset.family, revision=revision, n_params=preset.n_params, patch_size=preset.patch_size,
        input_size=preset.input_size, n_layers=preset.n_layers, width=preset.width, n_prefix=preset.n_prefix,
        cls_index=0 if cls else None, register_indices=tuple(range(cls, preset.n_prefix)),
    )
