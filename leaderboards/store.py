"""The results store: every run file of a results directory as one validated set of rows.

Leaderboards and plots compare numbers across runs, so the store refuses files from
another schema version, and `select_rows` never lets rows measured on different data
meet in one comparison: a results folder may hold any mix of runs (a dataset regenerated
in place, `--limit` trials beside full runs), and each (task, dataset name) shows one
measurement, the newest on whole splits, while the rest is set aside and named.
Failed runs stay in as error rows, so a table can say "error" instead of hiding a gap.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.core.errors import BenchError
from bench.core.results import RESULT_SCHEMA, read_results, row_key
from bench.core.tasks import TASKS

#: Per-scene columns (test bits, F-code groups, prior references): kept as numpy arrays, which
#: paired comparisons read, never as Python lists (a row holds thousands of them).
PER_SCENE_COLUMNS = tuple(c for c in RESULT_SCHEMA.names if c.startswith("scene_"))
STATUSES = ("ok", "error")


def load_results(results_dir: str | os.PathLike, older: list[str] | None = None) -> list[dict[str, Any]]:
    """Validated rows (dicts; per-scene columns as numpy arrays) of every run in a directory;
    files of an older schema version are left out and named in `older` (`read_results`)."""
    d = Path(results_dir)
    try:
        table = read_results(d, older)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise BenchError(_schema_mismatch(d)) from None
    if table.schema.remove_metadata() != RESULT_SCHEMA.remove_metadata():
        raise BenchError(_schema_mismatch(d))
    rows = table.drop_columns(list(PER_SCENE_COLUMNS)).to_pylist()
    for column in PER_SCENE_COLUMNS:
        for row, values in zip(rows, per_row_arrays(table.column(column))):
            row[column] = values
    check_rows(rows)
    return rows


def per_row_arrays(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """A list column as one numpy view per row (None for a null cell), without Python floats."""
    out: list[np.ndarray | None] = []
    for chunk in column.chunks:
        values = chunk.flatten().to_numpy(zero_copy_only=False)
        offsets = chunk.offsets.to_numpy() - chunk.offsets[0].as_py()
        valid = chunk.is_valid().to_numpy(zero_copy_only=False)
        out += [values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(chunk))]
    return out


def check_rows(rows: Iterable[dict[str, Any]]) -> None:
    """Refuse unknown statuses."""
    for r in rows:
        if r["status"] not in STATUSES:
            raise BenchError(f"results: run {r['run_id']} has status {r['status']!r}; allowed: {', '.join(STATUSES)}")


#: How a fingerprint is shown and matched: long enough to be unique in any results folder.
FINGERPRINT_CHARS = 12


@dataclass
class Selection:
    """The rows one comparison may use, and what was set aside (one phrase per measurement)."""

    rows: list[dict[str, Any]]
    set_aside: list[str] = field(default_factory=list)

    @property
    def note(self) -> str | None:
        """One line naming what was left out and how to see it (None when nothing was)."""
        if not self.set_aside:
            return None
        return "set aside: " + "; ".join(self.set_aside)


def registered(rows: Iterable[dict[str, Any]]) -> Selection:
    """The rows of tasks still registered (`bench.core.tasks.TASKS`); those of any other task (a
    plugin since uninstalled) are set aside and named, so a folder written with it still reads."""
    rows, known = list(rows), TASKS.names()
    gone: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["task"] not in known:
            gone[r["task"]] += 1
    phrases = [f"{n} rows of task {task}, which no installed task registers (registered: {', '.join(known)})"
               for task, n in sorted(gone.items())]
    return Selection([r for r in rows if r["task"] in known] if gone else rows, phrases)


def newest_identity(rows: Iterable[dict[str, Any]], *, show_old: bool = False) -> Selection:
    """Per backbone, the rows of its newest weights, and per (backbone, probe) those of its newest
    probe settings: an edited checkpoint or changed probe supersedes what was measured before.
    "Newest" goes by a fingerprint's newest row, per (task, dataset name). The older rows are set
    aside, or with `show_old` kept under `BACKBONE (weights|probe FP)` so they never mix."""
    rows = list(rows)
    out, phrases = [], []
    for what, scope, column in (("weights", ("task", "dataset", "backbone"), "weights_fingerprint"),
                                ("probe", ("task", "dataset", "backbone", "probe"), "probe_fingerprint")):
        newest: dict[tuple, dict[str, str]] = defaultdict(dict)
        for r in rows:
            fps = newest[tuple(r[c] for c in scope)]
            fps[r[column]] = max(fps.get(r[column], ""), r["created_at"] or "")
        winner = {g: max(fps, key=lambda fp: (fps[fp], fp or "")) for g, fps in newest.items()}
        old: dict[tuple, int] = defaultdict(int)
        kept = []
        for r in rows:
            g = tuple(r[c] for c in scope)
            if r[column] == winner[g]:
                kept.append(r)
                continue
            old[(r["task"], r["backbone"], r[column])] += 1
            if show_old:
                out.append({**r, "backbone": f"{r['backbone']} ({what} {(r[column] or 'none')[:FINGERPRINT_CHARS]})"})
        phrases += [f"{n} {task} rows of {backbone} with older {what} {(fp or 'none')[:FINGERPRINT_CHARS]} "
                    "(--show-old shows them)" for (task, backbone, fp), n in sorted(old.items(), key=str)]
        rows = kept
    return Selection(rows + out, [] if show_old else phrases)


def select_rows(rows: Iterable[dict[str, Any]], *, fingerprint: str | None = None,
                include_limited: bool = False) -> Selection:
    """Per (task, dataset name), the rows of one measurement: the newest on whole splits,
    else (when there is none) the newest `--limit` one. A measurement is a (fingerprint,
    limit) pair, and "newest" goes by its newest row.

    `fingerprint` (a prefix) picks the measurements with that fingerprint instead;
    `include_limited` adds every other `--limit` measurement as a dataset of its own,
    named `NAME (limit N)`, so limited rows are shown but never mixed with full ones."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["dataset"], r["dataset_fingerprint"], r["limit"])].append(r)
    if fingerprint is not None:
        wanted = fingerprint.lower()
        if not any(fp.startswith(wanted) for _, _, fp, _ in groups):
            shown = ", ".join(sorted({fp[:FINGERPRINT_CHARS] for _, _, fp, _ in groups})) or "none"
            raise BenchError(f"fingerprint: no results measured on {fingerprint!r}; present: {shown}")
    newest = {g: max(r["created_at"] or "" for r in rs) for g, rs in groups.items()}
    by_name: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for g in groups:
        by_name[g[:2]].append(g)
    chosen: dict[tuple, str] = {}  # group -> the dataset name its rows are shown under
    for (task, name), gs in by_name.items():
        if fingerprint is not None:
            candidates = [g for g in gs if g[2].startswith(fingerprint.lower())]
        else:
            candidates = [g for g in gs if g[3] is None] or gs
        if not candidates:
            continue
        best = max(candidates, key=lambda g: (newest[g], g[3] is None))
        chosen[best] = name
        if include_limited:
            for g in sorted(gs, key=lambda g: newest[g], reverse=True):
                if g[3] is not None and g[3] != best[3] and all(c[3] != g[3] for c in chosen if c[:2] == g[:2]):
                    chosen[g] = f"{name} (limit {g[3]})"
    out = [{**r, "dataset": chosen[g]} for g, rs in groups.items() if g in chosen for r in rs]
    return Selection(out, _set_aside_phrases(groups, chosen, newest))


def _set_aside_phrases(groups: dict[tuple, list], chosen: dict[tuple, str], newest: dict[tuple, str]) -> list[str]:
    """`N rows of TASK on NAME (why; the option that shows them)` per measurement not chosen."""
    phrases = []
    for g in sorted(set(groups) - set(chosen), key=lambda g: (g[0], g[1], newest[g])):
        task, name, fp, limit = g
        if limit is not None:
            why = f"--limit {limit}; --include-limited shows it"
        else:
            short = fp[:FINGERPRINT_CHARS]
            why = f"other data, fingerprint {short}; --fingerprint {short} shows it"
        phrases.append(f"{len(groups[g])} {task} rows on {name} ({why})")
    return phrases


def load_selected(results_dir: str | os.PathLike, *, fingerprint: str | None = None,
                  include_limited: bool = False, show_old: bool = False) -> Selection:
    """`select_rows` of a directory's newest row per key (`latest`) of each backbone's newest
    weights and probe settings (`newest_identity`); files of an older schema are named in the note."""
    older: list[str] = []
    known = registered(load_results(results_dir, older))
    current = newest_identity(latest(known.rows), show_old=show_old)
    selected = select_rows(current.rows, fingerprint=fingerprint, include_limited=include_limited)
    files = [f"{len(older)} results files of an older schema ({', '.join(older)}; re-run `bench evaluate` "
             "to measure them again)"] if older else []
    return Selection(selected.rows, files + known.set_aside + current.set_aside + selected.set_aside)


def latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per key: the newest successful one, else the newest failure (re-runs supersede)."""
    best: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = row_key(r)
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


def load_folders(results_dirs: Iterable[str | os.PathLike], *, include_limited: bool = False,
                 show_old: bool = False) -> Selection:
    """The rows of several results folders as one store: the newest row per key wins whichever
    folder holds it (`latest` over their union), then each backbone's newest weights and probe
    settings (`newest_identity`) and every measurement apart (`measurements`)."""
    older: list[str] = []
    rows: list[dict[str, Any]] = []
    for d in results_dirs:
        rows += load_results(d, older)
    known = registered(rows)
    current = newest_identity(latest(known.rows), show_old=show_old)
    measured = measurements(current.rows, include_limited=include_limited)
    files = [f"{len(older)} results files of an older schema ({', '.join(older)}; re-run `bench evaluate` "
             "to measure them again)"] if older else []
    return Selection(measured.rows, files + known.set_aside + current.set_aside + measured.set_aside)


def measurements(rows: Iterable[dict[str, Any]], *, include_limited: bool = False) -> Selection:
    """Every measurement on whole splits as a dataset of its own: a dataset name measured on two
    fingerprints becomes two, `NAME (data FINGERPRINT)`, so their rows never meet in one board.
    `--limit` measurements are kept apart as `select_rows` keeps them: a name with no whole-split
    measurement shows its newest limited one, `include_limited` shows every one, each as
    `NAME (limit N)`; the rest is set aside and named."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["dataset"], r["dataset_fingerprint"], r["limit"])].append(r)
    newest = {g: max(r["created_at"] or "" for r in rs) for g, rs in groups.items()}
    prints: dict[str, set[str]] = defaultdict(set)  # a name's whole-split fingerprints
    for _, name, fp, limit in groups:
        if limit is None:
            prints[name].add(fp)
    chosen: dict[tuple, str] = {}
    for g in groups:
        task, name, fp, limit = g
        shown = f"{name} (data {(fp or 'none')[:FINGERPRINT_CHARS]})" if len(prints[name]) > 1 else name
        full = [h for h in groups if h[:2] == (task, name) and h[3] is None]
        newest_limited = max((h for h in groups if h[:2] == (task, name)), key=lambda h: newest[h])
        if limit is None:
            chosen[g] = shown
        elif include_limited or (not full and g == newest_limited):
            chosen[g] = f"{shown} (limit {limit})"
    out = [{**r, "dataset": chosen[g]} for g, rs in groups.items() if g in chosen for r in rs]
    return Selection(out, _set_aside_phrases(groups, chosen, newest))
