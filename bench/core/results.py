"""The results table (docs/explanation/architecture.md, "Results"): one tidy row per
(run, backbone, dataset, split, layer, tokens, task, probe, seed), provenance in every row.

Evaluators append rows through `write_run`; leaderboards read the union of every
`results/*.parquet` through `read_results`. Each run is its own file, written
atomically, so concurrent or crashed runs never corrupt each other.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

import bench
from bench.core.dataset import write_parquet_atomic
from bench.core.errors import BenchError
from bench.core.hashing import config_hash
from bench.core.versions import package_versions

#: 2: the chain-rule estimator on prior-anchored probes (β* = 1 - L_O|F / H(O|F)) is the
#: headline; the paper's two-probe estimator moved to `*_paper` columns; β*_cond is gone.
#: 3: `limit` (the `--limit` a run used, null for whole splits) is a column and part of the key.
#: 4: probes fitted in stages with settings chosen on validation and guarded against the prior;
#: `control` in the key; validation numbers, sensitivity and the paired-comparison columns; the ‡
#: checks a binding row breaks (`checks`), IsSameObject validation numbers, the run's `command`.
#: 5: `weights_fingerprint` (what the weights were) and `probe_fingerprint` (the probe settings as
#: requested plus the probe code version) join the key, so an edited model or probe is measured again;
#: `spec` holds the model spec when `-m NAME=SPEC` puts a display name in `backbone`.
RESULTS_SCHEMA_VERSION = 5

#: The key: a row is identified by these (re-runs skip keys already present).
KEY_COLUMNS = ("backbone", "dataset", "dataset_fingerprint", "limit", "control", "split", "layer", "tokens", "task",
               "probe", "seed", "weights_fingerprint", "probe_fingerprint")



def layer_row(info: Any, dataset: Any, *, task: str, layer: int, seed: int, cfg: Mapping[str, Any],
              **values: Any) -> dict[str, Any]:
    """A per-layer task's result row on a dataset's test split (patch tokens, "all"): who measured
    what where (`info` a BackboneInfo, `dataset` a Dataset), its settings `cfg` with their hash, and
    the metrics `values`; provenance is the caller's."""
    return {"backbone": info.spec, "backbone_family": info.family, "backbone_revision": info.revision,
            "dataset": dataset.name, "dataset_fingerprint": dataset.fingerprint("test"), "split": "test",
            "layer": int(layer), "n_layers": int(info.n_layers), "tokens": "all", "task": task, "seed": int(seed),
            "config": json.dumps(cfg, sort_keys=True), "config_hash": config_hash(cfg), **values}


def row_key(row: Mapping[str, Any]) -> tuple:
    """The key of a row (its `KEY_COLUMNS` cells, in order): the one rule every part keys rows
    by — `bench evaluate` and a study's plan deciding which rows are still owed, `existing_keys`,
    the leaderboard keeping the newest row per key — so they never disagree on what is held."""
    return tuple(row[c] for c in KEY_COLUMNS)


_F = pa.float64()
_METRICS = [
    # binding task (bits per scene and ratios), docs/explanation/architecture.md "the estimator"
    "H_O", "H_F", "H_O_given_F", "L_O", "L_F", "L_O_given_F",
    "B_O", "beta_O", "B_F", "beta_F", "B_star", "beta_star",
    # the paper's estimator (unanchored direct O- and F-probes), for published comparisons
    "L_O_paper", "L_F_paper", "B_O_paper", "beta_O_paper", "B_F_paper", "B_star_paper", "beta_star_paper",
    "bit_accuracy", "exact_accuracy",
    # the share of a planted, known binding (true β* known exactly) the same probe recovers here
    "sensitivity",
    # issameobject task
    "accuracy", "balanced_accuracy", "auroc", "majority_accuracy",
    # objective task: a zoo model's own training loss on val (lower is better)
    "objective_loss",
    # segmentation task (evaluators.tasks.segmentation): ratios in [0, 1], intervals over test images
    "semantic_miou", "instance_miou", "instance_ari",
]

RESULT_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("run_id", pa.string()),
        ("created_at", pa.string()),
        ("bench_version", pa.string()),
        ("package_versions", pa.string()),  # JSON object
        ("device", pa.string()),
        ("host", pa.string()),
        ("command", pa.string()),  # the command line that made the run (null: called from Python)
        ("backbone", pa.string()),  # the display name of `-m NAME=SPEC`, else the spec string
        ("spec", pa.string()),  # the spec string, e.g. "facebook/dinov2-small", "oracle:objects", a folder
        ("backbone_family", pa.string()),
        ("backbone_revision", pa.string()),  # weights revision or content hash
        # the key's identity of the weights: the backbone revision (hub revision, `sha256:` of the
        # weight files or folder, zoo card), so an edited checkpoint under the same spec is new
        ("weights_fingerprint", pa.string()),
        # the key's identity of the probe: a hash of its settings as requested plus the probe code
        # version (`evaluators.runner.planning.PROBE_CODE_VERSION`), not the values a validation sweep picks
        ("probe_fingerprint", pa.string()),
        ("dataset", pa.string()),  # dataset name (directory name)
        ("dataset_fingerprint", pa.string()),  # fingerprint of the evaluated split (its first `limit` rows)
        ("limit", pa.int64()),  # `--limit`: the first N scenes of every split were used; null = whole splits
        # a control null (`--control`): "resampled-o" = every O redrawn from p(O|F); null = the real O
        ("control", pa.string()),
        ("split", pa.string()),
        ("layer", pa.int32()),  # 0 = embeddings, L = last block
        ("n_layers", pa.int32()),
        ("tokens", pa.string()),  # cls | mean | all | cls+mean
        ("task", pa.string()),  # a registered task (bench/core/tasks.py): binding, issameobject, ...
        ("probe", pa.string()),
        ("seed", pa.int64()),
        ("config_hash", pa.string()),
        ("config", pa.string()),  # JSON of everything that produced the row
        ("status", pa.string()),  # ok | error
        ("error", pa.string()),
        ("wall_time_s", _F),
        ("n_train", pa.int64()),
        ("n_test", pa.int64()),
        ("n_classes", pa.int64()),  # segmentation: the classes its semantic counts hold (background one)
        ("best_epoch", pa.int32()),
        # binding: "exact" (probes anchored on the generator's exact priors), "none" (--unanchored) or
        # "empirical" (imported real images: B* against a blind reference probe given F alone)
        ("prior", pa.string()),
        # binding: False when some headline (F, O|F) probe did not reach its validation plateau,
        # or its best epoch lay in the last 10% of the epoch budget; `converged_paper`: the paper's probes
        ("converged", pa.bool_()),
        ("converged_paper", pa.bool_()),
        # binding: effective number of test F codes, 1/Σ P(f)², the bootstrap's real sample size
        ("n_F_eff", _F),
        # binding: the ‡ checks the row breaks (`evaluators.tasks.binding.metrics.row_checks`; [] = none), what the
        # leaderboard marks, so a reader of the Parquet sees it too; null for error and IsSameObject rows
        ("checks", pa.list_(pa.string())),
        # binding, validation: mean code lengths of the chosen probes, the SE of the headline ones over
        # validation F codes, and the validation scenes' prior references (`evaluators.tasks.binding.metrics.validation_metric`)
        *[(c, _F) for c in ("val_L_F", "val_L_O_given_F", "val_L_O_paper", "val_L_F_paper", "val_H_F",
                            "val_H_O_given_F", "val_L_F_se", "val_L_O_given_F_se")],
        # issameobject, validation pairs: the numbers `--layer best` chooses a layer on (point values)
        *[(f"val_{m}", _F) for m in ("accuracy", "balanced_accuracy", "auroc")],
        # segmentation, validation images: likewise
        *[(f"val_{m}", _F) for m in ("semantic_miou", "instance_miou", "instance_ari")],
        *[(m, _F) for m in _METRICS],
        *[(f"{m}_lo", _F) for m in _METRICS],
        *[(f"{m}_hi", _F) for m in _METRICS],
        # issameobject trained probes: Pearson r of the probe's test-pair scores with the attention
        # weights of the block that reads the layer, and its permutation p-value (null elsewhere)
        ("attention_r", _F),
        ("attention_p", _F),
        # per-scene test bits (binding task), kept so any metric can be re-bootstrapped
        ("scene_bits_F", pa.list_(pa.float32())),
        ("scene_bits_O_given_F", pa.list_(pa.float32())),
        ("scene_bits_O_paper", pa.list_(pa.float32())),
        ("scene_bits_F_paper", pa.list_(pa.float32())),
        # per test scene: its F-code group (paired bootstraps resample the same groups) and its prior references
        ("scene_groups", pa.list_(pa.int32())),
        ("scene_ref_F", pa.list_(pa.float32())),
        ("scene_ref_O_given_F", pa.list_(pa.float32())),
        # per scene, what `bench compare` pairs the other tasks on (`Task.paired`): objective, per val scene
        # its loss and the elements it averages (`objective_loss` = Σ loss·count / Σ count); segmentation,
        # per test image holding an object its instance scores (their means are the metrics), and per test
        # image the per-class patch counts behind `semantic_miou` (N × `n_classes`, flattened row-major)
        ("scene_objective_loss", pa.list_(pa.float32())),
        ("scene_objective_count", pa.list_(pa.int32())),
        ("scene_instance_miou", pa.list_(pa.float32())),
        ("scene_instance_ari", pa.list_(pa.float32())),
        *[(f"scene_semantic_{c}", pa.list_(pa.int32())) for c in ("intersection", "union", "truth")],
    ],
    metadata={b"bindingbench_results_schema_version": str(RESULTS_SCHEMA_VERSION).encode()},
)

METRICS = tuple(_METRICS)


def new_run_id() -> str:
    """Sortable, unique run id: UTC time plus a random suffix."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def provenance(run_id: str, device: str, command: str | None = None) -> dict[str, Any]:
    """Columns every row of a run shares; `command` is the command line that made it."""
    return {
        "command": command,
        "schema_version": RESULTS_SCHEMA_VERSION,
        "run_id": run_id,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),  # two runs in one second stay in order
        "bench_version": bench.__version__,
        "package_versions": json.dumps(package_versions(), sort_keys=True),
        "device": device,
        "host": platform.node(),
    }


def make_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows (dicts; missing columns become null) as a table in the results schema."""
    rows = list(rows)
    unknown = {k for r in rows for k in r} - set(RESULT_SCHEMA.names)
    if unknown:
        raise ValueError(f"unknown result columns: {sorted(unknown)}")
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def check_writable(directory: str | os.PathLike, what: str = "results") -> None:
    """Refuse, before any work, an output directory this process cannot create or write into."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".write-check-"):
            pass
    except OSError as e:
        raise BenchError(f"{what}: cannot write to {d} ({e.strerror or e}); choose another directory") from None


def write_run(rows: Iterable[dict[str, Any]], results_dir: str | os.PathLike, run_id: str) -> Path:
    """Write one run's rows to `<results_dir>/<run_id>.parquet` atomically."""
    path = Path(results_dir) / f"{run_id}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(make_table(rows), path)
    return path


def read_results(results_dir: str | os.PathLike, older: list[str] | None = None) -> pa.Table:
    """Union of every run file of this schema version in a results directory (empty table if none).

    Files of an older schema version hold rows keyed without what this version keys on, so
    they are never mixed in: they are left out and, when `older` is a list, named in it as
    `FILE (schema N, R rows)`. A file of a newer version (or none) is refused: this
    BindingBench cannot know what its rows mean."""
    d = Path(results_dir)
    if not d.is_dir():
        raise BenchError(f"results: {d} is not a directory")
    tables = []
    for f in sorted(d.glob("*.parquet")):
        try:
            t = pq.read_table(f)
        except (OSError, pa.ArrowException) as e:  # truncated or garbled: name the file, no traceback
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise BenchError(f"results: {f} is damaged ({first}); move it out of {d} "
                             "(its runs are lost; `bench evaluate` re-creates them)") from None
        raw = (t.schema.metadata or {}).get(b"bindingbench_results_schema_version", b"")
        version = int(raw) if raw.isdigit() else None
        if version is not None and version < RESULTS_SCHEMA_VERSION and "backbone" in t.column_names:
            if older is not None:
                older.append(f"{f.name} (schema {version}, {t.num_rows} rows)")
            continue
        if version != RESULTS_SCHEMA_VERSION:
            raise BenchError(
                f"results: {f.name} has schema version {raw.decode() or 'none'}; "
                f"this BindingBench reads {RESULTS_SCHEMA_VERSION}; re-run `bench evaluate` into a new results directory"
            )
        _refuse_null_keys(t, f, d)
        tables.append(with_schema_columns(t))
    return pa.concat_tables(tables) if tables else RESULT_SCHEMA.empty_table()


def with_schema_columns(t: pa.Table) -> pa.Table:
    """A run file's table in this schema's columns and order: a nullable column that joined the schema
    after the file was written (a new task's metrics) reads as null, so files written before and
    after it read together (their union needs one schema); a column this schema lacks is dropped."""
    if t.schema.names == RESULT_SCHEMA.names:
        return t
    columns = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
               for f in RESULT_SCHEMA]
    return pa.Table.from_arrays(columns, schema=RESULT_SCHEMA)


#: Key columns every row this BindingBench writes fills (the others, such as `limit` and
#: `control`, are null by design); a null here means the file was edited or damaged.
_REQUIRED_KEYS = ("backbone", "dataset", "task", "probe", "status")


def _refuse_null_keys(t: pa.Table, f: Path, d: Path) -> None:
    """Refuse a run file whose rows lack a key cell: every reader groups and labels by these,
    and a null would surface as a TypeError deep in leaderboard, plot or report."""
    for c in _REQUIRED_KEYS:
        if c not in t.column_names:
            raise BenchError(f"results: {f} has no '{c}' column; move it out of {d}")
        nulls = t[c].null_count
        if nulls:
            raise BenchError(f"results: {f} has {nulls} row(s) with an empty '{c}'; "
                             f"move it out of {d} (`bench evaluate` re-creates its runs)")


def existing_keys(results_dir: str | os.PathLike) -> set[tuple]:
    """Keys of finished (status ok) rows, so a re-run can skip them (rows of an older schema
    version do not count: they are measured again)."""
    d = Path(results_dir)
    if not d.is_dir():
        return set()
    t = read_results(d)
    if t.num_rows == 0:
        return set()
    return {row_key(r) for r in t.select([*KEY_COLUMNS, "status"]).to_pylist() if r["status"] == "ok"}
