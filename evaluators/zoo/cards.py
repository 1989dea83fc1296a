"""A published zoo model's card and its checks, without torch: `bench models`, a study's plan and a
run with nothing to do read a zoo model's state (trained, damaged, its weights' hash) before any
model code loads (`evaluators.zoo.training` trains and publishes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.core.dataset import write_json_atomic
from bench.core.hashing import file_sha256

if TYPE_CHECKING:
    from evaluators.zoo.recipes import Recipe

CARD_NAME = "zoo_card.json"
#: The files a published model loads from, hashed into its card (`files`).
WEIGHT_FILES = ("model.safetensors", "config.json")


def partial_dir(root: Path, recipe: Recipe) -> Path:
    """Where an unfinished training of `recipe` keeps its state (a run there is "interrupted")."""
    return root / f".{recipe.folder}.partial"


def read_card(path: Path) -> dict[str, Any] | None:
    """A finished zoo model's card (any JSON value it holds), or None when `path` has none."""
    try:
        return json.loads((path / CARD_NAME).read_text())
    except (OSError, ValueError):
        return None if not (path / CARD_NAME).exists() else {}


def damage(path: Path) -> str | None:
    """Why the finished model at `path` cannot be used (None: it can): a card of the wrong
    shape, a missing weight file, or one whose hash differs from the card's. A card without
    hashes (written before they were recorded) gains them when its files load."""
    card = read_card(path)
    if not isinstance(card, dict) or not isinstance(card.get("name"), str) or not isinstance(card.get("recipe"), dict):
        return f"{CARD_NAME} is not a zoo card"
    missing = [f for f in WEIGHT_FILES if not (path / f).is_file()]
    if missing:
        return f"{', '.join(missing)} missing"
    hashes = {f: file_sha256(path / f) for f in WEIGHT_FILES}
    recorded = card.get("files")
    if isinstance(recorded, dict):
        changed = [f for f in WEIGHT_FILES if recorded.get(f) != hashes[f]]
        return f"{', '.join(changed)} differ{'s' if len(changed) == 1 else ''} from the card's hash" if changed else None
    why = _unloadable(path)
    if why is None:
        write_json_atomic({**card, "files": hashes}, path / CARD_NAME)
    return why


def _unloadable(path: Path) -> str | None:
    """Whether the weights and config parse (for cards that predate recorded hashes)."""
    from safetensors import safe_open

    try:
        json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"config.json does not load ({type(e).__name__})"
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            for key in f.keys():
                f.get_tensor(key)
    except Exception as e:  # noqa: BLE001 — safetensors raises several types for a damaged file
        return f"model.safetensors does not load ({type(e).__name__})"
    return None
