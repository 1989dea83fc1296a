"""The zoo: small ViTs trained here, offline, with known binding demands (`zoo:NAME`).

A zoo model is an ordinary Hugging Face checkpoint directory in the cache
(`<cache>/zoo/NAME`), so `zoo:NAME` loads through exactly the path of a user's local
checkpoint and is keyed in the activation cache by its weights' hash.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Callable

from bench.errors import BenchError
from evaluators.zoo.recipes import RECIPES, Recipe
from evaluators.zoo.training import partial_dir, read_card, train_recipe

ZOO_ENV = "BINDINGBENCH_ZOO"
__all__ = ["RECIPES", "Recipe", "zoo_root", "get_recipe", "model_path", "train", "status"]


def zoo_root() -> Path:
    """$BINDINGBENCH_ZOO, else `zoo/` in the cache root (the demo pins it before it moves the
    activation cache into its own directory, so trained models outlive the demo)."""
    from evaluators.cache import cache_root

    return Path(os.environ.get(ZOO_ENV) or cache_root() / "zoo").expanduser()


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=2, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(RECIPES)}"
        raise BenchError(f"zoo: unknown model {name!r}; {hint}")
    return RECIPES[name]


def model_path(name: str) -> Path:
    """The finished checkpoint directory of `zoo:NAME` (BenchError when it is not trained)."""
    get_recipe(name)
    path = zoo_root() / name
    if read_card(path) is None:
        raise BenchError(f"zoo: {name} is not trained yet (no finished model at {path}); "
                         f"run `bench zoo train {name}`")
    return path


def train(name: str, *, seed: int | None = None, steps: int | None = None,
          progress: Callable[[int], None] | None = None, on_start: Callable[[int], None] | None = None) -> Path:
    """Train (or resume, or reuse) a recipe; `seed` and `steps` override the recipe's."""
    recipe = get_recipe(name)
    if recipe.objective == "untrained":  # the control is never trained, whatever --steps says
        steps = 0
    recipe = recipe.with_(seed=recipe.seed if seed is None else seed, steps=recipe.steps if steps is None else steps)
    if recipe.steps < 0:
        raise BenchError(f"steps: must be ≥ 0, got {recipe.steps}")
    return train_recipe(recipe, zoo_root(), progress=progress, on_start=on_start)


def status(name: str) -> dict[str, Any]:
    """What `bench zoo list` shows of one recipe: trained, interrupted or not started."""
    recipe = RECIPES[name]
    card = read_card(zoo_root() / name)
    state = "trained" if card else "interrupted" if partial_dir(zoo_root(), name).exists() else "not trained"
    return dict(name=name, spec=f"zoo:{name}", objective=recipe.objective,
                steps=card["steps"] if card else recipe.steps, status=state,
                seed=card["seed"] if card else recipe.seed,
                wall_time_s=card.get("wall_time_s") if card else None,
                final_train_loss=card.get("final_train_loss") if card else None,
                final_val_loss=card.get("final_val_loss") if card else None,
                path=str(zoo_root() / name))
