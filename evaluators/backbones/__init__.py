"""The backbone registry: one spec string per backbone (docs/explanation/architecture.md §2).

Spec forms: a preset name (`dinov2-large`), a Hugging Face id (`facebook/dinov2-large`,
optionally `@revision`), a local checkpoint directory, `random:<preset>`,
`pixels[:P]`, `oracle:<kind>`, `timm:<name>`, `timm:<arch>@<state-dict file>`,
`py:<file>:<function>` and `open_clip:<arch>@<tag or file>`
(optional extras; `random:timm:<name>` and `random:open_clip:<arch>` build them untrained), and
`intervene:<kind>=<strength>,layer=<L>,subspace=<file>:<base spec>` (evaluators/interventions).
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from bench.core.errors import BenchError
from bench.core.registry import Registry
from evaluators.backbones.hub import Download, hub_download
from evaluators.backbones.info import DEFAULT_PIXEL_PATCH, ORACLE_KINDS, BackboneInfo, ground_truth_spec_info
from evaluators.backbones.metadata import cached_revision, cached_weights, folder_info, library_info, preset_info
from evaluators.backbones.presets import LIBRARY_PRESETS, PREPROCESSING, PRESETS, checked_preprocessing

if TYPE_CHECKING:  # model code (torch) loads when a backbone is built, not when a run plans its rows
    from evaluators.backbones.base import Backbone
    from evaluators.backbones.module_adapter import ModuleAdapter

__all__ = ["Backbone", "BackboneInfo", "BackboneSource", "Download", "ModuleAdapter", "LIBRARY_PRESETS", "PRESETS",
           "SOURCES", "backbone_metadata", "backbone_source", "check_loadable", "list_backbones", "resolve_backbone",
           "spec_source", "known_specs"]

LIBRARIES = ("timm:", "open_clip:")


def __getattr__(name: str) -> object:
    """`Backbone` and `ModuleAdapter`, imported when first asked for: they bring torch, which the
    registry's names and metadata (`backbone_metadata`) do not need."""
    if name == "Backbone":
        from evaluators.backbones.base import Backbone

        return Backbone
    if name == "ModuleAdapter":
        from evaluators.backbones.module_adapter import ModuleAdapter

        return ModuleAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")


@dataclass(frozen=True)
class BackboneSource:
    """One way to name a backbone: which specs it `matches`, how it `load`s one (spec, seed),
    the backbones `bench models` lists for it (`listing`, needing no download) and the
    spec forms it accepts (`forms`, shown by `bench models`). A `fallback` source is tried
    after every other (a directory, a hub id), so a plugin's prefix wins over them. `check`
    refuses, without building the model or touching the network, a spec `load` would refuse
    whatever the network, and returns the download loading it needs (None: none); a source
    without one is checked when it loads."""

    forms: str
    matches: Callable[[str], bool]
    load: Callable[[str, int], Backbone]
    listing: Callable[[], list[BackboneInfo]] = list
    fallback: bool = False
    check: Callable[[str], Download | None] = lambda spec: None


#: Backbone sources by name (`bench models` lists them); plugins add more through the
#: `bindingbench.backbones` entry-point group.
SOURCES: Registry[BackboneSource] = Registry("backbone source", group="bindingbench.backbones")


def backbone_source(name: str, forms: str, matches: Callable[[str], bool],
                    listing: Callable[[], list[BackboneInfo]] = list, fallback: bool = False,
                    check: Callable[[str], Download | None] = lambda spec: None
                    ) -> Callable[[Callable[[str, int], Backbone]], Callable[[str, int], Backbone]]:
    """Decorator: register a loader `fn(spec, seed) -> Backbone` as the source `name`."""
    def decorate(fn: Callable[[str, int], Backbone]) -> Callable[[str, int], Backbone]:
        SOURCES.register(name, BackboneSource(forms, matches, fn, listing, fallback, check))
        return fn
    return decorate


def resolve_backbone(spec: str, **options: object) -> Backbone:
    """The backbone a spec names; options: `seed` (random: and oracle:mix, default 0), and
    `image_size`, `mean`, `std` in place of the model's own input side and normalisation
    (Hugging Face models and `ModuleAdapter` modules; other sources refuse them in one line).

    The first registered source that matches the spec loads it (fallback sources last).
    Unknown specs raise BenchError naming the closest known ones. A folder without
    preprocessor_config.json says once, on stderr, which input settings it runs with.
    """
    unknown = set(options) - {"seed", *PREPROCESSING}
    if unknown:
        raise BenchError(f"backbone option: unknown {', '.join(sorted(unknown))}; allowed: seed, "
                         f"{', '.join(PREPROCESSING)}")
    overrides = checked_preprocessing(**{k: options.get(k) for k in PREPROCESSING})  # type: ignore[arg-type]
    backbone = _resolve(spec, int(options.get("seed", 0)))  # type: ignore[arg-type]
    from evaluators.backbones.hf import HFBackbone

    if not isinstance(backbone, HFBackbone):
        if overrides:
            raise BenchError(f"model: {spec} brings its own input handling; {', '.join(overrides)} apply to Hugging "
                             "Face models (hub ids, presets, checkpoint folders) and ModuleAdapter modules only")
        return backbone
    backbone.override_preprocessing(**overrides)
    note = backbone.input_note()
    if note:
        print(note, file=sys.stderr)
    return backbone


def _resolve(spec: str, seed: int) -> Backbone:
    spec = spec.strip()
    name = source_of(spec)
    if name == "unknown":
        raise _unknown(spec, known_specs())
    return SOURCES.get(name).load(spec, seed)


def _is_library(spec: str) -> bool:
    return spec in LIBRARY_PRESETS or spec.startswith(LIBRARIES)


@backbone_source("preset", "preset names (Hugging Face hub)", lambda s: s in PRESETS,
                 lambda: [preset_info(n, p, cached_revision(p.hub_id)) for n, p in PRESETS.items()],
                 check=lambda s: hub_download(PRESETS[s].hub_id))
def _preset(spec: str, seed: int) -> Backbone:
    from evaluators.backbones.hf import load_hub

    return load_hub(spec, PRESETS[spec].hub_id)


@backbone_source("library", "timm:<name>, open_clip:<arch>@<tag or file>, library presets", _is_library,
                 lambda: [library_info(n, p, cached_weights(p)) for n, p in LIBRARY_PRESETS.items()],
                 check=lambda s: _check_library(s, s, seeded=False))
def _library(spec: str, seed: int) -> Backbone:
    return _load_library(spec, spec, None)


@backbone_source("random", "random:<preset> (random-init controls)", lambda s: s.startswith("random:"),
                 lambda: [*(preset_info(f"random:{n}", p, "seed=0") for n, p in PRESETS.items()),
                          *(library_info(f"random:{n}", p, "seed=0") for n, p in LIBRARY_PRESETS.items())],
                 check=lambda s: _check_random(s))
def _random(spec: str, seed: int) -> Backbone:
    name = spec.split(":", 1)[1]
    if _is_library(name):
        return _load_library(spec, name, seed)
    if name not in PRESETS:
        raise _unknown(spec, [f"random:{p}" for p in PRESETS])
    from evaluators.backbones.hf import build_random

    return build_random(spec, PRESETS[name], seed=seed)


@backbone_source("pixels", "pixels[:P]", lambda s: s == "pixels" or s.startswith("pixels:"),
                 lambda: [ground_truth_spec_info("pixels")])
def _pixels(spec: str, seed: int) -> Backbone:
    from evaluators.backbones.ground_truth import parse_pixels

    return parse_pixels(spec)


@backbone_source("oracle", "oracle:<kind>, oracle:mix-<q> for q in [0, 1]", lambda s: s.startswith("oracle:"),
                 lambda: [ground_truth_spec_info(f"oracle:{k}") for k in ("objects", "features", "patches", "mix-0.5")])
def _oracle(spec: str, seed: int) -> Backbone:
    from evaluators.backbones.ground_truth import parse_oracle

    return parse_oracle(spec, seed=seed)


@backbone_source("py", "py:<file>:<function> (a function returning a ModuleAdapter or a Backbone)",
                 lambda s: s.startswith("py:"), check=lambda s: _check_py(s))
def _py(spec: str, seed: int) -> Backbone:
    from evaluators.backbones.module_adapter import load_py

    return load_py(spec, spec[3:])


@backbone_source("intervene", "intervene:<kind>=<strength>,layer=<L>,subspace=<file.npz>[,seed=<S>]:<base spec>",
                 lambda s: s.startswith("intervene:"), check=lambda s: _check_intervened(s))
def _intervene(spec: str, seed: int) -> Backbone:
    from evaluators.interventions.backbone import load_intervened

    return load_intervened(spec, seed, resolve_backbone)


def _check_intervened(spec: str) -> Download | None:
    from evaluators.interventions.specs import check_intervened

    return check_intervened(spec, check_loadable)


def _check_random(spec: str) -> None:
    """An untrained library model's name (a preset's is `backbone_metadata`'s to check); no download."""
    name = spec.split(":", 1)[1]
    if _is_library(name):
        _check_library(spec, name, seeded=True)


def _check_py(spec: str) -> None:
    from evaluators.backbones.module_adapter import py_function

    py_function(spec, spec[3:])


def _zoo_infos() -> list[BackboneInfo]:
    from evaluators.zoo.listing import zoo_infos

    return zoo_infos()


@backbone_source("zoo", "zoo:<name>", lambda s: s.startswith("zoo:"), _zoo_infos)
def _zoo(spec: str, seed: int) -> Backbone:
    """A checkpoint directory in the cache: the local-checkpoint path, nothing else."""
    from evaluators.backbones.hf import load_local
    from evaluators.zoo import model_path

    return load_local(spec, model_path(spec.split(":", 1)[1]).resolve())


def _is_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or Path(spec).expanduser().exists()


@backbone_source("folder", "a local checkpoint directory", _is_path, fallback=True,
                 check=lambda s: _check_folder(s))
def _folder(spec: str, seed: int) -> Backbone:
    from evaluators.backbones.hf import load_local

    return load_local(spec, _checkpoint_dir(spec).resolve())


def _check_folder(spec: str) -> Download | None:
    from evaluators.backbones.metadata import check_checkpoint

    return check_checkpoint(_checkpoint_dir(spec))


def _checkpoint_dir(spec: str) -> Path:
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise BenchError(f"model: {spec} is not a checkpoint directory")
    return path


@backbone_source("hub", "a Hugging Face id[@revision]", lambda s: bool(_HUB_ID.fullmatch(s)), fallback=True,
                 check=lambda s: hub_download(*_hub_revision(s)))
def _hub(spec: str, seed: int) -> Backbone:
    from evaluators.backbones.hf import load_hub

    return load_hub(spec, *_hub_revision(spec))


def _hub_revision(spec: str) -> tuple[str, str | None]:
    """A hub id's repo and revision (None: the default branch)."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def _load_library(spec: str, name: str, seed: int | None) -> Backbone:
    """A timm or OpenCLIP backbone (`name`: a library preset or `timm:`/`open_clip:` spec);
    `seed` builds it with random init instead of its weights."""
    library, arch, weights = _library_parts(spec, name, seeded=seed is not None)
    if library == "timm":
        from evaluators.backbones.timm_models import load_timm, load_timm_file

        return load_timm_file(spec, arch, Path(weights)) if weights else load_timm(spec, arch, seed=seed)
    from evaluators.backbones.open_clip_models import load_open_clip

    return load_open_clip(spec, arch, weights, seed=seed)


def _check_library(spec: str, name: str, seeded: bool) -> Download | None:
    """What `_load_library` would refuse whatever the network, and the download it needs."""
    library, arch, weights = _library_parts(spec, name, seeded)
    if library == "timm":
        from evaluators.backbones.timm_models import check_timm

        return check_timm(spec, arch, Path(weights) if weights else None, seeded)
    from evaluators.backbones.open_clip_models import check_open_clip

    return check_open_clip(spec, arch, weights, seeded)


def _library_parts(spec: str, name: str, seeded: bool) -> tuple[str, str, str | None]:
    """(library, architecture, weights: a timm state-dict file or an OpenCLIP tag or file, None
    when not named) of a library preset or a `timm:`/`open_clip:` spec."""
    if name in LIBRARY_PRESETS:
        name = LIBRARY_PRESETS[name].spec
    library, _, rest = name.partition(":")
    arch, _, weights = rest.partition("@")
    if library == "timm" and weights and seeded:
        raise BenchError(f"model: {spec}: random: builds an untrained model; drop @{weights}")
    return library, arch, weights or None


def spec_source(spec: str) -> str:
    """Where a spec's weights come from, as `bench models` shows it: random init, a preset's
    hub id, timm, timm-file, open_clip, py-file, zoo, builtin, hf-folder, hub, or the name of
    the (plugin) source that loads it."""
    spec = spec.strip()
    name = source_of(spec)
    if name == "random":
        return "random init"
    if spec in PRESETS:
        return PRESETS[spec].hub_id
    if spec in LIBRARY_PRESETS:
        return LIBRARY_PRESETS[spec].spec
    if name == "library":
        return "timm-file" if spec.startswith("timm:") and "@" in spec else spec.split(":", 1)[0]
    if name in ("pixels", "oracle"):
        return "builtin"
    return {"py": "py-file", "folder": "hf-folder"}.get(name, name)


def known_specs() -> list[str]:
    from evaluators.zoo.listing import zoo_specs

    """Every spec `bench models` lists, and the hub ids and library names behind the presets."""
    return list(dict.fromkeys([*PRESETS, *(p.hub_id for p in PRESETS.values()), *(f"random:{p}" for p in PRESETS),
             "pixels", f"pixels:{DEFAULT_PIXEL_PATCH}"] + [f"oracle:{k}" for k in ORACLE_KINDS] + zoo_specs()
            + [*LIBRARY_PRESETS, *(p.spec for p in LIBRARY_PRESETS.values()), *(f"random:{p}" for p in LIBRARY_PRESETS)]
                             + [info.spec for _, infos in listed_by_source() for info in infos]))


def _unknown(spec: str, candidates: list[str]) -> BenchError:
    close = difflib.get_close_matches(spec, candidates, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "run `bench models` to list them"
    return BenchError(f"model: unknown backbone {spec!r}; {hint}")


def list_backbones() -> list[BackboneInfo]:
    """What every source lists (presets, random-init controls, baselines, zoo, plugins'); needs no download."""
    return [info for _, infos in listed_by_source() for info in infos]


def listed_by_source() -> list[tuple[str, list[BackboneInfo]]]:
    """(source name, the backbones it lists) for every registered source, in registration order."""
    return [(name, source.listing()) for name, source in SOURCES.items()]


def source_of(spec: str) -> str:
    """The name of the source that loads `spec` (as `resolve_backbone` picks it), or "unknown"."""
    sources = list(SOURCES.items())
    for name, source in [s for s in sources if not s[1].fallback] + [s for s in sources if s[1].fallback]:
        if source.matches(spec.strip()):
            return name
    return "unknown"


def backbone_metadata(spec: str) -> BackboneInfo | None:
    """What the registry knows of `spec` without loading weights or touching the network: its
    layers, width, patch, input size and (where the cache or the zoo can tell) the weights
    fingerprint its rows will carry. A study plans from it offline. A Hugging Face checkpoint
    folder is read from its config.json, its fingerprint hashed from its weight files (as
    loading it does). None for specs whose shape only running code tells (a `py:` file, a timm
    or OpenCLIP name that is not a preset, a hub id that is not a preset's, a plugin's); an
    unknown or malformed spec of a known source raises BenchError, as loading it would."""
    spec = spec.strip()
    name = source_of(spec)
    if name == "unknown":
        raise _unknown(spec, known_specs())
    by_hub = {p.hub_id: (n, p) for n, p in PRESETS.items()}
    if name == "preset" or (name == "hub" and spec in by_hub):
        preset = PRESETS[spec] if spec in PRESETS else by_hub[spec][1]
        return preset_info(spec, preset, cached_revision(preset.hub_id))
    if name == "library":
        return library_info(spec, LIBRARY_PRESETS[spec], cached_weights(LIBRARY_PRESETS[spec])) \
            if spec in LIBRARY_PRESETS else None
    if name == "random":
        inner = spec.split(":", 1)[1]
        if inner in PRESETS:
            return preset_info(spec, PRESETS[inner], "seed=0")
        if inner in LIBRARY_PRESETS:
            return library_info(spec, LIBRARY_PRESETS[inner], "seed=0")
        if _is_library(inner):
            return None
        raise _unknown(spec, [f"random:{p}" for p in PRESETS])
    if name in ("pixels", "oracle"):
        return ground_truth_spec_info(spec)
    if name == "zoo":
        infos = {info.spec: info for info in _zoo_infos()}
        if spec not in infos:
            raise _unknown(spec, list(infos))
        return infos[spec]
    if name == "folder":
        return folder_info(spec, Path(spec).expanduser())
    if name == "intervene":
        from evaluators.interventions.specs import intervened_metadata

        return intervened_metadata(spec, backbone_metadata)
    return None


def check_loadable(spec: str) -> Download | None:
    """Refuse, in one line, what loading `spec` would refuse whatever the network, found
    without building the model or touching the network: an unknown name or architecture, a
    missing `py:` file or function, a folder that is no checkpoint, a missing weight file.
    Returns the download loading it needs (its files are not in the local cache), None when
    it loads offline; a plugin's source without a `check` is checked when it loads. A study
    checks every backbone with it before anything is made."""
    spec = spec.strip()
    name = source_of(spec)
    if name == "unknown":
        raise _unknown(spec, known_specs())
    return SOURCES.get(name).check(spec)
