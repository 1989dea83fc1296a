"""The public Python API: generate a dataset, evaluate models, load a results folder, build a
leaderboard table, write the report or the leaderboard site.

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
from bench.core.tasks import DEFAULT_TASK

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

__all__ = ["BenchError", "evaluate", "generate", "import_dataset", "leaderboard", "load_results", "load_study",
           "plan_study", "report", "run_study", "shipped_studies", "site", "study_next_commands", "study_report",
           "study_site"]


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
                   say: Any = None) -> Path:
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


def evaluate(
    models: Models,
    dataset: PathLike,
    *,
    task: str = DEFAULT_TASK,
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
    from evaluators.runner.plan import EvaluationPlan
    from evaluators.runner.run import run_evaluation

    plan = EvaluationPlan(models, Path(dataset), task=task, layers=layers, tokens=tokens, probes=probes,
                          seeds=seeds, device=device, dtype=dtype, epochs=epochs, limit=limit,
                          results_dir=results, overwrite=overwrite, unanchored=unanchored, control=control,
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
                layer: str | int = "best", reference: bool = False) -> pd.DataFrame:
    """The leaderboard of result rows (`load_results` or `evaluate`) as tidy records, one per
    (backbone, probe x tokens column): rank, value, interval, the layer used, status and ‡ checks,
    the numbers `bench leaderboard --format csv` writes; `reference` adds the papers' published
    rows for the metric (their `source` and `estimator` filled, never ranked)."""
    from leaderboards.board import build_leaderboard
    from leaderboards.render import tidy_records

    if frame.empty:
        raise BenchError("results: no rows to rank (evaluate a model first)")
    rows: list[dict[str, Any]] = [{k: (None if _missing(v) else v) for k, v in r.items()}
                                  for r in frame.to_dict(orient="records")]
    board = build_leaderboard(rows, dataset=dataset, task=task, metric=metric, probes=probes, tokens=tokens,
                              layer=layer, reference=reference)
    import pandas as pd

    return pd.DataFrame(tidy_records(board))


def _missing(value: Any) -> bool:
    """A pandas gap (NaN, None, NaT) in a scalar cell; lists and arrays are values."""
    import pandas as pd

    return not isinstance(value, (list, tuple)) and not hasattr(value, "shape") and bool(pd.isna(value))


def report(results: PathLike | None, out: PathLike = "report.html", *, analyses: Sequence[PathLike] = (),
           metric: str = "accuracy", fingerprint: str | None = None, include_limited: bool = False,
           say: Any = None) -> list[Path]:
    """Write the single-page report of a results folder (and/or toy analyses) as `bench report`
    does; returns [page, *figures]. `metric`: the IsSameObject metric drawn; `say(line)` hears
    what was set aside and which sections are empty."""
    from leaderboards.report import build_report

    return build_report(results, analyses, out, metric=metric, fingerprint=fingerprint,
                        include_limited=include_limited, say=say)


def site(results: PathLike | Sequence[PathLike], out: PathLike, *, datasets: Sequence[PathLike] = (),
         analyses: Sequence[PathLike] = (), include_limited: bool = False, figures: bool = True,
         say: Any = None) -> list[Path]:
    """Build the static leaderboard site of one or more results folders into `out` (as `bench site`
    does: a new or empty folder, or one a site was built in; anything else is refused) and return
    the files written, `index.html` first. `datasets`: folders holding the
    datasets the results were measured on (each a dataset, or a folder of them), so each dataset's
    page shows its generator's settings and a preview sheet; `analyses`: `bench toys-analysis`
    outputs; `say(line)` hears what was set aside and what was written."""
    from leaderboards.site import build_site

    dirs = [results] if isinstance(results, (str, os.PathLike)) else list(results)
    return build_site(dirs, out, datasets=_dataset_folders(datasets, say), analyses=analyses,
                      include_limited=include_limited, figures=figures, say=say)


#: Scenes on a dataset page's preview sheet, and its columns (3 keep it under 1,280 px wide).
PREVIEW_SCENES, PREVIEW_COLUMNS = 6, 3


def _dataset_folders(paths: Sequence[PathLike], say: Any = None) -> list[Any]:
    """Every dataset under the given folders (a folder that is a dataset, else its sub-folders that
    are), with its card, each split's fingerprint and its preview sheet writer. Each is checked as
    `bench info` checks it: a damaged one is said in one line (`say`) and kept with its damage, so
    its page says so rather than show it as sound; one whose card cannot be read is left out (its
    fingerprints, which match it to the results, are in that card)."""
    from bench.core.dataset import CARD_NAME, Dataset
    from generators.preview import contact_sheet
    from leaderboards.site import DatasetFolder

    found = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise BenchError(f"datasets: {p} is not a directory")
        candidates = [p] if (p / CARD_NAME).exists() else sorted(d for d in p.iterdir() if (d / CARD_NAME).exists())
        if not candidates:
            raise BenchError(f"datasets: {p} holds no dataset ({CARD_NAME} in it or in a sub-folder)")
        for d in candidates:
            try:
                ds = Dataset(d)
            except BenchError as e:
                if say is not None:
                    say(f"bench: warning: {e}; left out of the site")
                continue
            try:
                ds.verify()
            except BenchError as e:
                if say is not None:
                    say(f"bench: warning: {e}; its page says it is damaged")
                found.append(DatasetFolder(d, ds.name, {ds.fingerprint(s) for s in ds.splits}, ds.card,
                                           damage=str(e)))
                continue

            def preview(dst: Path, ds: Any = ds) -> None:
                split = "test" if "test" in ds.splits else ds.splits[0]
                contact_sheet(ds, split, PREVIEW_SCENES, cols=PREVIEW_COLUMNS).save(dst, format="PNG")

            found.append(DatasetFolder(d, ds.name, {ds.fingerprint(s) for s in ds.splits}, ds.card, preview))
    return found
def shipped_studies() -> dict[str, str]:
    """The studies shipped with the package (`bench run NAME`): name -> one line about it."""
    from bench.studies.spec import shipped_studies as shipped

    return shipped()


def load_study(study: PathLike, variables: Mapping[str, str] | None = None, *, allow_unset: bool = False) -> Any:
    """A study file (a path, or a shipped study's name) read and checked whole: a
    `bench.studies.spec.Study`. `variables` fill its `${VAR}` references before the environment
    does (`bench run --set VAR=VALUE`); `allow_unset` (a dry run) leaves unset ones as written.
    A bad file raises BenchError naming the file and the key path."""
    from bench.studies.spec import load_study as load

    return load(study, variables, allow_unset=allow_unset)


def plan_study(study: Any, out: PathLike | None = None) -> Any:
    """What running `study` into `out` (None: its default folder in the working directory) will
    do, worked out without loading a model: a `bench.studies.planning.StudyPlan` (`.lines()`
    prints it: datasets, row sets and the rows already held, disk, estimated time)."""
    from bench.studies.planning import plan_study as plan

    return plan(study, out)


def run_study(study: Any, out: PathLike | None = None, *, executor: str = "local", address: str | None = None,
              progress: bool = False, command: str | None = None, on_plan: Any = None) -> Any:
    """Run `study` into `out`: make the datasets it lacks and fit the rows it lacks (the rows
    `evaluate` would write), locally or as Ray tasks; a run stopped at any point resumes when
    started again. The whole study is checked first (its datasets, devices, backbones' files),
    and a refusal creates nothing; one run of a folder at a time. `on_plan(plan)` hears the plan
    once it is checked. Returns a `bench.studies.runner.StudyRun` (its folder, results, files written)."""
    from bench.studies.runner import run_study as run

    return run(study, out, executor=executor, address=address, progress=progress, command=command, on_plan=on_plan)


def study_site(done: Any, say: Any = None) -> list[Path]:
    """Build a finished study run's static site (`bench site`: its boards, a page per backbone and
    per dataset, with each dataset's preview) into the run's folder, `site/`; returns the files
    written, `index.html` first. `done`: what `run_study` returned."""
    datasets = [step.target for step in done.plan.datasets if (step.target / "dataset.json").exists()]
    return site(done.results, done.out / "site", datasets=datasets, say=say)


def study_report(study: Any, results: PathLike, fmt: str = "table") -> tuple[str, str | None]:
    """A study's leaderboards over `results`, rendered as `fmt` (table, markdown, csv, json), and
    the note on rows set aside (None if none)."""
    from bench.core.console import Format
    from bench.studies.runner import study_report as report

    return report(study, Path(results), Format(fmt))


def study_next_commands(study: Any, out: PathLike) -> list[str]:
    """The commands a study suggests once it has run (its `next`), with its folder filled in."""
    from bench.studies.runner import next_commands

    return next_commands(study, Path(out))


#: What the CLI (`bench.commands`) reads of the layers below, by name: `bench.commands` imports
#: only this module and `bench.core` (tests/test_layers.py), and each name is imported from its
#: home only when a command first reads it, so `bench --help` loads neither torch nor pandas.
#: name -> (module, attribute; None for the module itself).
_FOR_THE_CLI: dict[str, tuple[str, str | None]] = {
    "DATA_PRESET": ("evaluators.zoo.recipes", "DATA_PRESET"),
    "EvaluationPlan": ("evaluators.runner.plan", "EvaluationPlan"),
    "METRIC_KEYS": ("leaderboards.report", "METRIC_KEYS"),
    "SCENES": ("evaluators.zoo.recipes", "SCENES"),
    "SOURCES": ("evaluators.backbones", "SOURCES"),
    "TABLE_COLUMNS": ("evaluators.tasks.issameobject.toy_analysis", "TABLE_COLUMNS"),
    "ZOO_ENV": ("evaluators.zoo", "ZOO_ENV"),
    "ade20k": ("generators.importers.ade20k", None),
    "build_config": ("generators.base", "build_config"),
    "build_leaderboard": ("leaderboards.board", "build_leaderboard"),
    "build_report": ("leaderboards.report", "build_report"),
    "cache_root": ("evaluators.cache.entries", "cache_root"),
    "check_probes": ("evaluators.tasks.issameobject", "check_probes"),
    "clevr_v1": ("generators.importers.clevr_v1", None),
    "compare_backbones": ("leaderboards.compare", "compare_backbones"),
    "config_to_dict": ("generators.base", "config_to_dict"),
    "contact_sheet": ("generators.preview", "contact_sheet"),
    "extract_activations": ("evaluators.cache.extract", "extract_activations"),
    "get_generator": ("generators.base", "get_generator"),
    "get_recipe": ("evaluators.zoo", "get_recipe"),
    "inventory": ("evaluators.zoo", "inventory"),
    "list_entries": ("evaluators.cache.inventory", "list_entries"),
    "list_generators": ("generators.base", "list_generators"),
    "listed_by_source": ("evaluators.backbones", "listed_by_source"),
    "load_selected": ("leaderboards.store", "load_selected"),
    "metrics_help": ("leaderboards.metrics", "metrics_help"),
    "model_path": ("evaluators.zoo", "model_path"),
    "none_published": ("leaderboards.published", "none_published"),
    "plots": ("leaderboards.plots", None),
    "probes_help": ("evaluators.probes.families", "probes_help"),
    "remove_entries": ("evaluators.cache.inventory", "remove_entries"),
    "render_dataset": ("generators.engine", "generate"),
    "render_compare": ("leaderboards.render", "render_compare"),
    "render_leaderboard": ("leaderboards.render", "render_leaderboard"),
    "render_leaderboards": ("leaderboards.render", "render_leaderboards"),
    "resolve_backbone": ("evaluators.backbones", "resolve_backbone"),
    "run_evaluation": ("evaluators.runner.run", "run_evaluation"),
    "run_toy_analysis": ("evaluators.tasks.issameobject.toy_analysis", "run_toy_analysis"),
    "select_entries": ("evaluators.cache.inventory", "select_entries"),
    "source_of": ("evaluators.backbones", "source_of"),
    "spec_source": ("evaluators.backbones", "spec_source"),
    "status": ("evaluators.zoo", "status"),
    "table_rows": ("evaluators.tasks.issameobject.toy_analysis", "table_rows"),
    "tokens_filter_help": ("evaluators.probes.families", "tokens_filter_help"),
    "tokens_help": ("evaluators.probes.families", "tokens_help"),
    "train_recipe": ("evaluators.zoo.training", "train_recipe"),
    "train_zoo": ("evaluators.zoo", "train"),
    "vg": ("generators.importers.vg", None),
    "write_analysis": ("evaluators.tasks.issameobject.toy_analysis", "write_analysis"),
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
