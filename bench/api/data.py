"""Datasets: render a synthetic one, import a real one, list the generators, draw a preview sheet."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bench.api.arguments import PathLike, Say
from bench.core.errors import BenchError


def generate(
    generator: str,
    *,
    out: PathLike,
    preset: str | None = None,
    n_train: int | None = None,
    n_val: int | None = None,
    n_test: int | None = None,
    seed: int | None = None,
    image_size: int | None = None,
    workers: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    executor: str = "local",
    address: str | None = None,
    progress: bool = False,
) -> Path:
    """Render a synthetic dataset of `generator` (see `bench generators`) into `out` and return
    `out`; the same config and seed give the same bytes, whatever `workers` (default: every core).

    `preset` defaults to the generator's own; `n_train`, `n_val`, `n_test`, `seed` and
    `image_size` override it, as does any config parameter in `overrides` (values typed, or
    strings as `--set KEY=VALUE` gives them; a named argument that disagrees with `overrides` is refused). A
    generator that sweeps a parameter (3D scenes' `camera_heights`) writes one dataset per
    setting in a subfolder of `out`. Every dataset's config and destination are checked
    before any is written; `overwrite` replaces existing ones. `executor` "ray" renders the
    shards as Ray tasks (on the cluster at `address`). `progress` shows a bar per dataset
    and a line when it is written."""
    from bench.core.outdir import check_target
    from bench.core.paths import output_path
    from generators.base import build_config, get_generator
    from generators.engine import check_resources

    out = output_path(out, "out")  # "" is the working directory: refused, not written into
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise BenchError(f"workers: must be ≥ 1, got {workers}")
    shards = None
    if executor != "local":
        from bench.core.ray_cluster import require_ray

        require_ray(executor, address)
        from generators.ray_shards import ray_shards

        shards = ray_shards(address)
    elif address is not None:
        raise BenchError("executor: --address needs --executor ray")
    gen = get_generator(generator)
    named = {k: v for k, v in dict(n_train=n_train, n_val=n_val, n_test=n_test, seed=seed,
                                   image_size=image_size).items() if v is not None}
    for key, value in named.items():
        if key in (overrides or {}) and str(overrides[key]) != str(value):  # one would silently win: say which to keep
            raise BenchError(f"--set {key}={overrides[key]} and --{key.replace('_', '-')} {value} disagree; "
                             "give one of them")
    config = build_config(gen, preset, {**(overrides or {}), **named})
    variants = gen.expand(config)
    for sub, cfg in variants:
        gen(cfg)  # validate every variant, its destination and its size before any work
        check_target(out / sub if sub else out, overwrite)
        check_resources(gen, cfg, out / sub if sub else out, workers)
    for sub, cfg in variants:
        _render_one(gen, cfg, out / sub if sub else out, workers=workers, overwrite=overwrite, shards=shards,
                    progress=progress)
    return out


def _render_one(gen: Any, cfg: Any, target: Path, *, workers: int, overwrite: bool, shards: Any,
                progress: bool) -> None:
    """One dataset of `generate` (a generator class and its config), with its progress bar and
    closing line when `progress`."""
    from contextlib import nullcontext

    from bench.core.console import progress_bar, stderr
    from generators.engine import generate as render

    def say(text: str) -> None:
        if progress:
            stderr.print(text, soft_wrap=True, markup=False, highlight=False)

    t0 = time.perf_counter()
    with progress_bar(f"generate {target}") if progress else nullcontext() as bar:
        card = render(gen, cfg, target, workers=workers, overwrite=overwrite, progress=bar and bar.advance,
                      on_start=bar and bar.set_total, shards=shards, say=say)
    n = sum(s["n"] for s in card["splits"].values())
    dt = time.perf_counter() - t0
    say(f"wrote {n} scenes to {target} in {dt:.1f} s ({n / dt:.0f} scenes/s)")


def import_dataset(importer: str, *, src: PathLike, out: PathLike, split_seed: int = 0,
                   max_scenes: int | None = None, val_fraction: float = 0.1, test_fraction: float = 0.1,
                   image_size: int = 448, overwrite: bool = False, options: Mapping[str, Any] | None = None,
                   say: Say = None) -> Path:
    """Import a local copy of real images (`ade20k`, `vg`, `clevr`, in its official layout) into
    a dataset at `out`, as `bench import` does; `options` are the importer's own (`top_n`,
    `coding`); `say(text)` hears the closing line. Nothing is downloaded."""
    from bench.core.paths import output_path
    from generators.importers import import_dataset as run_import

    out = output_path(out, "out")
    run_import(importer, Path(src), out, split_seed=split_seed, max_scenes=max_scenes,
               val_fraction=val_fraction, test_fraction=test_fraction, image_size=image_size, overwrite=overwrite,
               say=say, **dict(options or {}))
    return out


@dataclass(frozen=True)
class GeneratorSummary:
    """A registered generator as `bench generators` lists it: its version, what it draws, and its
    presets (name -> the settings each fixes), `default_preset` the one `generate` takes by default."""

    name: str
    version: str
    description: str
    default_preset: str
    presets: dict[str, dict[str, Any]]


def generators() -> list[GeneratorSummary]:
    """Every registered generator (built-ins, then plugins), in registration order."""
    from generators.base import get_generator, list_generators

    out = []
    for name in list_generators():
        g = get_generator(name)
        out.append(GeneratorSummary(name, g.version, g.description, g.default_preset, dict(g.presets)))
    return out


def preview(dataset: PathLike, out: PathLike, *, split: str = "test", n: int = 16) -> Path:
    """Write a contact sheet of `n` scenes of `dataset`'s `split` (each beside its instance mask,
    captioned with its objects) as the PNG file `out`, and return its path, as `bench preview`."""
    from bench.core.dataset import Dataset
    from bench.core.paths import check_output_file, output_path
    from generators.preview import contact_sheet

    if n < 1:
        raise BenchError(f"n: must be ≥ 1, got {n}")
    png = check_output_file(output_path(out, "out"), "out", (".png",))
    contact_sheet(Dataset(Path(dataset)), split, n).save(png)
    return png
