"""Models and what is kept of them: the backbones every source lists, activations extracted into
the cache (and the cache listed and cleared), and the in-house zoo (listed, trained, found)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from bench.api.arguments import PathLike
from bench.core.errors import BenchError

if TYPE_CHECKING:
    from evaluators.cache.extract import Activations


@dataclass(frozen=True)
class BackboneListing:
    """`bench models`: one row per backbone (its `BackboneInfo` fields and `source`, where its
    weights come from) and each source's spec forms (source name -> the specs it reads)."""

    rows: list[dict[str, Any]]
    forms: dict[str, str]


def models(spec: str | None = None, *, image_size: int | None = None, mean: Sequence[float] | None = None,
           std: Sequence[float] | None = None) -> BackboneListing:
    """Every registered source's backbones (presets, random-init controls, pixels, oracles, zoo,
    plugins'; nothing downloaded), or the one `spec` resolved (hub ids must be cached), its input
    side and normalisation replaced by `image_size`, `mean`, `std` where given."""
    from evaluators.backbones import SOURCES, listed_by_source, resolve_backbone, source_of, spec_source

    if spec is not None and not spec.strip():
        raise BenchError("model: empty spec; name a backbone, or give none to list them all")
    overrides = {"image_size": image_size, "mean": mean, "std": std}
    if not spec and any(v is not None for v in overrides.values()):
        raise BenchError("model: --image-size, --mean and --std need a spec")
    listed = [(source_of(spec), [resolve_backbone(spec, **overrides).info])] if spec else listed_by_source()
    rows = [{**info.to_dict(), "source": spec_source(info.spec)} for _, infos in listed for info in infos]
    return BackboneListing(rows, {name: source.forms for name, source in SOURCES.items()})


def extract(model: str, dataset: PathLike, *, splits: Sequence[str] = ("train", "val", "test"),
            layers: str = "all", token_choices: Sequence[str] = ("cls",), device: str = "auto", dtype: str = "fp32",
            batch_size: int = 32, resolution: str = "native", image_size: int | None = None,
            cache_dir: PathLike | None = None, limit: int | None = None,
            also: Sequence[tuple[str, Sequence[str]]] = ()) -> Iterator[tuple[str, Activations]]:
    """Extract `model`'s activations of each of `splits` into the cache (or find them there), as
    `bench extract`; yields (split, its cached `Activations`) as each is done, and after each split's
    `layers` x `token_choices` the entries of `also`'s (layers, tokens choices), which come from the
    same forward pass (each its own cache entry). Every split asked for and the cache folder are
    checked now, before the model loads."""
    from bench.core.dataset import Dataset
    from bench.core.paths import check_output_dir, output_path
    from evaluators.cache.entries import cache_root

    folder = None if cache_dir is None else output_path(cache_dir, "cache-dir")
    ds = Dataset(Path(dataset))
    for s in splits:  # the cheap check at open, of every split asked for, before any is extracted
        ds.files(s)
    check_output_dir(cache_root(folder), "cache-dir")  # before the model loads and the first batch runs

    def extracted() -> Iterator[tuple[str, Activations]]:
        from evaluators.cache.extract import extract_selections

        selections = [(layers, list(token_choices)), *((lay, list(tok)) for lay, tok in also)]
        for s in splits:
            for acts in extract_selections(model, ds, s, selections, device=device, dtype=dtype, batch_size=batch_size,
                                           resolution=resolution, image_size=image_size, cache_dir=folder, limit=limit):
                yield s, acts

    return extracted()


def cache_entries(cache_dir: PathLike | None = None) -> list[dict[str, Any]]:
    """The activation cache's entries as `bench cache ls` lists them (partial ones are resumable),
    one dict each: key, status, backbone, revision, dataset, fingerprint, split, side, layers,
    views, rows, size_mb, path."""
    from evaluators.cache.inventory import list_entries

    return [e.row() for e in list_entries(None if cache_dir is None else Path(cache_dir))]


def remove_cache_entries(keys: Sequence[str] = (), *, every: bool = False, partial: bool = False,
                         cache_dir: PathLike | None = None) -> tuple[int, int]:
    """Remove the cache entries named by `keys` (keys or key prefixes), or `every` entry, or the
    `partial` (unfinished) ones, as `bench cache rm`; returns (entries removed, bytes freed)."""
    from bench.core.paths import output_path
    from evaluators.cache.inventory import list_entries, remove_entries, select_entries

    # "" would be the working directory, not a cache: refused rather than searched
    entries = list_entries(None if cache_dir is None else output_path(cache_dir, "cache-dir"))
    if every:
        chosen = entries
    elif partial:
        chosen = [e for e in entries if not e.complete]
    elif keys:
        chosen = select_entries(entries, keys)
    else:
        raise BenchError("cache rm: name entry keys, or pass --all or --partial")
    return len(chosen), remove_entries(chosen)


def zoo_inventory() -> list[dict[str, Any]]:
    """The zoo's recipes (trained, interrupted or not trained) and the other models in its folder
    (variants, stale ones), as `bench zoo list` lists them, with final losses and training time."""
    from evaluators.zoo import inventory

    return inventory()


def train_zoo(names: Sequence[str], *, seed: int | None = None, steps: int | None = None, progress: bool = True,
              on_trained: Callable[[str, Path], None] | None = None) -> list[Path]:
    """Train the zoo recipes `names` (resuming an interrupted run, reusing a finished one) into the
    zoo's folder and return each model's folder (with `seed` or `steps`, a variant's own). Every
    name is checked before the first is trained; `progress` shows a bar per recipe, and
    `on_trained(name, folder)` hears each as it finishes."""
    from contextlib import nullcontext

    from bench.core.console import progress_bar
    from evaluators.zoo import get_recipe, train

    for name in names:  # every name checked before the first minute of training is spent
        get_recipe(name)
    out = []
    for name in names:
        with progress_bar(f"train zoo:{name}") if progress else nullcontext() as bar:
            path = train(name, seed=seed, steps=steps, progress=bar and bar.advance, on_start=bar and bar.set_total)
        if on_trained is not None:
            on_trained(name, path)
        out.append(path)
    return out


def zoo_path(name: str) -> Path:
    """The folder of the trained zoo model `name`, the recipe as written (usable as a model spec)."""
    from evaluators.zoo import model_path

    return model_path(name)
