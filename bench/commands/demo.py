"""`bench demo`: the shipped `demo` study (`bench run demo`) with its size options — the whole
pipeline offline in a few minutes: train the zoo, generate, evaluate, rank.

What it runs, and why those backbones and that dataset, is the study file
(bench/studies/demo.toml); this command only turns its options into the study's variables.
"""

from __future__ import annotations

from typing import Optional

import typer

from bench.commands.common import Format
from bench.commands.run import run_and_show
from bench.core.errors import BenchError
from bench.core.paths import output_path

#: The study's variables the options set (`bench run demo --set N_TRAIN=...` is the same).
VARIABLES = {"n_train": "N_TRAIN", "n_val": "N_VAL", "n_test": "N_TEST", "image_size": "IMAGE_SIZE",
             "epochs": "EPOCHS"}


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    ctx: typer.Context,
    out: Optional[str] = typer.Option(None, "--out", "-o", metavar="DIR", help="Write the dataset, results and activation cache here (default: ./bench-demo, or a numbered one beside it; kept, and reused by a demo of the same sizes)."),
    n_train: int = typer.Option(800, help="Training scenes."),
    n_val: int = typer.Option(200, help="Validation scenes."),
    n_test: int = typer.Option(400, help="Test scenes."),
    image_size: Optional[int] = typer.Option(None, help="Image side in pixels (default: the zoo's, 64)."),
    epochs: Optional[int] = typer.Option(None, help="Maximum probe epochs (default: the evaluator's; probes stop on the validation plateau)."),
    fmt: Format = typer.Option(Format.table, "--format"),
) -> None:
    """Run the whole pipeline offline in minutes: train the zoo, generate, evaluate eight backbones and a control null, rank (`bench run demo`)."""
    folder = None if out is None else output_path(out, "out")
    for name, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if n < 1:  # probes need all three splits: refused now, not after the zoo has trained
            raise BenchError(f"{name}: must be ≥ 1, got {n}")
    if image_size is not None and image_size < 1:
        raise BenchError(f"image_size: must be > 0, got {image_size}")
    if epochs is not None and epochs < 1:
        raise BenchError(f"epochs: must be ≥ 1, got {epochs}")
    given = dict(n_train=n_train, n_val=n_val, n_test=n_test, image_size=image_size, epochs=epochs)
    run_and_show("demo", {VARIABLES[k]: str(v) for k, v in given.items() if v is not None}, folder, fmt=fmt,
                   command=(ctx.obj or {}).get("command"))
