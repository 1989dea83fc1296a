"""Evaluation: measure models on a dataset, read a results folder back, rank it as a table, and the
identical-objects toy analysis."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from bench.api.arguments import Models, PathLike
from bench.core.errors import BenchError
from bench.core.tasks import DEFAULT_TASK

if TYPE_CHECKING:  # pandas and the plan (torch) load when a function is called, not with the CLI
    import pandas as pd

    from evaluators.runner.request import EvaluationRequest


@dataclass(frozen=True)
class EvaluationRun:
    """What one `evaluate_run` did: its request, the run file it wrote (None when every
    requested row was already in the results folder), that file's rows as written, and how many
    requested rows it skipped because the folder held them."""

    request: EvaluationRequest
    path: Path | None
    rows: list[dict[str, Any]]
    skipped: int


def evaluate_run(
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
    memory_budget: int | None = None,
    image_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    command: str | None = None,
    progress: bool = False,
) -> EvaluationRun:
    """Run the evaluation `evaluate` runs (the same arguments, the same rows) and return what this
    run wrote rather than the folder's current rows: `bench evaluate` prints those. `command`, the
    command line, goes into every row's provenance."""
    from evaluators.runner.request import EvaluationRequest
    from evaluators.runner.run import run_evaluation

    request = EvaluationRequest(models, Path(dataset), task=task, layers=layers, tokens=tokens, probes=probes,
                                seeds=seeds, device=device, dtype=dtype, epochs=epochs, limit=limit,
                                results_dir=results, overwrite=overwrite, unanchored=unanchored, control=control,
                                exclude_background=exclude_background, executor=executor, address=address,
                                gpus_per_task=gpus_per_task, threads=threads, image_size=image_size, mean=mean, std=std,
                                memory_budget=memory_budget, command=command)
    skipped: list[int] = []
    path = run_evaluation(request, progress=progress, on_skipped=skipped.append)
    rows: list[dict[str, Any]] = []
    if path is not None:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    return EvaluationRun(request, path, rows, sum(skipped))


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
    memory_budget: int | None = None,
    image_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    command: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Measure binding (β*, B*, ...) or IsSameObject accuracy of `models` on `dataset`, writing
    rows into `results` as `bench evaluate` does (the options are its options); returns the
    current rows of these models on this dataset, task and probes (rows already present are
    reused, not recomputed, unless `overwrite`). `attrs` holds `set_aside` (as `load_results`),
    `path` (the run file written, None when nothing was to do) and `skipped` (rows reused).

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
    and `py:` modules; other sources refuse them), as `bench evaluate --image-size --mean --std`.
    `memory_budget`: the host bytes a fit may hold of activation rows at once (`bench evaluate
    --memory-budget`; `bench.core.resources.parse_size` reads "1GiB"; None: half the available memory)."""
    done = evaluate_run(models, dataset, task=task, layers=layers, tokens=tokens, probes=probes, seeds=seeds,
                        device=device, dtype=dtype, epochs=epochs, limit=limit, results=results, overwrite=overwrite,
                        unanchored=unanchored, control=control, exclude_background=exclude_background,
                        executor=executor, address=address, gpus_per_task=gpus_per_task, threads=threads,
                        memory_budget=memory_budget, image_size=image_size, mean=mean, std=std, command=command,
                        progress=progress)
    request = done.request
    frame = load_results(results)
    mine = frame[frame["backbone"].isin([m.name for m in request.models]) & (frame["task"] == task)
                 & (frame["dataset"] == request.dataset.name) & frame["probe"].isin(request.families)]
    out = mine.reset_index(drop=True)
    out.attrs = dict(frame.attrs, path=done.path, skipped=done.skipped)
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


@dataclass(frozen=True)
class ToyAnalysis:
    """What `toys_analysis` wrote (the JSON analysis and its figure) and its table: `rows` in `columns`."""

    json_path: Path
    png: Path
    rows: list[dict[str, Any]]
    columns: list[str]


def toys_analysis(model: str, dataset: PathLike, *, train_dataset: PathLike | None = None,
                  probe: str = "quadratic", layers: str | Sequence[int] = "all", split: str = "test",
                  out: PathLike = "toy-analysis", device: str = "auto", dtype: str = "fp32",
                  epochs: int | None = None, limit: int | None = None, heatmap_scenes: int = 3) -> ToyAnalysis:
    """Score patch pairs of identical-object toy scenes (`bench generate toys`) by pair category,
    per layer of `model` (`layers` as `bench evaluate` reads them), with a pairwise `probe` trained
    on `train_dataset` (default: the toys' own train/val splits); writes `toy_analysis.json` and its
    PNG into `out`, as `bench toys-analysis`. Every check that can fail runs before the extraction."""
    from bench.core.paths import output_path
    from bench.core.results import check_writable
    from evaluators.tasks.issameobject.evaluate import check_probes
    from evaluators.tasks.issameobject.toy_analysis import (TABLE_COLUMNS, check_toys, run_toy_analysis, table_rows,
                                                            write_analysis)

    folder = output_path(out, "out")
    check_probes([probe])
    if heatmap_scenes < 0:
        raise BenchError(f"heatmap-scenes: must be ≥ 0, got {heatmap_scenes}")
    check_toys(Path(dataset))
    check_writable(folder, "out")
    analysis = run_toy_analysis(
        model, Path(dataset), train_dataset=None if train_dataset is None else Path(train_dataset), probe=probe,
        layers=layers, split=split, device=device, dtype=dtype, epochs=epochs, limit=limit,
        heatmap_scenes=heatmap_scenes,
    )
    json_path, png = write_analysis(analysis, folder)
    return ToyAnalysis(json_path, png, table_rows(analysis), list(TABLE_COLUMNS))

