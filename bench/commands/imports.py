"""`bench import ade20k|vg|clevr`: real-image datasets from local copies, in their official layouts.

Nothing is downloaded. The output is the same dataset format as `bench generate`
writes, with splits disjoint in F and priors that are empirical (`priors: empirical` in
the card; evaluation then measures binding against a reference probe given F alone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bench import api
from bench.commands.common import stderr

import_app = typer.Typer(help="Import a real-image dataset from a local copy (nothing is downloaded).",
                         no_args_is_help=True)

_SRC = typer.Option(..., "--src", help="The source's root folder, in its official layout.")
_OUT = typer.Option(..., "--out", "-o", metavar="DIR", help="Output dataset directory.")
_SEED = typer.Option(0, "--split-seed", help="Salt of the hash that ranks F codes into train/val/test.")
_MAX = typer.Option(None, "--max-scenes", help="Import only the first N scenes (by source id).")
_VAL = typer.Option(0.1, "--val-fraction", help="Share of distinct F codes in val.")
_TEST = typer.Option(0.1, "--test-fraction", help="Share of distinct F codes in test.")
_OVERWRITE = typer.Option(False, "--overwrite", help="Replace an existing dataset.")
_SIZE = typer.Option(448, "--image-size", help="Side of the square every image and mask is resized to (aspect not kept).")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the CLI."""
    app.add_typer(import_app, name="import")


@import_app.command("ade20k")
def ade20k(src: Path = _SRC, out: str = _OUT, split_seed: int = _SEED, max_scenes: Optional[int] = _MAX,
           top_n: int = typer.Option(20, "--top-n", help="Object classes kept by name; the rest are 'other'."),
           val_fraction: float = _VAL, test_fraction: float = _TEST, image_size: int = _SIZE,
           overwrite: bool = _OVERWRITE) -> None:
    """ADE20K with per-image instance masks (e.g. ADE20K_2021_17_01): for --task issameobject."""
    _run("ade20k", src, out, split_seed, max_scenes, val_fraction, test_fraction, image_size, overwrite, top_n=top_n)


@import_app.command("vg")
def vg(src: Path = _SRC, out: str = _OUT, split_seed: int = _SEED, max_scenes: Optional[int] = _MAX,
       coding: str = typer.Option("vg-color", "--coding", help="vg-color (colour x name) or vg-topattr."),
       top_n: int = typer.Option(10, "--top-n", help="Values kept per group (most frequent)."),
       val_fraction: float = _VAL, test_fraction: float = _TEST, image_size: int = _SIZE,
           overwrite: bool = _OVERWRITE) -> None:
    """Visual Genome v1.2 (image_data.json, objects.json, attributes.json, VG_100K*/): VG:Color or VG:TopAttr."""
    _run("vg", src, out, split_seed, max_scenes, val_fraction, test_fraction, image_size, overwrite, coding=coding,
         top_n=top_n)


@import_app.command("clevr")
def clevr(src: Path = _SRC, out: str = _OUT, split_seed: int = _SEED, max_scenes: Optional[int] = _MAX,
          val_fraction: float = _VAL, test_fraction: float = _TEST, image_size: int = _SIZE,
           overwrite: bool = _OVERWRITE) -> None:
    """CLEVR v1.0 (scenes/CLEVR_<split>_scenes.json + images/<split>/): size x colour x material x shape."""
    _run("clevr", src, out, split_seed, max_scenes, val_fraction, test_fraction, image_size, overwrite)


def _run(importer: str, src: Path, out: str, split_seed: int, max_scenes: int | None, val_fraction: float,
         test_fraction: float, image_size: int, overwrite: bool, **options: object) -> None:
    api.import_dataset(importer, src=src, out=out, split_seed=split_seed, max_scenes=max_scenes,
                       val_fraction=val_fraction, test_fraction=test_fraction, image_size=image_size,
                       overwrite=overwrite, options=options,
                       say=lambda text: stderr.print(text, soft_wrap=True, markup=False, highlight=False))
