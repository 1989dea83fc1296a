"""The results store: every run file of a results directory as one validated set of rows.

Leaderboards and plots compare numbers across runs, so the store refuses what would
make a comparison silently wrong: files from another schema version, and rows that
carry one dataset name but were measured on different data (different fingerprints).
Failed runs stay in as error rows, so a table can say "error" instead of hiding a gap.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from bench.errors import BenchError
from bench.results import KEY_COLUMNS, RESULT_SCHEMA, read_results

#: Per-scene bit arrays: large and not needed to tabulate or plot metrics.
_BULK_COLUMNS = tuple(c for c in RESULT_SCHEMA.names if c.startswith("scene_bits_"))
STATUSES = ("ok", "error")


def load_results(results_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Validated rows (dicts, bulk per-scene columns dropped) of every run in a directory."""
    d = Path(results_dir)
    try:
        table = read_results(d)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise BenchError(_schema_mismatch(d)) from None
    if table.schema.remove_metadata() != RESULT_SCHEMA.remove_metadata():
        raise BenchError(_schema_mismatch(d))
    rows = table.drop_columns(list(_BULK_COLUMNS)).to_pylist()
    check_rows(rows)
    return rows


def check_rows(rows: Iterable[dict[str, Any]]) -> None:
    """Refuse unknown statuses and one dataset name measured on different data."""
    prints: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for r in rows:
        if r["status"] not in STATUSES:
            raise BenchError(f"results: run {r['run_id']} has status {r['status']!r}; allowed: {', '.join(STATUSES)}")
        prints[(r["dataset"], r["split"])].setdefault(r["dataset_fingerprint"], r["run_id"])
    for (dataset, split), runs in sorted(prints.items()):
        if len(runs) > 1:
            shown = ", ".join(f"{fp[:12]} (run {run})" for fp, run in sorted(runs.items()))
            raise BenchError(
                f"results: dataset {dataset!r} ({split}) was measured on {len(runs)} different datasets "
                f"(fingerprints {shown}); keep each dataset's results in its own directory or rename one"
            )


def latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per key: the newest successful one, else the newest failure (re-runs supersede)."""
    best: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = tuple(r[c] for c in KEY_COLUMNS)
        old = best.get(key)
        if old is None or _preference(r) > _preference(old):
            best[key] = r
    return list(best.values())


def _preference(row: dict[str, Any]) -> tuple:
    return (row["status"] == "ok", row["created_at"] or "", row["run_id"] or "")


def _schema_mismatch(d: Path) -> str:
    expected = RESULT_SCHEMA.remove_metadata()
    bad = [f.name for f in sorted(d.glob("*.parquet")) if pq.read_schema(f).remove_metadata() != expected]
    return f"results: {', '.join(bad) or 'a file'} in {d} do not have the results schema of this BindingBench"
