"""What the backbone registry says of a preset, a library preset or a checkpoint folder without
loading weights (`bench models`, `backbone_metadata`): their `BackboneInfo` from configuration and
the local caches, never the network."""

from __future__ import annotations

from pathlib import Path

from bench.core.errors import BenchError
from evaluators.backbones.info import BackboneInfo
from evaluators.backbones.presets import LibraryPreset, Preset


def folder_info(spec: str, path: Path) -> BackboneInfo | None:
    """A checkpoint folder's metadata from its config.json (CLIP: its vision tower's), None when
    the config does not say (the folder is checked when it loads)."""
    import json

    from evaluators.backbones.weights import WEIGHT_PATTERNS, files_hash

    try:
        config = json.loads((path / "config.json").read_text())
        vision = config.get("vision_config", config) if config.get("model_type") == "clip" else config
        n_layers, width, patch = (int(vision[k]) for k in ("num_hidden_layers", "hidden_size", "patch_size"))
        side = int(vision.get("image_size", 224))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    registers = int(vision.get("num_register_tokens", 0) or 0)
    weights = files_hash(sorted(f for pattern in WEIGHT_PATTERNS for f in path.glob(pattern)))
    return BackboneInfo(spec=spec, family=str(config.get("model_type", "hf")), revision=f"sha256:{weights[:12]}",
                        n_params=0, patch_size=patch, input_size=side, n_layers=n_layers, width=width,
                        n_prefix=1 + registers, cls_index=0, register_indices=tuple(range(1, 1 + registers)))


def cached_revision(hub_id: str) -> str:
    from evaluators.backbones.hub import cached_snapshot

    path = cached_snapshot(hub_id)
    return path.name if path else "not cached"


def preset_info(spec: str, preset: Preset, revision: str) -> BackboneInfo:
    n_reg = int(preset.config.get("num_register_tokens", 0))
    return BackboneInfo(
        spec=spec, family=preset.family, revision=revision, n_params=preset.n_params,
        patch_size=int(preset.config["patch_size"]), input_size=preset.input_size,
        n_layers=int(preset.config["num_hidden_layers"]), width=int(preset.config["hidden_size"]),
        n_prefix=1 + n_reg, cls_index=0, register_indices=tuple(range(1, 1 + n_reg)),
    )


def cached_weights(preset: LibraryPreset) -> str:
    from evaluators.backbones.hub_weights import cached_hub_file

    return "cached" if cached_hub_file(preset.weights_repo, preset.weights_files) else "not cached"


def library_info(spec: str, preset: LibraryPreset, revision: str) -> BackboneInfo:
    cls = int(preset.has_cls)
    return BackboneInfo(
        spec=spec, family=preset.family, revision=revision, n_params=preset.n_params, patch_size=preset.patch_size,
        input_size=preset.input_size, n_layers=preset.n_layers, width=preset.width, n_prefix=preset.n_prefix,
        cls_index=0 if cls else None, register_indices=tuple(range(cls, preset.n_prefix)),
    )


def check_checkpoint(path: Path) -> None:
    """Refuse a folder that is no Hugging Face checkpoint (no config.json), in one line."""
    if not (path / "config.json").is_file():
        raise BenchError(f"model: {path} has no config.json (not a Hugging Face checkpoint directory)")
