"""`bench import ade20k|vg|clevr`: real-image datasets from local copies, in their official layouts.

Nothing is downloaded. The output is the same dataset format as `bench generate`
writes, with splits disjoint in F and priors that are empirical (`priors: empirical` in
the card; evaluation then measures binding against a reference probe given F alone).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer

from bench.commands.common import progress_bar, stderr
from bench.core.errors import BenchError

import_app = typer.Typer(help="Import a real-image dataset from a local copy (nothing is downloaded).",
                         no_args_is_help=True)

_SRC = typer.Option(..., "--src", help="The source's root folder, in its official layout.")
_OUT = typer.Option(..., "--out", "-o", help="Output dataset directory.")
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
def ade20k(src: Path = _SRC, out: Path = _OUT, split_seed: int = _SEED, max_scenes: Optional[int] = _MAX,
           top_n: int = typer.Option(20, "--top-n", help="Object classes kept by name; the rest are 'other'."),
           val_fraction: float = _VAL, test_fraction: float = _TEST, image_size: int = _SIZE,
           overwrite: bool = _OVERWRITE) -> None:
    """ADE20K with per-image instance masks (e.g. ADE20K_2021_17_01): for --task issameobject."""
    from bench.api import ade20k as mod

    _check(max_scenes, val_fraction, test_fraction, image_size, out, src, overwrite)
    _run(mod.load(src, top_n=top_n, max_scenes=max_scenes), out, src, split_seed, max_scenes, val_fraction,
         test_fraction, overwrite, {"top_n": top_n, "image_size": image_size})


@import_app.command("vg")
def vg(src: Path = _SRC, out: Path = _OUT, split_seed: int = _SEED, max_scenes: Optional[int] = _MAX,
       coding: str = typer.Option("vg-color", "--coding", help="vg-color (colour x name) or vg-topattr."),
       top_n: int = typer.Option(10, "--top-n", help="Values kept per group (most frequent)."),
       val_fraction: float = _VAL, test_fraction: float = _TEST, image_size: int = _SIZE,
           overwrite: bool = _OVERWRITE) -> None:
    """Visual Genome v1.2 (image_data.json, objects.json, attributes.json, VG_100K*/): VG:Color or VG:TopAttr."""
    from bench.api import vg as mod

    _check(max_scenes, val_fraction, test_fraction, image_size, out, src, overwrite)
    _run(mod.load(src, coding=coding, top_n=top_n, max_scenes=max_scenes), out, src, split_seed, max_scenes,
         val_fraction, test_fraction, overwrite, {"coding": coding, "top_n": top_n, "image_size": image_size})


@import_app.command("clevr")
def clevr(src: Path = _SRC, out: Path = _OUT, split_seed: int = _SEED, max_scenes: Optional[int] = _MAX,
          val_fraction: float = _VAL, test_fraction: float = _TEST, image_size: int = _SIZE,
           overwrite: bool = _OVERWRITE) -> None:
    """CLEVR v1.0 (scenes/CLEVR_<split>_scenes.json + images/<split>/): size x colour x material x shape."""
    from bench.api import clevr_v1 as mod

    _check(max_scenes, val_fraction, test_fraction, image_size, out, src, overwrite)
    _run(mod.load(src, max_scenes=max_scenes), out, src, split_seed, max_scenes, val_fraction, test_fraction,
         overwrite, {"image_size": image_size})


def _check(max_scenes: int | None, val_fraction: float, test_fraction: float, image_size: int, out: Path, src: Path,
           overwrite: bool) -> None:
    """Every option and the destination, before the source is read (parsing it can take minutes)."""
    from bench.core.outdir import check_target
    from bench.core.resources import PIXEL_BYTES, available_memory, gib, largest_side

    if image_size < 16:
        raise BenchError(f"image-size: must be ≥ 16, got {image_size}")
    memory = available_memory()
    if image_size ** 2 * PIXEL_BYTES > memory:  # each image and its mask are resized to this side
        side = largest_side(memory, lambda s: s * s * PIXEL_BYTES)
        raise BenchError(f"image-size: a {image_size}-px image and its mask need at least "
                         f"{gib(image_size ** 2 * PIXEL_BYTES)} of memory, but {gib(memory)} is available; at most "
                         f"--image-size {side:,} fits")
    if max_scenes is not None and max_scenes < 1:
        raise BenchError(f"max-scenes: must be ≥ 1, got {max_scenes}")
    for name, value in (("val-fraction", val_fraction), ("test-fraction", test_fraction)):
        if not 0 < value < 1:
            raise BenchError(f"{name}: must be in (0, 1), got {value}")
    if val_fraction + test_fraction >= 1:
        raise BenchError(f"val-fraction + test-fraction: must be < 1, got {val_fraction + test_fraction}")
    check_target(out, overwrite, sources=[src], stage=True)


def _run(source: Any, out: Path, src: Path, split_seed: int, max_scenes: int | None, val_fraction: float,
         test_fraction: float, overwrite: bool, options: dict[str, Any]) -> None:
    from bench.api import write_import

    config = {"source": source.name, "src": str(src.resolve()), "split_seed": split_seed, "max_scenes": max_scenes,
              "val_fraction": val_fraction, "test_fraction": test_fraction, **options}
    t0 = time.perf_counter()
    with progress_bar(f"import {source.name} → {out}", total=len(source.scenes)) as bar:
        card = write_import(source, out, split_seed=split_seed, val_fraction=val_fraction,
                            test_fraction=test_fraction, config=config, overwrite=overwrite, sources=[src],
                            progress=bar.advance)
    n = sum(s["n"] for s in card["splits"].values())
    per_split = ", ".join(f"{k} {v['n']}" for k, v in card["splits"].items())
    stderr.print(f"wrote {n} scenes to {out} in {time.perf_counter() - t0:.1f} s ({per_split}; priors: empirical)")
