"""`bench zoo`: the in-house backbone zoo (list, train, path); models are `zoo:NAME` specs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench import api
from bench.commands.common import Format, echo, render_table, stderr

zoo_app = typer.Typer(help="Small ViTs trained here, offline, with known binding demands (specs zoo:NAME).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(zoo_app, name="zoo")


@zoo_app.command("list")
def list_zoo(fmt: Format = typer.Option(Format.table, "--format")) -> None:
    """The recipes (trained, interrupted or not trained: a trained one is `zoo:NAME`), then the other
    models in the zoo's directory: variants (another --seed or --steps) and stale ones (an earlier
    recipe, kept), with final losses and training time."""
    columns = ["name", "objective", "steps", "status", "seed", "final_train_loss", "final_val_loss", "wall_time_s", "path"]
    echo(render_table(api.zoo_inventory(), columns, fmt))


@zoo_app.command("train")
def train(
    names: list[str] = typer.Argument(..., help="Recipe names (see `bench zoo list`)."),
    seed: Optional[int] = typer.Option(None, help="Seed of weights, batches and masks (default: the recipe's, 0)."),
    steps: Optional[int] = typer.Option(None, help="Training steps (default: the recipe's; the card records them)."),
) -> None:
    """Train recipes (resuming an interrupted run, reusing a finished one) into the cache; prints each
    model's directory (with --seed or --steps, a variant's own: `zoo:NAME` stays the recipe as written)."""
    def trained(name: str, path: Path) -> None:
        stderr.print(f"zoo:{name} → {path}")
        echo(str(path))

    api.train_zoo(names, seed=seed, steps=steps, on_trained=trained)


@zoo_app.command("path")
def path(name: str = typer.Argument(..., help="Recipe name.")) -> None:
    """The checkpoint directory of a trained zoo model, the recipe as written (usable as `--model DIR`)."""
    echo(str(api.zoo_path(name)))
