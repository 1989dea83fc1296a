"""The zoo's published heads: each trained recipe's objective head, kept beside its ViT.

A zoo model's folder holds the ViT (`model.safetensors`, what `zoo:NAME` loads) and, since heads
are published, `head/`: the head's weights (`head.safetensors`) and `head.json`, which says what
the head is and how training measured its loss (objective, what it reads, the masked model's
mask ratio, patch size and the seed of its validation masks), with the sha256 of the ViT it
was trained with and of its own weights. The head lives in a folder of its own so that the
ViT's weights fingerprint (every `*.safetensors` beside `config.json`) is what it was before
heads were published: the same recipe and seed give the same fingerprint, and activations
cached from an older folder still apply. Folders trained before heads were published, and
the untrained control, have no head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.core.dataset import write_json_atomic
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed, file_sha256
from evaluators.zoo.recipes import Recipe

HEAD_DIR = "head"
HEAD_WEIGHTS = "head.safetensors"
HEAD_CARD = "head.json"
#: Scenes per batch when a split's loss is measured (training's validation loss, the `objective` task):
#: the masked model's masks are drawn batch by batch from one generator, so the batching is part of the loss.
LOSS_BATCH = 64


def val_mask_seed(recipe: Recipe) -> int:
    """The seed of the masks training draws for its validation loss (and the `objective` task reuses)."""
    return derive_seed("zoo-val", recipe.seed)


@dataclass(frozen=True)
class Head:
    """A published head and what `head.json` says of it."""

    module: torch.nn.Module
    objective: str
    patch_size: int
    mask_ratio: float
    mask_seed: int
    batch: int

    @property
    def target(self) -> str:
        """What it predicts: "pixels" (masked patches), "O" or "F" (codes, read from CLS)."""
        return {"masked": "pixels", "conjunctions": "O", "features": "F"}[self.objective]


def save_head(head: torch.nn.Module, recipe: Recipe, folder: Path) -> None:
    """Write `head` into `folder/head/` (the model's folder, before it is published), beside the ViT
    whose `model.safetensors` is already there."""
    from safetensors.torch import save_file

    where = folder / HEAD_DIR
    where.mkdir()
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(where / HEAD_WEIGHTS))
    write_json_atomic(dict(
        objective=recipe.objective, head="linear", in_features=head.in_features, out_features=head.out_features,
        reads="patch tokens" if recipe.objective == "masked" else "CLS",
        input="the last hidden state after the final layer norm (last_hidden_state)",
        patch_size=recipe.architecture["patch_size"], mask_ratio=recipe.mask_ratio, mask_seed=val_mask_seed(recipe),
        batch=LOSS_BATCH, vit_sha256=file_sha256(folder / "model.safetensors"),
        sha256=file_sha256(where / HEAD_WEIGHTS),
    ), where / HEAD_CARD)


def load_head(folder: Path, spec: str) -> Head:
    """The head published in zoo model folder `folder` (`spec` names it in messages); a BenchError
    when it has none (a folder trained before heads were published) or one that does not match."""
    where = folder / HEAD_DIR
    try:
        card: dict[str, Any] = json.loads((where / HEAD_CARD).read_text())
    except FileNotFoundError:
        raise BenchError(f"objective: {spec} has no head ({folder} was trained before the zoo published "
                         f"heads; `bench zoo train` into a fresh zoo folder gives one)") from None
    except (OSError, ValueError):
        raise BenchError(f"objective: {spec}'s {where / HEAD_CARD} does not read as JSON") from None
    weights = where / HEAD_WEIGHTS
    if not weights.is_file() or file_sha256(weights) != card.get("sha256"):
        raise BenchError(f"objective: {spec}'s head weights {weights} are missing or differ from {HEAD_CARD}'s hash")
    if file_sha256(folder / "model.safetensors") != card.get("vit_sha256"):
        raise BenchError(f"objective: {spec}'s head was trained with other ViT weights than {folder}'s")
    from safetensors.torch import load_file

    module = torch.nn.Linear(int(card["in_features"]), int(card["out_features"]))
    module.load_state_dict(load_file(str(weights)))
    return Head(module.eval().requires_grad_(False), card["objective"], int(card["patch_size"]),
                float(card["mask_ratio"]), int(card["mask_seed"]), int(card["batch"]))
