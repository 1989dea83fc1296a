"""Planning a run before any work: every backbone resolved and checked against the task, tokens
and families, the rows it still owes, the probe fingerprints that key them, and the cache's growth
checked against free disk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.hashing import config_hash
from bench.core.results import existing_keys, row_key
from bench.core.tasks import TASKS
from evaluators.backbones.info import BackboneInfo, cls_is_mean
from evaluators.cache.keys import parse_layers, split_fingerprint
from evaluators.runner.request import EvaluationRequest, Model
from evaluators.probes.families import family_defaults
from evaluators.tasks.binding.task import SPLITS, open_dataset

#: Part of every probe fingerprint: raise it when a change to the probes, their training or the
#: metrics changes the numbers a request gives, so rows measured before are measured again.
PROBE_CODE_VERSION = 17


def effective_limit(ds: Dataset, limit: int | None) -> int | None:
    """`limit`, or None when it cuts no split (a run on whole splits, whatever was asked)."""
    if limit is None or all(limit >= ds.num_rows(s) for s in SPLITS):
        return None
    return limit


def build_backbone(model: Model, preprocessing: Mapping[str, object] | None = None) -> Any:
    """The one place a run makes a model's backbone, with the request's `preprocessing` in place of
    the model's own: the driver when it plans (`backbone_plans`) and every Ray worker that runs
    a request's units (`evaluators.runner.ray_executor`) make it the same way."""
    return model.resolve(**(preprocessing or {}))


def planned_model(model: Model, preprocessing: Mapping[str, object] | None = None) -> Any:
    """`build_backbone`'s backbone as a plan holds it: where an earlier build of the same spec and
    options was recorded (`evaluators.backbones.recorded`), its record, whose model is built only
    when it runs, so a run on a warm activation cache builds none."""
    if model.backbone is not None:
        return model.backbone
    from evaluators.backbones.recorded import planned_backbone

    return planned_backbone(model.spec, preprocessing or {}, lambda: build_backbone(model, preprocessing))


@dataclass(frozen=True)
class Work:
    """Rows one backbone still owes at one (layer, tokens, seed): one per family in `families`."""

    layer: int
    tokens: str
    seed: int
    families: list[str]


@dataclass
class BackbonePlan:
    """One backbone of an `EvaluationRequest`: resolved and checked before any backbone extracts
    anything, with the rows it still owes (`todo`). `aliases` maps a tokens choice to others that are the same vector
    on this backbone (on built-in backbones the class token is the mean patch token): their
    rows are copies of that choice's, trained once."""

    spec: str
    backbone: Any
    layers: list[int]
    token_choices: list[str]
    todo: list[Work]
    skipped: int
    aliases: dict[str, list[str]]
    probe_fps: dict[str, str]
    name: str  # the `backbone` column: the display name of `-m NAME=SPEC`, else the spec
    model: Model  # what `backbone` was made from (`build_backbone`), for Ray workers to make it again
    preprocessing: Mapping[str, object] | None = None
    #: Other (layers, tokens) its extraction fills from the same forward pass (`EvaluationRequest.also`).
    also: list[tuple[list[int], list[str]]] = field(default_factory=list)

    @property
    def selections(self) -> list[tuple[list[int], list[str]]]:
        """What its extraction fills, each once: its own layers and tokens first, then `also`."""
        return list({(tuple(layers), tuple(tokens)): (layers, tokens)
                     for layers, tokens in [(self.layers, self.token_choices), *self.also]}.values())

    def shown(self, tokens: str) -> list[str]:
        return [tokens, *self.aliases.get(tokens, [])]

    def stamp(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` with the probe fingerprint of their probe (part of the key, as `backbone_plans` keyed them)."""
        return [{**r, "probe_fingerprint": self.probe_fps[r["probe"]]} for r in rows]


def probe_fingerprints(task: str, families: Sequence[str], probe_request: dict[str, Any]) -> dict[str, str]:
    """Per probe family, a hash of its settings as requested (`probe_request`: training, dtype, the
    task's options) with the family's defaults and `PROBE_CODE_VERSION`. The settings a
    validation sweep then picks are an outcome, not a request, so they stay out: a re-run
    of the same request is skipped, a changed request or probe code is measured again."""
    hparams = TASKS.get(task).hparams
    return {family: config_hash({"task": task, "probe": family, "hparams": family_defaults(family) if hparams else None,
                                 "code": PROBE_CODE_VERSION, **probe_request}) for family in families}


def request_fingerprints(request: EvaluationRequest) -> dict[str, str]:
    """The probe fingerprints of a request's families (`probe_fingerprints` of its `probe_request`)."""
    return probe_fingerprints(request.task, request.families, request.probe_request())


def view_aliases(info: BackboneInfo, token_choices: Sequence[str]) -> dict[str, list[str]]:
    """Views that are the same vector on a backbone as another asked for: on a ground-truth one
    (`cls_is_mean`) `mean` is `cls`, so its probes are trained once and the rows written under both."""
    return {"cls": ["mean"]} if cls_is_mean(info) and {"cls", "mean"} <= set(token_choices) else {}


def trained_views(info: BackboneInfo, token_choices: Sequence[str]) -> list[str]:
    """The views of `token_choices` whose probes are trained (and extracted): all but aliases (`view_aliases`)."""
    aliases = view_aliases(info, token_choices)
    return [v for v in token_choices if not any(v in a for a in aliases.values())]


@dataclass(frozen=True)
class Owed:
    """What one backbone of a request owes on one dataset: the layers asked for, the views trained
    (an alias's rows are copies, `view_aliases`), the row sets still owed (`todo`), how many family
    fits (`skipped`) and rows (`held`) the results already hold, and the rows asked for (`rows`)."""

    layers: list[int]
    token_choices: list[str]
    aliases: dict[str, list[str]]
    todo: list[Work]
    skipped: int
    held: int
    rows: int


def rows_owed(request: EvaluationRequest, name: str, info: BackboneInfo, *, dataset: str, test_fp: str,
              limit: int | None, done: set[tuple], probe_fps: Mapping[str, str]) -> Owed:
    """The rows backbone `name` (its `info`: layers, family, weights fingerprint) owes for `request` on
    the dataset `dataset` (`test_fp` and `limit`: `effective_limit`'s), keyed by `row_key` against
    `done`. `bench evaluate` asks with a loaded backbone's info, a study with the registry's metadata
    (`backbone_metadata`), so both plan the same rows. A layer request the backbone cannot meet
    raises `parse_layers`'s BenchError (the caller names the backbone)."""
    layers = parse_layers(request.layer_request, info.n_layers)
    aliases, trained = view_aliases(info, request.token_choices), trained_views(info, request.token_choices)
    fixed = {"backbone": name, "dataset": dataset, "dataset_fingerprint": test_fp, "limit": limit,
             "control": request.control, "split": TASKS.get(request.task).split, "task": request.task,
             "weights_fingerprint": info.revision}
    layer_probes = TASKS.get(request.task).hook("layer_probes")
    todo, skipped, held, rows = [], 0, 0, 0
    for layer in layers:
        here = layer_probes(request.families, layer, info.n_layers) if layer_probes else list(request.families)
        for tokens in trained:
            for seed in request.seeds:
                have = {f: [row_key({**fixed, "layer": layer, "tokens": v, "probe": f, "seed": seed,
                                     "probe_fingerprint": probe_fps[f]}) in done
                            for v in [tokens, *aliases.get(tokens, [])]]
                        for f in here}
                owed = [f for f in here if not all(have[f])]
                skipped += len(here) - len(owed)
                held += sum(sum(h) for h in have.values())
                rows += sum(len(h) for h in have.values())
                if owed:
                    todo.append(Work(layer, tokens, seed, owed))
    return Owed(layers, trained, aliases, todo, skipped, held, rows)


def held_by_metadata(request: EvaluationRequest, dataset: str, *, test_fp: str, limit: int | None,
                     done: set[tuple]) -> int | None:
    """The family fits the results already hold when no model of `request` owes a row, planned from
    the registry's metadata alone (`backbone_metadata`: layers and weights fingerprint, as a study
    plans); None when one owes a row or only loading it tells (an object, a `py:` file, a refused or
    unknown spec: the run then builds its backbones and plans, or refuses, in its own words). A run
    with nothing to do ends on this without importing model code, and writes nothing."""
    from evaluators.backbones import backbone_metadata

    skipped, probe_fps = 0, request_fingerprints(request)
    for model in request.models:
        try:
            info = None if model.backbone is not None else backbone_metadata(model.spec)
            owed = None if info is None else rows_owed(request, model.name, info, dataset=dataset, test_fp=test_fp,
                                                       limit=limit, done=done, probe_fps=probe_fps)
        except BenchError:
            return None
        if owed is None or owed.todo or not owed.skipped:  # nothing planned at all: the backbone's checks say why
            return None
        skipped += owed.skipped
    return skipped


def metadata_bytes(info: BackboneInfo, side: int, rows: int, layers: Sequence[int],
                   token_choices: Sequence[str]) -> int:
    """The cache bytes `rows` scenes of a backbone known by its metadata alone take at input `side`
    (`entry_bytes`, as `bench evaluate` counts them; an oracle's width, its dataset's code length,
    is taken as 64: small either way)."""
    from evaluators.cache.extract import entry_bytes

    grid = (side // info.patch_size,) * 2 if info.patch_size else None
    return entry_bytes(rows, layers, token_choices, info.width or 64, grid)


def held_rows(request: EvaluationRequest, ds: Dataset | None = None) -> int | None:
    """The family fits the request's results folder already holds when it owes no row, planned from
    the registry's metadata without loading a model (`held_by_metadata`); None when it owes one,
    or only loading a model tells. `ds`: the request's dataset, where the caller opened it."""
    ds = ds if ds is not None else open_dataset(request.dataset)
    limit = effective_limit(ds, request.limit)
    return held_by_metadata(request, ds.name, test_fp=split_fingerprint(ds, "test", limit), limit=limit,
                            done=existing_keys(request.results_dir))


def backbone_plans(request: EvaluationRequest, ds: Dataset, *, done: set[tuple], test_fp: str, limit: int | None,
                   progress: bool) -> list[BackbonePlan]:
    """Resolve every backbone of `request` and check it against the task, tokens and probes, so that a bad
    combination fails in seconds instead of after another backbone's extraction and training.
    Notes are said once every backbone has passed, so a refusal is the only line a bad run prints."""
    from evaluators.cache.extract import check_tokens

    plans, notes = [], []
    probe_fps, preprocessing = request_fingerprints(request), request.preprocessing
    entry = TASKS.get(request.task)
    check_backbone, backbone_notes = entry.hook("check_backbone"), entry.hook("backbone_notes")
    for model in request.models:
        name, spec = model.name, model.spec
        backbone = planned_model(model, preprocessing).bind(ds)
        if check_backbone is not None:
            check_backbone(backbone, request.families)
        check_tokens(backbone, ds, "test", request.token_choices)
        try:
            owed = rows_owed(request, name, backbone.info, dataset=ds.name, test_fp=test_fp, limit=limit, done=done,
                             probe_fps=probe_fps)
        except BenchError as e:  # name the backbone: a run may mix deep ones and layer-less references
            hint = "; it has no layers: evaluate it in a run without --layers" if not backbone.info.n_layers else ""
            raise BenchError(f"{e} (backbone {spec}{hint})") from None
        if owed.aliases:
            notes.append(f"{spec}: its class token is the mean patch token, so cls and mean are the same vector; "
                         "probes are trained once and the rows written under both")
        if backbone_notes is not None:
            notes += backbone_notes(spec, backbone, owed.layers, request.families)
        plans.append(BackbonePlan(spec, backbone, owed.layers, owed.token_choices, owed.todo, owed.skipped,
                                  owed.aliases, probe_fps, name, model, preprocessing,
                                  also_selections(request, name, backbone.info)))
    for note in notes:
        say(progress, note)
    return plans


def also_selections(request: EvaluationRequest, name: str, info: BackboneInfo) -> list[tuple[list[int], list[str]]]:
    """The (layers, tokens) of `request.also` for model `name`, resolved as its own are (`rows_owed`):
    the entries the runs that ask for them will look up. One this backbone cannot meet is left out: the
    run that asks for it refuses it in its own words."""
    out = []
    for named, layers, tokens in request.also:
        if named == name:
            try:
                out.append((parse_layers(layers, info.n_layers), trained_views(info, tokens)))
            except BenchError:
                continue
    return out


def check_cache(plans: Sequence[BackbonePlan], ds: Dataset, dtype: str, limit: int | None, progress: bool,
                 on_skipped: Callable[[int], None] | None) -> None:
    """Before any work: report rows already done, estimate how much the activation cache will
    grow and refuse a run the disk cannot hold (warning when all tokens of all layers are kept)."""
    from evaluators.cache.extract import check_cache_space, gib, pending_bytes

    skipped = sum(p.skipped for p in plans)
    if skipped and on_skipped is not None:
        on_skipped(skipped)
    needed = 0
    for p in plans:
        if not p.todo:
            continue
        size = sum(pending_bytes(p.backbone, ds, s, layers=layers, token_choices=tokens, dtype=dtype, limit=limit)
                   for s in SPLITS for layers, tokens in p.selections)
        if "all" in p.token_choices and len(p.layers) > 1 and size:
            say(progress, f"warning: --tokens all over {len(p.layers)} layers of {p.spec} stores every patch token "
                           f"of every layer: ~{gib(size)} of activations cache")
        needed += size
    check_cache_space(needed, say=lambda text: say(progress, text))


def say(enabled: bool, text: str) -> None:
    """One line on stderr beside the progress bars (nothing when progress is off)."""
    if enabled:
        from bench.core.console import stderr

        stderr.print(text, soft_wrap=True, markup=False, highlight=False)
