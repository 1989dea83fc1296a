"""Importers of real-image datasets from local copies (`bench import`, a study's `import`)."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any, Callable

from bench.core.errors import BenchError

#: Importer name -> (module, the options its `load` takes beside the source folder).
IMPORTERS = {"ade20k": ("generators.importers.ade20k", ("top_n",)),
             "vg": ("generators.importers.vg", ("coding", "top_n")),
             "clevr": ("generators.importers.clevr_v1", ())}


def import_dataset(importer: str, src: Path, out: Path, *, split_seed: int = 0, max_scenes: int | None = None,
                   val_fraction: float = 0.1, test_fraction: float = 0.1, image_size: int = 448,
                   overwrite: bool = False, say: Callable[[str], None] | None = None,
                   **options: Any) -> dict[str, Any]:
    """Import the local copy at `src` (its official layout) into a dataset at `out` and return
    its card. Every option and the destination are checked before the source is read (parsing
    it can take minutes, `check_import`); `options` are the importer's own (`top_n`, `coding`)."""
    check_import(importer, src, out, max_scenes=max_scenes, val_fraction=val_fraction, test_fraction=test_fraction,
                 image_size=image_size, overwrite=overwrite, **options)
    src, out = Path(src), Path(out)
    module, allowed = IMPORTERS[importer]
    source = importlib.import_module(module).load(src, max_scenes=max_scenes, **options)
    from bench.core.console import progress_bar
    from generators.importers.common import write_import

    defaults = {"top_n": 20 if importer == "ade20k" else 10, "coding": "vg-color"}
    recorded = {k: options.get(k, defaults[k]) for k in allowed}
    config = {"source": source.name, "src": str(src.resolve()), "split_seed": split_seed, "max_scenes": max_scenes,
              "val_fraction": val_fraction, "test_fraction": test_fraction, **recorded, "image_size": image_size}
    t0 = time.perf_counter()
    with progress_bar(f"import {source.name} → {out}", total=len(source.scenes)) as bar:
        card = write_import(source, out, split_seed=split_seed, val_fraction=val_fraction,
                            test_fraction=test_fraction, config=config, overwrite=overwrite, sources=[src],
                            progress=bar.advance)
    n = sum(s["n"] for s in card["splits"].values())
    per_split = ", ".join(f"{k} {v['n']}" for k, v in card["splits"].items())
    if say is not None:
        say(f"wrote {n} scenes to {out} in {time.perf_counter() - t0:.1f} s ({per_split}; priors: empirical)")
    return card


def check_import(importer: str, src: Path, out: Path, *, max_scenes: int | None = None, val_fraction: float = 0.1,
                 test_fraction: float = 0.1, image_size: int = 448, overwrite: bool = False, **options: Any) -> None:
    """Refuse, touching nothing and reading no source, what `import_dataset` would refuse of
    these options and destination: a study checks its imports with it before anything is made."""
    if importer not in IMPORTERS:
        raise BenchError(f"import: unknown importer {importer!r}; allowed: {', '.join(IMPORTERS)}")
    unknown = set(options) - set(IMPORTERS[importer][1])
    if unknown:
        raise BenchError(f"import {importer}: unknown option {sorted(unknown)[0]}; allowed: "
                         f"{', '.join(IMPORTERS[importer][1]) or 'none beyond the common ones'}")
    _check(max_scenes, val_fraction, test_fraction, image_size, Path(out), Path(src), overwrite)


def _check(max_scenes: int | None, val_fraction: float, test_fraction: float, image_size: int, out: Path, src: Path,
           overwrite: bool) -> None:
    """Every option and the destination, before the source is read."""
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
