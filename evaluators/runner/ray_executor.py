"""`bench evaluate --executor ray`: the local run's units of work as Ray tasks.

The local path's units of work move, unchanged. Extraction: one task per (backbone, row
shard) calling `extract_activations` on its rows (each split is one cache entry, which the
shards' writers fill at once through the cache's own locked, resumable protocol: `entry.json`
is written last, by whichever shard completes the entry, so an attempt killed mid-shard
leaves rows that the retry resumes from and that nothing reads as done; shards start on
batch boundaries, so every image goes through the model in the local path's batch). Binding
training: where row sets are stacked (a GPU), one task per backbone, its batched fit:
`binding.rows.binding_rows` on each stack of its row sets, as the local loop fits them
(`binding.rows.stacks`); on a CPU, whose stacks hold one row set, one task per row set, so that a
backbone's row sets are fitted side by side on the cluster's cores, as the local path's worker
processes fit them (`training_units`). IsSameObject: one task
per (backbone, layer) calling `issameobject.evaluate_activations` on that layer. Training
tasks take the extraction results as arguments, so Ray starts them as soon as their
backbone's shards are cached.
The driver plans, skips finished rows and writes `results/<run_id>.parquet` exactly as the
local path does, in the local path's row order, so the file differs only in provenance and
wall times.

The tasks themselves run as `evaluators.runner.ray_tasks` runs them (options, storage check, retries,
logs). Importing this module imports Ray: only the `--executor ray` path does.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from bench.core.dataset import Dataset
from bench.core.ray_cluster import ray
from bench.core.results import write_run
from evaluators.cache import entries
from evaluators.tasks.binding.rows import binding_common, binding_rows, extraction_error_rows, stack_size, stacks
from evaluators.tasks.binding.task import SPLITS, binding_task
from evaluators.cache.extract import BATCH_SIZE, extract_activations, is_complete, row_shards
from evaluators.fitting import TrainConfig, stacks_row_sets
from evaluators.runner.request import Model
from evaluators.runner.planning import Work, build_backbone
from evaluators.runner.ray_tasks import Cluster, arm_fault, cluster, die, gather, in_task, slots

#: The largest row shard: a retried shard redoes at most this many rows.
MAX_SHARD_ROWS = 4096


def _extract(model: Model, preprocessing: Mapping[str, object] | None, run_id: str, dataset: str, split: str,
             rows: tuple[int, int], layers: list[int], token_choices: list[str], device: str, dtype: str,
             limit: int | None, cache_dir: str, gpus: float) -> tuple[Any, str]:
    """One extraction unit: a backbone's activations of one row shard, into the split's shared
    cache entry (see `entries.EntryWriter`: several shards' writers fill it at once)."""

    def body() -> Any:
        if arm_fault("extract"):
            write = entries.EntryWriter.write

            def write_then_die(self: entries.EntryWriter, start: int, arrays: dict) -> None:
                write(self, start, arrays)
                n = len(next(iter(arrays.values())))
                print(f"fault injection: killing this worker after rows {start}..{start + n}")
                die()

            entries.EntryWriter.write = write_then_die  # this process only, and it is about to end
        acts = extract_activations(_backbone(model, preprocessing, run_id), Dataset(Path(dataset)), split, layers=layers,
                                   token_choices=token_choices, device=device, dtype=dtype, cache_dir=Path(cache_dir),
                                   progress=False, limit=limit, rows=rows, batch_size=BATCH_SIZE)
        print(f"activations: rows {rows[0]}..{rows[1]} of {acts.n} in {acts.path}")
        return acts

    return in_task(f"extract {model.spec} {split} rows {rows[0]}..{rows[1]}", gpus, body)


#: The backbone this worker process last built, keyed by (spec, run id): a worker that runs
#: several shards of one backbone builds (or loads) the model once. One at a time, to bound memory.
_BUILT: dict[tuple[str, str], Any] = {}


def _backbone(model: Model, preprocessing: Mapping[str, object] | None, run_id: str) -> Any:
    """The plan's backbone, made as the driver made it (`planning.build_backbone`)."""
    if (model.spec, run_id) not in _BUILT:
        _BUILT.clear()
        _BUILT[model.spec, run_id] = build_backbone(model, preprocessing)
    return _BUILT[model.spec, run_id]


def training_units(todo: Sequence[Work], together: bool) -> list[tuple[str, list[Work]]]:
    """A backbone's work as training tasks, each with its name: all of it in one where row sets are
    stacked (`together`; the task sizes the stacks from the activations' shapes, which exist only
    once extraction is done), else a task per stack of one row set, in the local loop's order. A
    row set's rows do not depend on its stack, so the rows are the local path's either way."""
    if together:
        return [("", list(todo))]
    return [(f"-L{w.layer}-{w.tokens}-seed{w.seed}-{'+'.join(w.families)}", [w]) for (w,) in stacks(todo, 1)]


def _train(common: dict[str, Any], task_data: Any, todo: list[tuple[int, list[str], int, list[str]]],
           base_train: TrainConfig, dtype: str, limit: int | None, gpus: float, n_shards: list[int],
           *shard_acts: Any) -> tuple[list[dict[str, Any]], str]:
    """One training unit (`training_units`): every (layer, views, seed, families) of `todo` in
    stacks as the local loop fits them (`binding.rows.stacks`). `shard_acts` are the splits'
    shard results in SPLITS order (`n_shards` each): Ray starts this task only when all of them
    are done, so each split's entry is complete."""
    acts = _entries(n_shards, shard_acts)
    work = [Work(layer, shown[0], seed, families) for layer, shown, seed, families in todo]
    shown_of = {(layer, shown[0]): shown for layer, shown, _, _ in todo}

    def body() -> list[dict[str, Any]]:
        doomed = arm_fault("train")
        rows: list[dict[str, Any]] = []
        for stack in stacks(work, stack_size(acts["train"], work, task_data, base_train, limit)):
            first = stack[0]
            rows += binding_rows(common, acts, task_data, [(w.layer, shown_of[w.layer, w.tokens]) for w in stack],
                                 first.seed, first.families, replace(base_train, seed=first.seed), dtype, limit,
                                 progress=False)
            print(f"seed {first.seed}: {', '.join(first.families)} trained on {len(stack)} row set(s)")
            if doomed:
                print("fault injection: killing this worker after its first stack")
                die()
        return rows

    where = f" layer {work[0].layer} {work[0].tokens} seed {work[0].seed}" if len(work) == 1 else ""
    return in_task(f"train {common['backbone']}{where}", gpus, body)


def _entries(n_shards: list[int], shard_acts: Sequence[Any]) -> dict[str, Any]:
    """Each split's Activations, from its shards' results (`n_shards` each, in SPLITS order):
    a task that took them all as arguments starts when every shard is done, so every entry
    is complete."""
    firsts = [sum(n_shards[:i]) for i in range(len(SPLITS))]
    acts = {s: shard_acts[i] for s, i in zip(SPLITS, firsts)}
    for s, a in acts.items():
        if not is_complete(a):
            raise RuntimeError(f"the {s} activations at {a.path} are incomplete after all their shards finished")
    return acts


def _pairs_layer(model: Model, preprocessing: Mapping[str, object] | None, run_id: str, dataset: str, layer: int,
                 probes: list[str], seeds: list[int], device: str, dtype: str, epochs: int | None,
                 exclude_background: bool, limit: int | None, gpus: float, n_shards: list[int],
                 *shard_acts: Any) -> tuple[list[dict[str, Any]], str]:
    """One IsSameObject unit: every probe and seed at one (backbone, layer), the rows
    `evaluate_issameobject` gives for that layer."""
    from evaluators.tasks.issameobject.evaluate import evaluate_activations, pair_configs, wants_qk

    acts = {s: replace(a, layers=[layer]) for s, a in _entries(n_shards, shard_acts).items()}

    def body() -> list[dict[str, Any]]:
        pc, tc = pair_configs(device, epochs, exclude_background)
        ds = Dataset(Path(dataset))
        qk = _backbone(model, preprocessing, run_id).bind(ds).attention_qk if wants_qk(probes) else None
        rows = evaluate_activations(acts, ds, probes=probes, seeds=seeds, pair_config=pc,
                                    train_config=tc, limit=limit, progress=False, extra_config={"dtype": dtype},
                                    attention_qk=qk)
        print(f"{len(rows)} rows: {', '.join(probes)} x seeds {', '.join(map(str, seeds))}")
        return rows

    return in_task(f"issameobject {model.spec} layer {layer}", gpus, body)


def shard_ranges(n: int, slots: int) -> list[tuple[int, int]]:
    """Row shards of one split: about two per slot that can run at once (so uneven splits and
    backbones still balance), at least a batch and at most MAX_SHARD_ROWS rows each."""
    return row_shards(n, min(MAX_SHARD_ROWS, -(-n // (2 * max(1, slots)))), BATCH_SIZE)


def _submit_extraction(c: Cluster, plans: Sequence[Any], run_id: str, shards: dict[str, list[tuple[int, int]]],
                       dtype: str, limit: int | None) -> dict[str, list[Any]]:
    """One task per row shard of every split of every backbone, submitted before any unit that
    reads them and largest first (so no worker waits while another finishes a long shard);
    each backbone's Activations refs, in SPLITS order."""
    extract = c.remote(_extract, num_returns=2)
    order = sorted(((plan, s, rows) for plan in plans for s in SPLITS for rows in shards[s]),
                   key=lambda t: t[2][0] - t[2][1])  # stable: equal sizes keep backbone, split order
    refs: dict[tuple[str, str, tuple[int, int]], Any] = {}
    for plan, s, rows in order:
        acts, log = extract.remote(plan.model, plan.preprocessing, run_id, str(c.dataset), s, rows, plan.layers,
                                   plan.token_choices, c.dev, dtype, limit, str(c.cache_root), c.gpus)
        c.tasks[log] = (f"extract-{plan.spec}-{s}-{rows[0]}-{rows[1]}", plan.spec)
        refs[plan.spec, s, rows] = acts
    return {plan.spec: [refs[plan.spec, s, rows] for s in SPLITS for rows in shards[s]] for plan in plans}


def run_binding(plans: Sequence[Any], ds: Dataset, *, unanchored: bool, prov: dict[str, Any], test_fp: str,
                base_train: TrainConfig, device: str, dtype: str, limit: int | None, results_dir: Path,
                run_id: str, progress: bool, address: str | None, gpus_per_task: float | None,
                control: str | None = None) -> Path | None:
    """The binding rows of `plans` (backbones with rows to do), computed by Ray tasks; the
    results file is rewritten, in the local path's row order, as rows arrive."""
    if not plans:
        return None
    with cluster(ds, device, gpus_per_task, address, results_dir, run_id) as c:
        task_data = binding_task(ds, limit, unanchored, control)
        prov = {**prov, "device": c.dev}
        base_train = replace(base_train, device=c.dev)
        train = c.remote(_train)
        data_ref = ray.put(task_data)
        units: dict[Any, tuple[Any, dict, list]] = {}  # ref -> (plan, common, todo), in the local row order
        shards = {s: shard_ranges(len(task_data.codes[s][1]), slots(c.gpus)) for s in SPLITS}
        extracted = _submit_extraction(c, plans, run_id, shards, dtype, limit)
        together = stacks_row_sets(base_train.device, base_train.stack_bytes)
        for plan in plans:
            common = binding_common(prov, plan, ds, test_fp, limit, task_data)
            for name, part in training_units(plan.todo, together):
                todo = [(w.layer, plan.shown(w.tokens), w.seed, w.families) for w in part]
                ref = train.remote(common, data_ref, todo, base_train, dtype, limit, c.gpus,
                                   [len(shards[s]) for s in SPLITS], *extracted[plan.spec])
                c.tasks[ref] = (f"train-{plan.spec}{name}", plan.spec)
                units[ref] = (plan, common, part)
        rows_of: dict[Any, list[dict[str, Any]]] = {}

        def arrived(ref: Any, rows: list[dict[str, Any]] | None, error: BaseException | None) -> int:
            plan, common, todo = units[ref]
            rows_of[ref] = plan.stamp(rows if error is None else extraction_error_rows(common, plan, todo, error))
            return len(rows_of[ref])

        def write() -> Path | None:
            rows = [r for ref in units if ref in rows_of for r in rows_of[ref]]
            return write_run(rows, results_dir, run_id) if rows else None

        gather(c, set(units), extracted, progress, arrived, write)
        return write()


def run_issameobject(work: Sequence[tuple[Any, list[int], list[str]]], ds: Dataset, *, seeds: Sequence[int],
                     device: str, dtype: str, epochs: int | None, exclude_background: bool, limit: int | None,
                     results_dir: Path, run_id: str, progress: bool, address: str | None,
                     gpus_per_task: float | None) -> dict[str, list[dict[str, Any]] | BaseException]:
    """IsSameObject rows of each (plan, layers, probes) in `work`, as `evaluate_issameobject`
    returns them (in its order), or the exception its extraction raised: extraction in row
    shards, then one task per (backbone, layer) training all probes and seeds."""
    out: dict[str, list[dict[str, Any]] | BaseException] = {}
    if not work:
        return out
    with cluster(ds, device, gpus_per_task, address, results_dir, run_id) as c:
        layer_task = c.remote(_pairs_layer)
        units: dict[Any, str] = {}
        shards = {s: shard_ranges(ds.num_rows(s) if limit is None else min(limit, ds.num_rows(s)), slots(c.gpus))
                  for s in SPLITS}
        extracted = _submit_extraction(c, [plan for plan, _, _ in work], run_id, shards, dtype, limit)
        for plan, layers, probes in work:
            out[plan.spec] = []
            for layer in layers:
                ref = layer_task.remote(plan.model, plan.preprocessing, run_id, str(c.dataset), layer, probes,
                                        list(seeds), c.dev, dtype, epochs, exclude_background, limit, c.gpus,
                                        [len(shards[s]) for s in SPLITS], *extracted[plan.spec])
                c.tasks[ref] = (f"issameobject-{plan.spec}-L{layer}", plan.spec)
                units[ref] = plan.spec

        def arrived(ref: Any, rows: list[dict[str, Any]] | None, error: BaseException | None) -> int:
            spec = units[ref]
            if error is not None:
                out[spec] = error
            elif not isinstance(out[spec], BaseException):
                out[spec] += rows
            return len(rows or [])

        gather(c, set(units), extracted, progress, arrived, None)
    seed_at = {s: i for i, s in enumerate(seeds)}
    for plan, _, probes in work:  # the local order: seed, then layer, then probe
        rows = out[plan.spec]
        if not isinstance(rows, BaseException):
            probe_at = {p: i for i, p in enumerate(probes)}
            rows.sort(key=lambda r, at=probe_at: (seed_at[r["seed"]], r["layer"], at[r["probe"]]))
    return out
