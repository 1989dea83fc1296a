"""The zoo: small ViTs trained here, offline, with known binding demands (`zoo:NAME`).

A zoo model is an ordinary Hugging Face checkpoint directory in the cache
(`<cache>/zoo/NAME-<hash>`, the hash of its recipe), so `zoo:NAME` loads through exactly the
path of a user's local checkpoint and is keyed in the activation cache by its weights' hash.
`zoo:NAME` is the current recipe's folder; folders of earlier recipes are kept and listed as
stale, never loaded under the name.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Callable

from bench.core.errors import BenchError
from evaluators.zoo.cards import damage, partial_dir, read_card
from evaluators.zoo.recipes import RECIPES, Recipe

ZOO_ENV = "BINDINGBENCH_ZOO"
__all__ = ["RECIPES", "Recipe", "zoo_root", "get_recipe", "model_path", "train", "status", "inventory"]


def zoo_root() -> Path:
    """$BINDINGBENCH_ZOO, else `zoo/` in the cache root (the demo pins it before it moves the
    activation cache into its own directory, so trained models outlive the demo)."""
    from evaluators.cache.entries import cache_root

    return Path(os.environ.get(ZOO_ENV) or cache_root() / "zoo").expanduser()


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=2, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(RECIPES)}"
        raise BenchError(f"zoo: unknown model {name!r}; {hint}")
    return RECIPES[name]


def model_path(name: str) -> Path:
    """The finished checkpoint directory of `zoo:NAME`'s current recipe (BenchError when it is not trained)."""
    path = zoo_root() / get_recipe(name).folder
    if read_card(path) is None:
        raise BenchError(f"zoo: {name} is not trained yet (no finished model at {path}); "
                         f"run `bench zoo train {name}`")
    why = damage(path)
    if why is not None:
        raise BenchError(f"zoo: {name} at {path} is damaged ({why}); `bench zoo train {name}` trains it again")
    return path


def train(name: str, *, seed: int | None = None, steps: int | None = None,
          progress: Callable[[int], None] | None = None, on_start: Callable[[int], None] | None = None) -> Path:
    """Train (or resume, or reuse) a recipe; `seed` and `steps` override the recipe's (a variant
    with its own folder: `zoo:NAME` stays the recipe as written)."""
    recipe = get_recipe(name)
    if recipe.objective == "untrained":  # the control is never trained, whatever --steps says
        steps = 0
    recipe = recipe.with_(seed=recipe.seed if seed is None else seed, steps=recipe.steps if steps is None else steps)
    if recipe.steps < 0:
        raise BenchError(f"steps: must be ≥ 0, got {recipe.steps}")
    from evaluators.zoo.training import train_recipe  # torch: only to train

    return train_recipe(recipe, zoo_root(), progress=progress, on_start=on_start)


def status(name: str) -> dict[str, Any]:
    """What `bench zoo list` shows of one recipe as written: trained, interrupted or not trained."""
    recipe = RECIPES[name]
    path = zoo_root() / recipe.folder
    card = read_card(path)
    why = damage(path) if card is not None else None
    if card is None:
        state = "interrupted" if partial_dir(zoo_root(), recipe).exists() else "not trained"
    else:
        state = f"damaged: {why}" if why else "trained"
    return _row(recipe.name, recipe.objective, card if isinstance(card, dict) and not why else recipe.to_dict(),
                state, path)


def inventory() -> list[dict[str, Any]]:
    """Every recipe's `status`, then every other finished model in the zoo's directory: a variant
    (the recipe as written but another seed or number of steps, `bench zoo train --seed/--steps`)
    or stale (trained by a recipe that has changed since; kept, never loaded as `zoo:NAME`)."""
    rows = [status(name) for name in RECIPES]
    current = {RECIPES[name].folder for name in RECIPES}
    root = zoo_root()
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        card = read_card(path)
        if path.name in current or path.name.startswith(".") or card is None:
            continue
        why = damage(path)
        if why is not None:
            rows.append(_row(path.name, None, {}, f"damaged: {why}", path))
            continue
        recipe, written = card.get("recipe", {}), RECIPES.get(card.get("name", ""))
        same = written is not None and {**recipe, "seed": written.seed, "steps": written.steps} == written.to_dict()
        rows.append(_row(card.get("name", path.name), card.get("objective"), card, "variant" if same else "stale", path))
    return rows


def _row(name: str, objective: str | None, card: dict[str, Any], state: str, path: Path) -> dict[str, Any]:
    return dict(name=name, objective=objective,
                steps=card.get("steps"), status=state, seed=card.get("seed"), wall_time_s=card.get("wall_time_s"),
                final_train_loss=card.get("final_train_loss"), final_val_loss=card.get("final_val_loss"),
                path=str(path))
