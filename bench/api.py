"""The public Python API: evaluate models, load a results folder, build a leaderboard table.

    from bench import api

    df = api.evaluate(["pixels", "oracle:objects"], dataset="data/cs", probes=["linear"])
    board = api.leaderboard(df, metric="beta_star")

Every function takes keyword arguments with the CLI's defaults and returns pandas
DataFrames, so a notebook computes the rows `bench evaluate` computes and reads them the
way `bench leaderboard` does (each backbone's newest weights and probe settings; what was
set aside is in `df.attrs["set_aside"]`). Bad input raises `BenchError` with one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence, Union

import pandas as pd

from bench.errors import BenchError

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["BenchError", "evaluate", "leaderboard", "load_results"]


def evaluate(
    models: str | Sequence[str],
    *,
    dataset: PathLike,
    task: str = "binding",
    layers: str | Sequence[int] | None = None,
    tokens: Sequence[str] | None = None,
    probes: Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    device: str = "auto",
    dtype: str = "fp32",
    epochs: int | None = None,
    limit: int | None = None,
    results: PathLike = "results",
    overwrite: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Measure binding (β*, B*, ...) or IsSameObject accuracy of `models` (spec strings, as
    `bench models` lists them) on a dataset, writing rows into `results` as `bench evaluate`
    does; returns the current rows of these models on this dataset and task (rows already
    present are reused, not recomputed, unless `overwrite`)."""
    from evaluators.run import run_evaluation

    specs = [models] if isinstance(models, str) else list(models)
    run_evaluation(specs, Path(dataset), task=task, layers=layers, tokens=tokens, probes=probes, seeds=seeds,
                   device=device, dtype=dtype, epochs=epochs, results_dir=Path(results), overwrite=overwrite,
                   limit=limit, progress=progress)
    frame = load_results(results)
    name = Path(dataset).name
    mine = frame[frame["backbone"].isin(specs) & (frame["task"] == task) & (frame["dataset"] == name)]
    if probes is not None:
        mine = mine[mine["probe"].isin(list(probes))]
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
    return pd.DataFrame(tidy_records(board))


def _missing(value: Any) -> bool:
    """A pandas gap (NaN, None, NaT) in a scalar cell; lists and arrays are values."""
    return not isinstance(value, (list, tuple)) and not hasattr(value, "shape") and bool(pd.isna(value))
