"""A study file, read and checked whole: the typed `Study` every other step works from.

A study is a TOML file that names a whole comparison — the datasets it is measured on and the
`[[evaluate]]` blocks that say which backbones, with which probes, layers, tokens and seeds —
so that a comparison is a versioned object rather than a chain of typed commands (as
lm-evaluation-harness tasks and MTEB benchmarks are). Every key, type and name is checked here,
against the same registries the commands use (generators, backbone sources, probe families,
tokens choices, metrics), before any work; a bad file raises BenchError with one line naming the
file and the key path, arrays counted from 1 (`study.toml: evaluate[2].probes[1]: unknown probe
'mlp'; ...`); each block's options are checked as the request `bench evaluate` makes of them
(`EvaluateBlock.request`). Variables and relative paths: `bench.studies.parsing`.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from bench.core.errors import BenchError
from bench.core.tasks import DEFAULT_TASK, TASKS
from bench.studies.parsing import AnyKey, Checker, Resolver, resolve_path, spec_path
from bench.studies.sweeps import block_sweep

try:  # Python 3.11+; `tomli` is the same parser, for 3.10
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[no-redef]

#: The options of a study's `import` beside `src` (those of `bench import`), with their types;
#: which importers take which of `_IMPORT_OWN` is `generators.importers.IMPORTERS`'s to say.
_IMPORT_COMMON = {"split_seed": int, "max_scenes": int, "val_fraction": float, "test_fraction": float,
                  "image_size": int}
_IMPORT_OWN = {"top_n": int, "coding": str}
#: A dataset the generator renders: its config keys other than these go in `set`.
_GENERATE_KEYS = {"generator": str, "preset": str, "n_train": int, "n_val": int, "n_test": int, "seed": int,
                  "image_size": int, "set": dict}
_TOP_KEYS = {"name": str, "description": str, "folder": str, "threads": int, "private_cache": bool, "notes": str,
             "next": list, "datasets": dict, "evaluate": list, "leaderboard": dict}
_EVALUATE_KEYS = {"backbones": (list, dict), "datasets": list, "task": str, "layers": (str, int, list),
                  "tokens": (str, list), "probes": (str, list), "seeds": (int, list), "limit": int, "control": str,
                  "epochs": int, "exclude_background": bool, "unanchored": bool, "dtype": str, "device": str,
                  "interventions": dict}
_BACKBONE_KEYS = {"spec": str, "image_size": int, "mean": list, "std": list}
_LEADERBOARD_KEYS = {"layer": (str, int), "metrics": list}
SUFFIX = ".toml"


@dataclass(frozen=True)
class BackboneEntry:
    """One backbone of an evaluate block: the rows' `backbone` column (`name`), its spec, the
    input side and normalisation given in place of its own (None: its own), and its key path."""

    name: str
    spec: str
    image_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    key: str = field(default="", compare=False)  # where the study names it: `evaluate[1].backbones[2]`

    @property
    def model(self) -> Any:
        """The evaluator's `Model` of this entry (rows under `name`)."""
        from evaluators.runner.request import Model

        return Model(self.name, self.spec)

    @property
    def preprocessing(self) -> dict[str, Any]:
        return {k: v for k, v in (("image_size", self.image_size), ("mean", self.mean), ("std", self.std))
                if v is not None}


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset: rendered by a generator (`kind` "generate"), imported from a local copy
    ("import"), or an existing folder ("path"). Made ones live in the study's folder under `name`."""

    name: str
    kind: str
    generator: str | None = None
    preset: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    importer: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None  # "path": the folder; "import": the source folder (`src`)


@dataclass(frozen=True)
class EvaluateBlock:
    """One `[[evaluate]]` block: `bench evaluate`'s options, over several datasets and backbones."""

    index: int
    backbones: tuple[BackboneEntry, ...]
    datasets: tuple[str, ...]
    options: Mapping[str, Any]  # EvaluationRequest keywords: task, layers, tokens, probes, seeds, limit, ...
    interventions: Any = None  # its checked `interventions` table (`bench.studies.sweeps.Interventions`), or None

    @property
    def task(self) -> str:
        return self.options.get("task", DEFAULT_TASK)

    @property
    def key(self) -> str:
        return f"evaluate[{self.index}]"

    def groups(self) -> list[tuple[BackboneEntry, ...]]:
        """The block's backbones by input settings, in order (one request takes one set)."""
        groups: dict[tuple, list[BackboneEntry]] = {}
        for b in self.backbones:
            groups.setdefault(tuple(sorted(b.preprocessing.items())), []).append(b)
        return [tuple(g) for g in groups.values()]

    def request(self, backbones: Sequence[BackboneEntry], dataset: Path, **run: Any) -> Any:
        """The `EvaluationRequest` of `backbones` (one of `groups`) on `dataset`: the request `bench
        evaluate` makes of these options, checked when made. The study's checks, its plan (rows
        owed, cache estimate) and its run all ask this one request; `run` adds the run's settings."""
        from evaluators.runner.request import EvaluationRequest

        return EvaluationRequest([b.model for b in backbones], dataset, **self.options, **backbones[0].preprocessing,
                                 **run)


@dataclass(frozen=True)
class Study:
    """A checked study. `variables`: every `${VAR}` it reads, with the value used; `settings`:
    those its datasets read (a folder made with other settings holds other scenes); `unset`:
    variables left unresolved (a dry run only, where they print as written)."""

    name: str
    source: str  # the file, or `shipped:NAME`
    root: Path  # relative paths resolve from here
    datasets: Mapping[str, DatasetEntry]
    blocks: tuple[EvaluateBlock, ...]
    description: str = ""
    folder: str = ""
    threads: int | None = None
    private_cache: bool = False
    notes: str = ""
    next: tuple[str, ...] = ()
    leaderboard_layer: str | int = "best"
    leaderboard_metrics: tuple[str, ...] = ()
    variables: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    @property
    def backbones(self) -> dict[str, BackboneEntry]:
        """Every backbone of the study by name, in order of first appearance."""
        return {b.name: b for block in self.blocks for b in block.backbones}


def shipped_studies() -> dict[str, str]:
    """The studies that ship with the package: name -> its description (first line)."""
    out = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(SUFFIX):
            data = tomllib.loads(entry.read_text(encoding="utf-8"))
            out[entry.name[: -len(SUFFIX)]] = str(data.get("description", "")).strip().splitlines()[0]
    return out


def load_study(study: str | os.PathLike[str], variables: Mapping[str, str] | None = None, *,
               allow_unset: bool = False) -> Study:
    """The study at a path, or shipped under a name (`shipped_studies`), read and checked whole.

    `variables` fill `${VAR}` before the environment does; one the study never reads is refused
    (a typo would otherwise be silently ignored). `allow_unset` (a dry run) leaves a variable
    with neither a value nor a default as written instead of refusing the file."""
    text, source, root, name = _read(study)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BenchError(f"{source}: not valid TOML: {e}") from None
    check = Checker(source)
    given = {k: str(v) for k, v in (variables or {}).items()}
    resolver = Resolver(check, given, allow_unset)
    data = resolver.walk(data, "")
    unused = sorted(set(given) - resolver.read)
    if unused:
        uses = ", ".join(sorted(resolver.read)) or "none"
        raise BenchError(f"{source}: set: the study reads no variable {unused[0]} (it reads: {uses})")
    return _build(data, check, source, root, name, resolver)


def _read(study: str | os.PathLike[str]) -> tuple[str, str, Path, str]:
    """(text, source label, folder relative paths resolve from, default name) of a path or a shipped name."""
    path = Path(study)
    text_name = str(study)
    # a bare name is a path only where a file holds it: a folder of that name in the working
    # directory (`bench demo` run beside a folder `demo`) leaves it the shipped study's
    if path.suffix == SUFFIX or path.is_file() or os.sep in text_name or "/" in text_name:
        if not path.is_file():
            raise BenchError(f"study: no study file {path}" + ("" if path.suffix == SUFFIX else
                             f"; shipped studies: {', '.join(shipped_studies())}"))
        try:
            return path.read_text(encoding="utf-8"), str(path), path.resolve().parent, path.stem
        except (OSError, UnicodeDecodeError) as e:
            raise BenchError(f"study: cannot read {path}: {e}") from None
    shipped = resources.files(__package__) / f"{text_name}{SUFFIX}"
    if not shipped.is_file():
        close = difflib.get_close_matches(text_name, list(shipped_studies()), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"shipped: {', '.join(shipped_studies())}"
        raise BenchError(f"study: no study file or shipped study {text_name!r}; {hint}")
    return shipped.read_text(encoding="utf-8"), f"shipped:{text_name}", Path.cwd(), text_name


def _build(data: dict, check: Checker, source: str, root: Path, default_name: str, resolver: Resolver) -> Study:
    check.table(data, "", _TOP_KEYS, required=("datasets", "evaluate"))
    name = data.get("name", default_name)
    check.label(name, "name", "the study's name (it names its folder)")
    folder = data.get("folder", name)
    check.label(folder, "folder", "the study's folder (in the working directory, as the name is by default)")
    datasets = _datasets(data["datasets"], check, root)
    if not data["evaluate"]:
        raise check.fail("evaluate", "give at least one [[evaluate]] block")
    blocks = tuple(_block(b, i + 1, check, root, datasets) for i, b in enumerate(data["evaluate"]))
    _check_names(blocks, check)
    board = check.table(data.get("leaderboard", {}), "leaderboard", _LEADERBOARD_KEYS)
    metrics = tuple(check.items(board.get("metrics", []), "leaderboard.metrics", str))
    _check_metrics(metrics, blocks, check)
    if "layer" in board:
        _check_board_layer(board["layer"], check)
    threads = data.get("threads")
    if threads is not None:
        from evaluators.runner.threads import check_threads

        try:
            check_threads(threads)
        except BenchError as e:
            raise check.fail("threads", str(e).removeprefix("threads: ")) from None
    settings = {v: resolver.values.get(v, f"${{{v}}}") for v in sorted(resolver.by_key.get("datasets", ()))}
    return Study(name=name, source=source, root=root, datasets=datasets, blocks=blocks,
                 description=data.get("description", "").strip(), folder=folder, threads=threads,
                 private_cache=data.get("private_cache", False), notes=" ".join(data.get("notes", "").split()),
                 next=tuple(check.items(data.get("next", []), "next", str)),
                 leaderboard_layer=board.get("layer", "best"), leaderboard_metrics=metrics,
                 variables=dict(sorted(resolver.values.items())), settings=settings,
                 unset=tuple(sorted(resolver.unset)))


def _datasets(table: Any, check: Checker, root: Path) -> dict[str, DatasetEntry]:
    check.typed(table, "datasets", dict)
    if not table:
        raise check.fail("datasets", "name at least one dataset ([datasets.NAME])")
    out = {}
    for name, entry in table.items():
        key = f"datasets.{name}"
        check.label(name, "datasets", "a dataset name (it names a folder)")
        check.typed(entry, key, dict)
        kinds = [k for k in ("generator", "import", "path") if k in entry]
        if len(kinds) != 1:
            raise check.fail(key, "give exactly one of generator (render it), import (a local copy of real images) "
                                  f"or path (an existing dataset folder); got {', '.join(kinds) or 'none'}")
        out[name] = {"generator": _generated, "import": _imported, "path": _existing}[kinds[0]](
            name, entry, key, check, root)
    return out


def _generated(name: str, entry: dict, key: str, check: Checker, root: Path) -> DatasetEntry:
    from generators.base import build_config, get_generator

    check.table(entry, key, _GENERATE_KEYS)
    overrides = dict(check.table(entry.get("set", {}), f"{key}.set", AnyKey()))
    for k in ("n_train", "n_val", "n_test", "seed", "image_size"):
        if k in entry:
            if k in overrides:
                raise check.fail(f"{key}.set.{k}", f"given twice: as {key}.{k} and here; keep one")
            overrides[k] = entry[k]
    try:
        gen = get_generator(entry["generator"])
    except BenchError as e:
        raise check.fail(f"{key}.generator", str(e)) from None
    try:
        config = build_config(gen, entry.get("preset"), overrides)
        variants = gen.expand(config)
        if len(variants) != 1:
            raise BenchError(f"{gen.name} makes {len(variants)} datasets from these settings (a sweep); name each "
                             "setting as a dataset of its own")
        gen(config)
    except BenchError as e:
        raise check.fail(key, str(e)) from None
    return DatasetEntry(name, "generate", generator=gen.name, preset=entry.get("preset"), overrides=overrides)


def _imported(name: str, entry: dict, key: str, check: Checker, root: Path) -> DatasetEntry:
    from generators.importers import IMPORTERS

    importer = check.typed(entry["import"], f"{key}.import", str)
    if importer not in IMPORTERS:
        raise check.fail(f"{key}.import", f"unknown importer {importer!r}; allowed: {', '.join(IMPORTERS)}")
    own = {k: _IMPORT_OWN[k] for k in IMPORTERS[importer][1]}
    check.table(entry, key, {"import": str, "src": str, **_IMPORT_COMMON, **own}, required=("src",))
    options = {k: v for k, v in entry.items() if k not in ("import", "src")}
    return DatasetEntry(name, "import", importer=importer, options=options, path=resolve_path(entry["src"], root))


def _existing(name: str, entry: dict, key: str, check: Checker, root: Path) -> DatasetEntry:
    check.table(entry, key, {"path": str})
    path = resolve_path(entry["path"], root)
    if "${" not in entry["path"] and not (path / "dataset.json").is_file():
        raise check.fail(f"{key}.path", f"{path} holds no dataset (no dataset.json); make it with bench generate "
                                        "or bench import, or let the study make it (generator = ...)")
    return DatasetEntry(name, "path", path=path)


def _block(raw: Any, index: int, check: Checker, root: Path, datasets: Mapping[str, DatasetEntry]) -> EvaluateBlock:
    key = f"evaluate[{index}]"
    block = check.table(raw, key, _EVALUATE_KEYS, required=("backbones",))
    names = tuple(check.items(block.get("datasets", list(datasets)), f"{key}.datasets", str))
    for i, n in enumerate(names):
        if n not in datasets:
            raise check.fail(f"{key}.datasets[{i + 1}]", f"no dataset {n!r} in [datasets]; named: {', '.join(datasets)}")
    task = block.get("task", DEFAULT_TASK)
    options: dict[str, Any] = {k: v for k, v in block.items() if k not in ("backbones", "datasets", "interventions")}
    _check_names_in_registries(options, task, key, check)
    backbones = _backbones(block["backbones"], f"{key}.backbones", check, root)
    if "seeds" in options:
        options["seeds"] = tuple(check.items(options["seeds"], f"{key}.seeds", int))
    sweep = block_sweep(block.get("interventions"), backbones, names, key, check)  # bench.studies.sweeps
    block = EvaluateBlock(index, backbones, names, options, sweep)
    for group in block.groups():
        try:  # the evaluator's own checks of the request, on one that is never run
            block.request(group, Path("."))
        except BenchError as e:
            raise check.fail(key, str(e)) from None
    return block


def _check_names_in_registries(options: dict, task: str, key: str, check: Checker) -> None:
    """Task, probe families, tokens choices and control by name, each against its registry."""
    from evaluators.probes.families import TOKEN_CHOICES

    if task not in TASKS:
        raise check.fail(f"{key}.task", f"unknown task {task!r}; allowed: {', '.join(TASKS.names())}")
    entry = TASKS.get(task)
    registry = entry.probe_registry
    for name, reg in (("probes", registry), ("tokens", TOKEN_CHOICES)):
        if name not in options:
            continue
        values = check.items(options[name], f"{key}.{name}", str)
        values = [p.strip() for v in values for p in v.split(",")]
        for i, v in enumerate(values):
            if v not in reg:
                where = f"{key}.{name}[{i + 1}]" if isinstance(options[name], list) else f"{key}.{name}"
                raise check.fail(where, f"unknown {reg.kind} {v!r} for task {task}; allowed: {', '.join(reg.names())}")
        options[name] = tuple(values)
    if "control" in options and options["control"] not in entry.controls:
        raise check.fail(f"{key}.control", f"unknown control {options['control']!r} for task {task}; allowed: "
                                           f"{', '.join(entry.controls) or 'none'}")
    if "layers" in options and isinstance(options["layers"], list):
        options["layers"] = ",".join(str(v) for v in check.items(options["layers"], f"{key}.layers", (int, str)))
    elif "layers" in options:
        options["layers"] = str(options["layers"])
    if "layers" in options:
        from evaluators.cache.keys import parse_layers

        try:
            parse_layers(options["layers"], 10**6)  # the form; each backbone's depth is checked by the plan
        except BenchError as e:
            raise check.fail(f"{key}.layers", str(e)) from None


def _backbones(raw: Any, key: str, check: Checker, root: Path) -> tuple[BackboneEntry, ...]:
    """`["spec", "NAME=SPEC"]` or a table `NAME = "spec"` / `NAME = {spec = ..., image_size = ...}`."""
    from evaluators.runner.request import named_spec

    if isinstance(raw, list):
        entries = []
        for i, item in enumerate(raw):
            check.typed(item, f"{key}[{i + 1}]", str)
            try:
                model = named_spec(item)
            except BenchError as e:
                raise check.fail(f"{key}[{i + 1}]", str(e)) from None
            check.not_empty(model.spec, f"{key}[{i + 1}]")
            spec = spec_path(model.spec, root)
            entries.append((f"{key}[{i + 1}]", BackboneEntry(model.name if model.name != model.spec else spec, spec,
                                                             key=f"{key}[{i + 1}]")))
    else:
        entries = []
        for name, value in raw.items():
            where = f"{key}.{name}"
            if isinstance(value, str):
                value = {"spec": value}
            check.table(value, where, _BACKBONE_KEYS, required=("spec",))
            check.not_empty(value["spec"], f"{where}.spec")
            pre = {}
            for k in ("mean", "std"):
                if k in value:
                    pre[k] = tuple(check.items(value[k], f"{where}.{k}", (int, float)))
            entries.append((where, BackboneEntry(name, spec_path(value["spec"], root), value.get("image_size"),
                                                 pre.get("mean"), pre.get("std"), key=where)))
    if not entries:
        raise check.fail(key, "name at least one backbone")
    for where, entry in entries:
        _check_backbone(entry, where, check)
    return tuple(e for _, e in entries)


def _check_backbone(entry: BackboneEntry, key: str, check: Checker) -> None:
    from evaluators.backbones import backbone_metadata, check_loadable
    from evaluators.backbones.presets import checked_preprocessing

    try:
        checked_preprocessing(entry.image_size, entry.mean, entry.std)
        backbone_metadata(entry.spec)
        check_loadable(entry.spec)  # what it downloads, if anything, is the run's to check (a dry run needs no network)
    except BenchError as e:
        raise check.fail(key, str(e)) from None
    if entry.name != entry.spec:  # a spec written alone names its rows itself
        check.label(entry.name, key, "a backbone name")


def _check_names(blocks: tuple[EvaluateBlock, ...], check: Checker) -> None:
    """One name, one backbone: rows are keyed by the name, so two specs under it would mix."""
    seen: dict[str, tuple[BackboneEntry, str]] = {}
    for block in blocks:
        for i, b in enumerate(block.backbones):
            first = seen.setdefault(b.name, (b, block.key))
            if first[0] != b:
                raise check.fail(f"{block.key}.backbones", f"{b.name} names {b.spec} here and {first[0].spec} in "
                                                           f"{first[1]}; give them different names")


def _check_metrics(metrics: tuple[str, ...], blocks: tuple[EvaluateBlock, ...], check: Checker) -> None:
    from leaderboards.metrics import METRICS

    tasks = {b.task for b in blocks}
    for i, m in enumerate(metrics):
        if m not in METRICS:
            raise check.fail(f"leaderboard.metrics[{i + 1}]", f"unknown metric {m!r}; allowed: {', '.join(METRICS.names())}")
        if METRICS.get(m).task not in tasks:
            raise check.fail(f"leaderboard.metrics[{i + 1}]", f"{m} is a {METRICS.get(m).task} metric and no block "
                                                          "evaluates that task")


def _check_board_layer(layer: str | int, check: Checker) -> None:
    from leaderboards.board import parse_layer

    try:
        parse_layer(str(layer))
    except BenchError as e:
        raise check.fail("leaderboard.layer", str(e)) from None

