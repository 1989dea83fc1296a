"""`bench zoo`: the in-house backbone zoo (list, train, path); models are `zoo:NAME` specs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench.commands.common import Format, echo, progress_bar, render_table, stderr

zoo_app = typer.Typer(help="Small ViTs trained here, offline, with known binding demands (specs zoo:NAME).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(zoo_app, name="zoo")


@zoo_app.command("list")
def list_zoo(fmt: Format = typer.Option(Format.table, "--format")) -> None:
    """The recipes (trained, interrupted or not trained: a trained one is `zoo:NAME`), then the other
    models in the zoo's directory: variants (another --seed or --steps) and stale ones (an earlier
    recipe, kept), with final losses and training time."""
    from bench.api import inventory

    columns = ["name", "objective", "steps", "status", "seed", "final_train_loss", "final_val_loss", "wall_time_s", "path"]
    echo(render_table(inventory(), columns, fmt))


@zoo_app.command("train")
def train(
    names: list[str] = typer.Argument(..., help="Recipe names (see `bench zoo list`)."),
    seed: Optional[int] = typer.Option(None, help="Seed of weights, batches and masks (default: the recipe's, 0)."),
    steps: Optional[int] = typer.Option(None, help="Training steps (default: the recipe's; the card records them)."),
) -> None:
    """Train recipes (resuming an interrupted run, reusing a finished one) into the cache; prints each
    model's directory (with --seed or --steps, a variant's own: `zoo:NAME` stays the recipe as written)."""
    from bench.api import get_recipe

    for name in names:  # every name checked before the first minute of training is spent
        get_recipe(name)
    for name in names:
        echo(str(train_one(name, seed=seed, steps=steps)))


def train_one(name: str, *, seed: int | None = None, steps: int | None = None) -> Path:
    """One recipe with a progress bar on stderr; returns its checkpoint directory."""
    from bench.api import train_zoo

    with progress_bar(f"train zoo:{name}") as bar:
        path = train_zoo(name, seed=seed, steps=steps, progress=bar.advance, on_start=bar.set_total)
    stderr.print(f"zoo:{name} → {path}")
    return path


@zoo_app.command("path")
def path(name: str = typer.Argument(..., help="Recipe name.")) -> None:
    """The checkpoint directory of a trained zoo model, the recipe as written (usable as `--model DIR`)."""
    from bench.api import model_path

    echo(str(model_path(name)))
