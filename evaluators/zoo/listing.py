"""What `bench models` shows of the zoo, without loading (or training) a model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evaluators.zoo.recipes import RECIPES

if TYPE_CHECKING:  # the backbone registry imports this module: BackboneInfo is imported when called
    from evaluators.backbones.base import BackboneInfo


def zoo_specs() -> list[str]:
    return [f"zoo:{name}" for name in RECIPES]


def zoo_infos() -> list[BackboneInfo]:
    """One row per recipe as written (its own architecture: a study plans its layers from it); the
    revision is the weights' hash once trained, else `not trained`."""
    from evaluators.backbones.base import BackboneInfo
    from evaluators.zoo import zoo_root
    from evaluators.zoo.training import damage, read_card

    out = []
    for name in RECIPES:
        a = RECIPES[name].architecture
        path = zoo_root() / RECIPES[name].folder
        revision = "not trained"
        if read_card(path) is not None:
            from evaluators.backbones.weights import files_hash

            revision = "damaged" if damage(path) else f"sha256:{files_hash(sorted(path.glob('*.safetensors')))[:12]}"
        out.append(BackboneInfo(
            spec=f"zoo:{name}", family="vit", revision=revision, n_params=_n_params(a), patch_size=a["patch_size"],
            input_size=a["image_size"], n_layers=a["num_hidden_layers"], width=a["hidden_size"], n_prefix=1,
            cls_index=0,
        ))
    return out


def _n_params(architecture: dict) -> int:
    """Parameter count of a zoo architecture, built on the meta device (once per architecture)."""
    key = tuple(sorted(architecture.items()))
    if key not in _PARAMS:
        import torch
        from transformers import ViTConfig, ViTModel

        with torch.device("meta"):
            model = ViTModel(ViTConfig(**architecture), add_pooling_layer=False)
        _PARAMS[key] = sum(p.numel() for p in model.parameters())
    return _PARAMS[key]


_PARAMS: dict[tuple, int] = {}
