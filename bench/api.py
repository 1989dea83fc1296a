"""The public Python API: generate a dataset, evaluate models, load a results folder, build a
leaderboard table.

    from bench import api

    data = api.generate("colorshape", preset="small", out="data/cs")
    df = api.evaluate(["pixels", "oracle:objects"], data, probes=["linear"])
    board = api.leaderboard(df, metric="beta_star")

Every function takes keyword arguments with the CLI's defaults and returns a path or pandas
DataFrames, so a notebook computes the rows `bench evaluate` computes and reads them the
way `bench leaderboard` does (each backbone's newest weights and probe settings; what was
set aside is in `df.attrs["set_aside"]`). `bench generate` and `bench evaluate` are these
functions with a command line around them. Bad input raises `BenchError` with one line.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

from bench.core.errors import BenchError

if TYPE_CHECKING:  # importing a backbone imports torch: only `evaluate` needs it, when called
    import pandas as pd

    from evaluators.backbones.base import Backbone
    from evaluators.backbones.module_adapter import ModuleAdapter

PathLike = Union[str, "os.PathLike[str]"]
#: What `evaluate` takes as models: a spec string (as `bench models` lists them), `NAME=SPEC`,
#: a backbone object, a `ModuleAdapter` (a plain module), a sequence of those, or a mapping
#: display name -> spec or object.
OneModel = Union[str, "Backbone", "ModuleAdapter"]
Models = Union[OneModel, Sequence[OneModel], Mapping[str, OneModel]]

__all__ = ["BenchError", "evaluate", "generate", "leaderboard", "load_results"]


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
    from generators.base import build_config, get_generator
    from generators.engine import check_resources

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
    out = Path(out)
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


def evaluate(
    models: Models,
    dataset: PathLike,
    *,
    task: str = "binding",
    layers: str | Sequence[int] | None = None,
    tokens: str | Sequence[str] | None = None,
    probes: str | Sequence[str] | None = None,
    seeds: int | Sequence[int] = (0,),
    device: str = "auto",
    dtype: str = "fp32",
    epochs: int | None = None,
    limit: int | None = None,
    results: PathLike = "results",
    overwrite: bool = False,
    unanchored: bool = False,
    control: str | None = None,
    exclude_background: bool = False,
    executor: str = "local",
    address: str | None = None,
    gpus_per_task: float | None = None,
    threads: int | None = None,
    image_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Measure binding (β*, B*, ...) or IsSameObject accuracy of `models` on `dataset`, writing
    rows into `results` as `bench evaluate` does (the options are its options); returns the
    current rows of these models on this dataset, task and probes (rows already present are
    reused, not recomputed, unless `overwrite`).

    `models`: a spec string (as `bench models` lists them), `"NAME=SPEC"`, a backbone object
    (an `evaluators.backbones.base.Backbone`, e.g. your own), a list of those, or a mapping
    `{NAME: spec or object}`. Rows carry NAME in their `backbone` column: a mapping's key, an
    object's `display_name` attribute, else its `info.spec`. An object's weights fingerprint
    (part of each row's key) is its `info.revision`; leave that empty ("") and it is a
    `sha256:` of the object's state dict (its own, if it is a `torch.nn.Module`, else its
    `model` attribute's), so re-evaluating edited weights measures them again. A plain
    `torch.nn.Module` goes in wrapped in an `evaluators.backbones.ModuleAdapter` (where its
    blocks and tokens are). Objects run in this process only (`executor` "local").

    `image_size`, `mean` and `std` (R, G, B) replace the input side and normalisation of every
    spec (Hugging Face models, e.g. a `save_pretrained` folder without preprocessor_config.json,
    and `py:` modules; other sources refuse them), as `bench evaluate --image-size --mean --std`."""
    from evaluators.plan import EvaluationPlan
    from evaluators.run import run_evaluation

    plan = EvaluationPlan(models, Path(dataset), task=task, layers=layers, tokens=tokens, probes=probes,
                          seeds=seeds, device=device, dtype=dtype, epochs=epochs, limit=limit,
                          results_dir=Path(results), overwrite=overwrite, unanchored=unanchored, control=control,
                          exclude_background=exclude_background, executor=executor, address=address,
                          gpus_per_task=gpus_per_task, threads=threads, image_size=image_size, mean=mean, std=std)
    run_evaluation(plan, progress=progress)
    frame = load_results(results)
    mine = frame[frame["backbone"].isin([m.name for m in plan.models]) & (frame["task"] == task)
                 & (frame["dataset"] == plan.dataset.name) & frame["probe"].isin(plan.families)]
    out = mine.reset_index(drop=True)
    out.attrs = dict(frame.attrs)
    return out


def load_results(results: PathLike, *, show_old: bool = False, per_scene: bool = False) -> pd.DataFrame:
    """The rows a leaderboard of `results` would use, one per key, with each ‡ check a row
    breaks as a boolean column `‡ CHECK` beside the `checks` list. `show_old` keeps rows of
    older weights or probe settings (as `NAME (weights|probe FP)`); `per_scene` keeps the
    per-scene arrays, which are large. The note on what was set aside is in
    `attrs["set_aside"]` (None when nothing was)."""
    from leaderboards.store import PER_SCENE_COLUMNS, load_selected

    selected = load_selected(results, show_old=show_old)
    import pandas as pd

    frame = pd.DataFrame(selected.rows)
    if not per_scene:
        frame = frame.drop(columns=[c for c in PER_SCENE_COLUMNS if c in frame.columns])
    if "checks" in frame.columns:
        names = sorted({c for cs in frame["checks"] if cs is not None for c in cs})
        for check in names:
            frame[f"‡ {check}"] = [cs is not None and check in cs for cs in frame["checks"]]
    frame.attrs["set_aside"] = selected.note
    return frame


def leaderboard(frame: pd.DataFrame, *, dataset: str | None = None, task: str | None = None,
                metric: str | None = None, probes: Sequence[str] = (), tokens: Sequence[str] = (),
                layer: str | int = "best") -> pd.DataFrame:
    """The leaderboard of result rows (`load_results` or `evaluate`) as tidy records, one per
    (backbone, probe x tokens column): rank, value, interval, the layer used, status and ‡ checks,
    the numbers `bench leaderboard --format csv` writes."""
    from leaderboards.tables import build_leaderboard, tidy_records

    if frame.empty:
        raise BenchError("results: no rows to rank (evaluate a model first)")
    rows: list[dict[str, Any]] = [{k: (None if _missing(v) else v) for k, v in r.items()}
                                  for r in frame.to_dict(orient="records")]
    board = build_leaderboard(rows, dataset=dataset, task=task, metric=metric, probes=probes, tokens=tokens,
                              layer=layer)
    import pandas as pd

    return pd.DataFrame(tidy_records(board))


def _missing(value: Any) -> bool:
    """A pandas gap (NaN, None, NaT) in a scalar cell; lists and arrays are values."""
    import pandas as pd

    return not isinstance(value, (list, tuple)) and not hasattr(value, "shape") and bool(pd.isna(value))


#: What the CLI (`bench.commands`) reads of the layers below, by name: `bench.commands` imports
#: only this module and `bench.core` (tests/test_layers.py), and each name is imported from its
#: home only when a command first reads it, so `bench --help` loads neither torch nor pandas.
#: name -> (module, attribute; None for the module itself).
_FOR_THE_CLI: dict[str, tuple[str, str | None]] = {
    "COMPARE_COLUMNS": ("leaderboards.tables", "COMPARE_COLUMNS"),
    "DATA_PRESET": ("evaluators.zoo.recipes", "DATA_PRESET"),
    "EvaluationPlan": ("evaluators.plan", "EvaluationPlan"),
    "METRIC_KEYS": ("leaderboards.report", "METRIC_KEYS"),
    "SCENES": ("evaluators.zoo.recipes", "SCENES"),
    "SOURCES": ("evaluators.backbones", "SOURCES"),
    "TABLE_COLUMNS": ("evaluators.toy_analysis", "TABLE_COLUMNS"),
    "ZOO_ENV": ("evaluators.zoo", "ZOO_ENV"),
    "ade20k": ("generators.importers.ade20k", None),
    "build_config": ("generators.base", "build_config"),
    "build_leaderboard": ("leaderboards.tables", "build_leaderboard"),
    "build_report": ("leaderboards.report", "build_report"),
    "cache_root": ("evaluators.cache", "cache_root"),
    "check_probes": ("evaluators.issameobject", "check_probes"),
    "clevr_v1": ("generators.importers.clevr_v1", None),
    "compare_backbones": ("leaderboards.tables", "compare_backbones"),
    "config_to_dict": ("generators.base", "config_to_dict"),
    "contact_sheet": ("generators.preview", "contact_sheet"),
    "extract_activations": ("evaluators.extract", "extract_activations"),
    "get_generator": ("generators.base", "get_generator"),
    "get_recipe": ("evaluators.zoo", "get_recipe"),
    "inventory": ("evaluators.zoo", "inventory"),
    "list_entries": ("evaluators.cache_inventory", "list_entries"),
    "list_generators": ("generators.base", "list_generators"),
    "listed_by_source": ("evaluators.backbones", "listed_by_source"),
    "load_selected": ("leaderboards.store", "load_selected"),
    "metrics_help": ("leaderboards.tables", "metrics_help"),
    "model_path": ("evaluators.zoo", "model_path"),
    "plots": ("leaderboards.plots", None),
    "probes_help": ("evaluators.families", "probes_help"),
    "remove_entries": ("evaluators.cache_inventory", "remove_entries"),
    "render_dataset": ("generators.engine", "generate"),
    "render_leaderboard": ("leaderboards.tables", "render_leaderboard"),
    "render_leaderboards": ("leaderboards.tables", "render_leaderboards"),
    "resolve_backbone": ("evaluators.backbones", "resolve_backbone"),
    "run_evaluation": ("evaluators.run", "run_evaluation"),
    "run_toy_analysis": ("evaluators.toy_analysis", "run_toy_analysis"),
    "select_entries": ("evaluators.cache_inventory", "select_entries"),
    "source_of": ("evaluators.backbones", "source_of"),
    "spec_source": ("evaluators.backbones", "spec_source"),
    "status": ("evaluators.zoo", "status"),
    "table_rows": ("evaluators.toy_analysis", "table_rows"),
    "tokens_filter_help": ("evaluators.families", "tokens_filter_help"),
    "tokens_help": ("evaluators.families", "tokens_help"),
    "train_recipe": ("evaluators.zoo.training", "train_recipe"),
    "train_zoo": ("evaluators.zoo", "train"),
    "vg": ("generators.importers.vg", None),
    "write_analysis": ("evaluators.toy_analysis", "write_analysis"),
    "write_import": ("generators.importers.common", "write_import"),
    "zoo_root": ("evaluators.zoo", "zoo_root"),
}


def __getattr__(name: str) -> Any:
    """A name of `_FOR_THE_CLI`, imported from its home now (never kept here: a test that puts
    another module in its place, in `sys.modules`, is read)."""
    if name not in _FOR_THE_CLI:
        raise AttributeError(f"module 'bench.api' has no attribute {name!r}")
    module, attribute = _FOR_THE_CLI[name]
    home = importlib.import_module(module)
    return home if attribute is None else getattr(home, attribute)
