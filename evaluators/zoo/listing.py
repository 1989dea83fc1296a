"""What `bench models` shows of the zoo, without loading (or training) a model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evaluators.zoo.recipes import RECIPES

if TYPE_CHECKING:  # the backbone registry imports this module: BackboneInfo is imported when called
    from evaluators.backbones.info import BackboneInfo


def zoo_specs() -> list[str]:
    return [f"zoo:{name}" for name in RECIPES]


def zoo_infos() -> list[BackboneInfo]:
    """One row per recipe as written (its own architecture: a study plans its layers from it); the
    revision is the weights' hash once trained, else `not trained`."""
    from evaluators.backbones.info import BackboneInfo
    from evaluators.zoo import zoo_root
    from evaluators.zoo.cards import damage, read_card

    out = []
    for name in RECIPES:
        a = RECIPES[name].architecture
        path = zoo_root() / RECIPES[name].folder
        revision = "not trained"
        if read_card(path) is not None:
            from evaluators.backbones.weights import files_hash

            revision = "damaged" if damage(path) else f"sha256:{files_hash(sorted(path.glob('*.safetensors')))[:12]}"
        out.append(BackboneInfo(
            spec=f"zoo:{name}", family="vit", revision=revision, n_params=vit_parameters(a), patch_size=a["patch_size"],
            input_size=a["image_size"], n_layers=a["num_hidden_layers"], width=a["hidden_size"], n_prefix=1,
            cls_index=0,
        ))
    return out


def vit_parameters(architecture: dict) -> int:
    """Parameter count of a zoo architecture (a `ViTModel` without its pooler, as the zoo builds it),
    counted from its config rather than by building the model: listing the zoo, planning a study and
    a run with nothing to do import no torch. Per layer: two layer norms, q/k/v and the attention
    output (with biases), the MLP's two linears; around them the patch projection, CLS, position
    embeddings and the final norm."""
    width, mlp = architecture["hidden_size"], architecture["intermediate_size"]
    patch, channels = architecture["patch_size"], architecture["num_channels"]
    tokens = (architecture["image_size"] // patch) ** 2 + 1
    qkv_bias = width if architecture.get("qkv_bias", True) else 0
    layer = 2 * 2 * width + 3 * (width * width + qkv_bias) + width * width + width + 2 * width * mlp + mlp + width
    embeddings = channels * patch * patch * width + width + width + tokens * width
    return embeddings + architecture["num_hidden_layers"] * layer + 2 * width
