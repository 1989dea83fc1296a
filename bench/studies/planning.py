"""What a study will do, worked out before any of it is done and without loading a model.

The plan names the output folder, the datasets to make (or reuse), and per evaluate block,
dataset and backbone the row sets — (layer, tokens choice, seed), each fitting every probe family
in one pass — with how many of their rows the results folder already holds. A row counts as
held when a finished row of the same key is there (the key `bench evaluate` skips on: backbone,
dataset fingerprint, limit, control, layer, tokens, task, probe, seed, weights and probe
fingerprints); layer counts and weights fingerprints come from the backbone registry's metadata
(`evaluators.backbones.backbone_metadata`), so a study of hub models plans offline. A backbone
whose shape only its files tell (a checkpoint folder, a `py:` file) plans as "layers read when
it loads". The time estimate comes from the `wall_time_s` of rows already present, else from
a stated constant per row set; the disk estimate is an upper bound on the activation cache's
growth (entries already cached are not subtracted).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from bench.core.errors import BenchError
from bench.core.paths import output_path
from bench.core.tasks import TASKS
from bench.studies.spec import BackboneEntry, DatasetEntry, EvaluateBlock, Study
from bench.studies.sweeps import sweep_notes

if TYPE_CHECKING:
    from evaluators.backbones import Download

#: Without rows to time from: seconds per row set (one backbone, layer, tokens choice and seed,
#: every family fitted in one pass) — the demo's row sets took 5 to 40 s on 2 CPU cores at
#: 1,400 scenes; a paper-sized dataset on a GPU takes minutes. Printed beside the estimate.
ROW_SET_SECONDS = 30.0
#: The manifest a study writes into its folder: which study made it, with which settings.
MANIFEST = "bench-study.json"
#: The lock a run holds on its study's folder (`runner.run_study`): one run of a folder at a time.
LOCK = ".bench-study.lock"


@dataclass(frozen=True)
class DatasetStep:
    """One dataset of the plan: where it is and what the run does with it."""

    entry: DatasetEntry
    target: Path
    status: str  # "present", "to make", "to import", "resume" (an unfinished one is there), "not set"
    scenes: int | None
    image_size: int | None


@dataclass(frozen=True)
class Unit:
    """One backbone of one evaluate block on one dataset: its row sets and rows, those held."""

    block: EvaluateBlock
    dataset: str
    backbone: BackboneEntry
    n_layers: int | None  # None: read when the model loads
    layers: tuple[int, ...] | None
    token_choices: tuple[str, ...]
    row_sets: int | None
    rows: int | None
    held: int
    pending_row_sets: int | None
    activation_bytes: int = 0
    seconds: float | None = None

    @property
    def done(self) -> bool:
        return self.rows is not None and self.held >= self.rows


@dataclass(frozen=True)
class StudyPlan:
    study: Study
    out: Path
    out_note: str
    datasets: tuple[DatasetStep, ...]
    units: tuple[Unit, ...]
    held_rows: int
    estimate_s: float
    estimate_source: str
    activation_bytes: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The backbones whose files are not in the local cache, with the download each needs.
    downloads: tuple[tuple[BackboneEntry, Download], ...] = ()

    @property
    def pending(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if not u.done)

    def lines(self) -> list[str]:
        """The plan as printed by `bench run` (and `--dry-run`), one fact a line."""
        from evaluators.cache.keys import gib

        s = self.study
        out = [f"study {s.name} ({s.source}) → {self.out} ({self.out_note})"]
        if s.variables:
            out.append("  variables: " + ", ".join(f"{k}={v or '(empty: its key left out)'}" for k, v in s.variables.items()))
        if s.unset:
            out.append("  not set (the run needs them): " + ", ".join(s.unset))
        out.append("datasets:")
        for d in self.datasets:
            what = {"generate": f"{d.entry.generator} --preset {d.entry.preset or '(default)'}",
                    "import": f"import {d.entry.importer} from {d.entry.path}", "path": "an existing folder"}[d.entry.kind]
            size = "" if d.scenes is None else f", {d.scenes:,} scenes"
            side = "" if d.image_size is None else f" at {d.image_size} px"
            out.append(f"  {d.entry.name}: {d.status} ({what}{size}{side}) in {d.target}")
        out.append("row sets (layer × tokens × seed, every probe family fitted in one pass):")
        for u in self.units:
            layers = ("layers read when it loads" if u.layers is None else
                      f"{u.n_layers} layers, hidden states {_ranges(u.layers)}")
            probes = ",".join(u.block.options.get("probes") or ("default",))
            held = ("" if u.rows is None else f"; {u.held}/{u.rows} rows held" + (" (done)" if u.done else ""))
            count = "?" if u.row_sets is None else str(u.row_sets)
            name = u.backbone.name if u.backbone.name == u.backbone.spec else f"{u.backbone.name} ({u.backbone.spec})"
            out.append(f"  {u.block.key} {u.block.task} · {u.dataset} · {name}: "
                       f"{layers}; tokens {','.join(u.token_choices)}; probes {probes}; {count} row sets{held}")
        fits = sum(u.pending_row_sets or 0 for u in self.units)
        unknown = sum(u.pending_row_sets is None for u in self.units)
        out.append(f"to fit: {fits} row sets{f' (+ {unknown} backbones whose layers are read when they load)' if unknown else ''}"
                   f"; results hold {self.held_rows} of the study's rows already")
        out.append(f"disk: the activations cache grows by at most ~{gib(self.activation_bytes)} "
                   "(entries already cached are not subtracted)")
        out.append(f"estimated time: ~{_duration(self.estimate_s)} ({self.estimate_source})")
        out += list(self.notes)
        return out


def plan_study(study: Study, out: str | Path | None = None, cwd: Path | None = None) -> StudyPlan:
    """The plan of `study` writing into `out` (None: the default folder in `cwd`, see `choose_out`).

    Refuses, in one line, what the run would refuse before any work: an output folder it may
    not write (`check_folder`), a dataset folder that holds other scenes, a layer a backbone
    does not have. What needs this machine as it is now (free disk, a device, the network) is
    `check_run`'s, before a run."""
    from bench.core.results import existing_keys, read_results
    from evaluators.backbones import check_loadable

    folder, note = choose_out(study, out, cwd or Path.cwd())
    results = folder / "results"
    held = existing_keys(results)
    table = read_results(results) if results.is_dir() else None
    walls = _walls(table)
    steps = tuple(_dataset_step(study, entry, folder) for entry in study.datasets.values())
    by_name = {s.entry.name: s for s in steps}
    units = tuple(u for block in study.blocks for d in block.datasets for u in _units(study, block, by_name[d], held))
    seconds, source, timed = 0.0, [], 0
    for u in units:
        if u.pending_row_sets is None or u.done:
            continue
        per_row = walls.get((u.backbone.name, u.block.task)) or walls.get(u.block.task)
        if per_row is not None:
            seconds += per_row * (u.rows - u.held)
            timed += 1
        else:
            seconds += ROW_SET_SECONDS * u.pending_row_sets
            source.append(u)
    if not any(u.pending_row_sets for u in units):
        how = "nothing to fit"
    elif timed and source:
        how = (f"wall_time_s of the rows present for {timed} backbone(s), {ROW_SET_SECONDS:.0f} s a row set for "
               f"{len(source)} without rows to time from")
    elif timed:
        how = "from the wall_time_s of the rows already present"
    else:
        how = f"{ROW_SET_SECONDS:.0f} s a row set, a stated constant: no rows present to time from"
    first: dict[str, BackboneEntry] = {}
    for b in study.backbones.values():
        first.setdefault(b.spec, b)  # each spec once, under the key path that names it first
    downloads = tuple((b, need) for b in first.values() if (need := check_loadable(b.spec)) is not None)
    notes = ((f"not in the local cache, downloaded when it runs: {', '.join(n.what for _, n in downloads)}",)
             if downloads else ()) + tuple(sweep_notes(study.blocks, folder))
    return StudyPlan(study, folder, note, steps, units, sum(u.held for u in units), seconds, how,
                     _activation_bytes(units, by_name), notes, downloads)


def check_run(plan: StudyPlan, executor: str = "local") -> None:
    """Refuse, in one line naming the study file and key path and creating nothing, what the
    run would otherwise refuse only once its folder is made: a dataset folder that cannot be
    read (damaged, no codes or priors a block needs), an import that cannot be made (no
    source, options `bench import` refuses), scenes this disk or memory cannot hold, a device
    this machine lacks (local runs), a backbone whose files are neither cached nor
    downloadable now. The checks are those the run makes, made earlier."""
    from bench.core.paths import check_output_dir

    study = plan.study
    check_output_dir(plan.out, "out")
    for step in plan.datasets:
        try:
            _check_dataset(study, step)
        except BenchError as e:
            raise BenchError(f"{study.source}: {_dataset_key(step.entry)}: {e}") from None
    for block in study.blocks:
        if executor == "local" and "device" in block.options:
            from evaluators.cache.extract import resolve_device

            try:
                resolve_device(block.options["device"])
            except BenchError as e:
                raise BenchError(f"{study.source}: {block.key}: {e}") from None
    for backbone, need in plan.downloads:
        try:
            need.require()
        except BenchError as e:
            raise BenchError(f"{study.source}: {backbone.key}: {e}") from None


def _dataset_key(entry: DatasetEntry) -> str:
    """The key path a refusal about a dataset names: its `path` when it is an existing folder."""
    return f"datasets.{entry.name}.path" if entry.kind == "path" else f"datasets.{entry.name}"


def _check_dataset(study: Study, step: DatasetStep) -> None:
    """One dataset as the run will use it: made (an import's source and options, a render's
    size against this machine), or opened with the checks `bench evaluate` makes first."""
    if step.entry.kind == "import" and step.status == "to import":
        from generators.importers import check_import

        if not step.entry.path.is_dir():
            raise BenchError(f"src: {step.entry.path} is not a folder")
        check_import(step.entry.importer, step.entry.path, step.target,
                     **{k: v for k, v in step.entry.options.items() if k != "split_seed"})
        return
    if step.entry.kind == "generate" and step.status != "present":
        from generators.engine import check_resources

        gen, config = generator_config(step.entry)
        check_resources(gen, config, step.target, workers=1)  # `_make_dataset` renders with one
        return
    from evaluators.tasks.binding.task import open_dataset

    blocks = [b for b in study.blocks if step.entry.name in b.datasets]
    ds = open_dataset(step.target, need_codes=any(TASKS.get(b.task).needs_codes for b in blocks))
    for b in blocks:
        check_dataset = TASKS.get(b.task).hook("check_dataset")
        if check_dataset is not None:
            check_dataset(ds, b.options)


def choose_out(study: Study, out: str | Path | None, cwd: Path) -> tuple[Path, str]:
    """The study's folder: `out` (`check_folder` says whether it may be written), or the first
    of ./FOLDER, ./FOLDER-2, … (FOLDER: the study's `folder`, else its name) that is free or
    that this study made with the same settings (its manifest says so); any other is passed
    over, and nothing in a folder is ever deleted."""
    if out is not None:
        folder = output_path(out, "out")
        made = check_folder(folder, study)
        return folder, "reused: made by this study" if made else "given"
    for k in range(1, 10_000):
        folder = cwd / (study.folder if k == 1 else f"{study.folder}-{k}")
        if not folder.exists() and not folder.is_symlink():
            return _shown(folder, cwd), "new"
        try:
            made = check_folder(folder, study)
        except BenchError:  # another's, damaged, a link: not ours to write
            continue
        if made is not None and made.get("settings") == dict(study.settings):
            return _shown(folder, cwd), "reused: made by this study with the same settings"
    raise BenchError(f"out: {cwd} already holds {study.folder} … {study.folder}-9999; pass --out DIR")


def check_folder(folder: Path, study: Study) -> dict[str, Any] | None:
    """The manifest of `folder` when `study` made it, None when it is new or empty; refused in
    one line, touching nothing, when a study may not write there: a symbolic link (it would
    write into the folder it points at), a file, a damaged manifest, another study's, or a
    folder holding anything without a manifest (bench did not make it: the working directory
    with your files, a dataset, your notes). A study writes only into a folder it made."""
    if folder.is_symlink():
        raise BenchError(f"out: {folder} is a symbolic link (to {os.readlink(folder)}); a study writes only into a "
                         "folder it made or an empty one: give that folder itself, or a new one")
    if not folder.exists():
        return None
    if not folder.is_dir():
        raise BenchError(f"out: {folder} exists and is not a directory")
    made = read_manifest(folder)
    if made is None:
        others = sorted(e.name for e in folder.iterdir() if e.name != LOCK)
        if others:
            raise BenchError(f"out: {folder} is not empty and no study made it (no {MANIFEST}; it holds "
                             f"{others[0]!r}); choose a new or empty folder for study {study.name!r}")
        return None
    if made["study"] != study.name:
        raise BenchError(f"out: {folder} holds study {made['study']!r} (its {MANIFEST}); choose another "
                         f"--out for study {study.name!r}")
    return made


def _shown(folder: Path, cwd: Path) -> Path:
    """A default folder as the user would type it: relative when `cwd` is the working directory."""
    return folder.relative_to(Path.cwd()) if folder.is_relative_to(Path.cwd()) and cwd == Path.cwd() else folder


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A study folder's manifest: None when it has none; a damaged one (unreadable, not a
    study's) is refused in one line, as nothing in the folder can be shown to be the study's."""
    path = folder / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BenchError(f"out: {path} is damaged ({type(e).__name__}); a study writes only into a folder it made: "
                         "choose another --out") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("study"), str):
        raise BenchError(f"out: {path} is damaged (not a study's manifest); a study writes only into a folder it "
                         "made: choose another --out")
    return manifest


def dataset_target(entry: DatasetEntry, folder: Path) -> Path:
    """Where a dataset lives: its own folder for `path`, else the study's folder under its name."""
    return entry.path if entry.kind == "path" else folder / entry.name


def generator_config(entry: DatasetEntry) -> tuple[Any, Any]:
    """The generator class and config of a dataset the study renders."""
    from generators.base import build_config, get_generator

    gen = get_generator(entry.generator)
    return gen, build_config(gen, entry.preset, dict(entry.overrides))


def _dataset_step(study: Study, entry: DatasetEntry, folder: Path) -> DatasetStep:
    from bench.core.dataset import CARD_NAME, Dataset

    target = dataset_target(entry, folder)
    if entry.kind == "path" and "${" in str(target):  # a dry run with the variable unset
        return DatasetStep(entry, target, "not set", None, None)
    present = (target / CARD_NAME).is_file()
    try:
        card = Dataset(target).card if present else None
    except BenchError as e:  # a damaged card: named with the key that led here
        raise BenchError(f"{study.source}: {_dataset_key(entry)}: {e}") from None
    if entry.kind == "generate":
        from generators.base import config_to_dict

        gen, config = generator_config(entry)
        if card is not None and (card.get("generator", {}).get("name") != gen.name
                                 or card.get("config") != json.loads(json.dumps(config_to_dict(config)))):
            raise BenchError(f"out: {target} holds a dataset made with other settings than {study.source}'s "
                             f"datasets.{entry.name}; choose another --out (a study never replaces what it did not make)")
        scenes = config.n_train + config.n_val + config.n_test
        status = "present" if card else "resume" if target.is_dir() and any(target.iterdir()) else "to make"
        return DatasetStep(entry, target, status, scenes, config.image_size)
    if card is not None:
        scenes = sum(s["n"] for s in card["splits"].values())
        side = card.get("config", {}).get("image_size")
        return DatasetStep(entry, target, "present", scenes, side)
    if entry.kind == "path":
        raise BenchError(f"{study.source}: datasets.{entry.name}.path: {target} holds no dataset (no dataset.json)")
    return DatasetStep(entry, target, "to import", entry.options.get("max_scenes"),
                       entry.options.get("image_size", 448))


def _units(study: Study, block: EvaluateBlock, step: DatasetStep, held: set[tuple]) -> list[Unit]:
    """The units of one block on one dataset, each backbone planned by the evaluation planner
    (`evaluators.runner.planning.rows_owed`) on the request `bench evaluate` makes of its group
    (`EvaluateBlock.request`), keyed as the run keys its rows; nothing is held of a dataset not made yet."""
    requests = {b: block.request(group, step.target) for group in block.groups() for b in group}
    keyed: dict[str, Any] = {"dataset": "", "test_fp": "", "limit": None, "done": set()}
    if step.status == "present":
        from bench.core.dataset import Dataset
        from evaluators.cache.keys import split_fingerprint
        from evaluators.runner.planning import effective_limit

        ds = Dataset(step.target)
        limit = effective_limit(ds, requests[block.backbones[0]].limit)  # one limit a block
        keyed = {"dataset": ds.name, "test_fp": split_fingerprint(ds, "test", limit), "limit": limit, "done": held}
    return [_unit(study, block, step, b, requests[b], keyed) for b in block.backbones]


def _unit(study: Study, block: EvaluateBlock, step: DatasetStep, backbone: BackboneEntry, request: Any,
          keyed: dict[str, Any]) -> Unit:
    from evaluators.backbones import backbone_metadata
    from evaluators.runner.planning import request_fingerprints, rows_owed

    token_choices = tuple(request.token_choices)
    info = backbone_metadata(backbone.spec)
    if info is None:
        return Unit(block, step.entry.name, backbone, None, None, token_choices, None, None, 0, None)
    try:
        owed = rows_owed(request, backbone.name, info, probe_fps=request_fingerprints(request), **keyed)
    except BenchError as e:
        hint = "; it has no layers: leave layers out of this block" if not info.n_layers else ""
        raise BenchError(f"{study.source}: {block.key}.layers: {e} (backbone {backbone.name}{hint})") from None
    layers, pending = tuple(owed.layers), len(owed.todo)
    return Unit(block, step.entry.name, backbone, info.n_layers, layers, token_choices,
                len(layers) * len(owed.token_choices) * len(request.seeds), owed.rows, owed.held, pending,
                _unit_bytes(info, backbone, step, layers, token_choices, request.limit) if pending else 0)


def _unit_bytes(info: Any, backbone: BackboneEntry, step: DatasetStep, layers: Sequence[int],
                token_choices: Sequence[str], limit: int | None) -> int:
    """An upper bound on the activations one unit extracts (`metadata_bytes`): every view asked
    for, and 3 x `limit` rows (or all the scenes) at the side the run will use."""
    from evaluators.backbones.info import FAMILIES
    from evaluators.runner.planning import metadata_bytes

    if step.scenes is None:
        return 0
    ground_truth = info.family in FAMILIES
    side = (step.image_size or info.input_size) if ground_truth else (backbone.image_size or info.input_size)
    rows = step.scenes if limit is None else min(step.scenes, 3 * limit)
    return metadata_bytes(info, side, rows, layers, token_choices)


def _activation_bytes(units: Sequence[Unit], steps: dict[str, DatasetStep]) -> int:
    """The cache entries the pending units add, each (backbone, dataset, limit) entry counted once at its largest."""
    largest: dict[tuple, int] = {}
    for u in units:
        key = (u.backbone.spec, tuple(sorted(u.backbone.preprocessing.items())), u.dataset, u.block.options.get("limit"))
        largest[key] = max(largest.get(key, 0), u.activation_bytes)
    return sum(largest.values())


def _walls(table: Any) -> dict[Any, float]:
    """Mean `wall_time_s` of the finished rows present, per (backbone, task) and per task."""
    if table is None or table.num_rows == 0:
        return {}
    sums: dict[Any, list[float]] = {}
    for backbone, task, wall, status in zip(*(table[c].to_pylist() for c in ("backbone", "task", "wall_time_s",
                                                                           "status"))):
        if status == "ok" and wall is not None:
            for key in ((backbone, task), task):
                sums.setdefault(key, []).append(float(wall))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def _ranges(values: Sequence[int]) -> str:
    """0,1,2,3,6 → 0–3,6."""
    out, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}–{v}")
            start = None
    return ",".join(out)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
