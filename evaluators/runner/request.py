"""What one evaluation run is asked to do, as one typed, frozen value.

`EvaluationRequest` gathers everything `bench evaluate`, `bench.api.evaluate`, `bench demo` and
the Ray path ask of a run (models, dataset, task, layers, tokens, probes, seeds, training and
execution settings), checks it when it is made, and is what `evaluators.runner.run.run_evaluation`
takes. Every caller builds the same value, so they all run the same code on the same request;
a bad request fails here, in one line, before a dataset is opened or a backbone loaded.

A model is a spec string (as `bench models` lists them), `NAME=SPEC` (rows show NAME), or a
backbone object (`evaluators.backbones.base.Backbone`), e.g. a user's own; see `model_of`.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field, replace
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence, Union

from bench.core.errors import BenchError
from bench.core.labels import check_label
from bench.core.paths import output_path
from bench.core.tasks import DEFAULT_TASK, TASKS, Task
from evaluators.backbones.info import BackboneInfo
from evaluators.backbones.presets import checked_preprocessing
from evaluators.cache.keys import check_device, check_dtype, parse_tokens
from evaluators.runner.threads import check_threads

if TYPE_CHECKING:  # model code (torch) loads when a model is built, so that making a request stays cheap
    from evaluators.backbones.base import Backbone
    from evaluators.backbones.module_adapter import ModuleAdapter
    from evaluators.probes.training import TrainConfig

#: More probe seeds than this is a typo (each seed trains every probe again).
MAX_SEEDS = 1000


@dataclass(frozen=True)
class Model:
    """One model of a run: `name` fills the rows' `backbone` column (and their key), `spec` the
    `spec` column; `backbone` is the object itself when one was given (a spec string is
    resolved when the run starts, so a request stays cheap to make)."""

    name: str
    spec: str
    backbone: Backbone | None = field(default=None, compare=False)

    def resolve(self, **preprocessing: object) -> Backbone:
        """The backbone to run: the object given, or the one the spec names, with the request's
        `preprocessing` overrides (`EvaluationRequest.preprocessing`) in place of its own."""
        from evaluators.backbones import resolve_backbone

        return self.backbone if self.backbone is not None else resolve_backbone(self.spec, **preprocessing)


ModelInput = Union[str, "Backbone", "ModuleAdapter", Model]


def _object_types() -> tuple[type, ...]:
    """`ModuleAdapter` and `Backbone`, as far as they are loaded: an object of either exists only once
    its module is imported, so a request of spec strings imports no model code (and no torch)."""
    found = (getattr(sys.modules.get("evaluators.backbones.module_adapter"), "ModuleAdapter", None),
             getattr(sys.modules.get("evaluators.backbones.base"), "Backbone", None))
    return tuple(t for t in found if t is not None)


def named_spec(model: str) -> Model:
    """The model of a spec argument: `NAME=SPEC` names a spec for tables (the `backbone`
    column; the spec keeps its own column), so a long path or a zoo card reads as `mine`.
    What comes before the first `=` is a NAME unless it holds `/`, `:` or `\\` (then the whole
    argument is a spec: a path or hub id that contains `=`); a NAME is a label
    (`bench.core.labels`), refused in one line otherwise."""
    name, sep, spec = model.partition("=")
    if not sep or any(c in name for c in "/:\\"):
        return Model(model, model)
    check_label(name, "model: the NAME of NAME=SPEC")
    if not spec:
        raise BenchError(f"model: {model!r} names no spec; use NAME=SPEC, e.g. mine=oracle:objects")
    return Model(name, spec)


def model_of(item: ModelInput, name: str | None = None) -> Model:
    """The model of one argument: a spec string (or `NAME=SPEC`), a `Model`, a backbone object,
    or a `ModuleAdapter` (a plain module; its spec is `module:<class name>`).

    A backbone object is shown under `name`, else its `display_name` attribute, else its
    `info.spec`. Its weights fingerprint (the rows' `weights_fingerprint`, part of their key,
    and of its activation cache entries) is the object's own `info.revision` when it states
    one, as every built-in backbone does; when `info.revision` is empty it is `sha256:` of
    the state dict of the object (if it is a `torch.nn.Module`) or of its `model` attribute,
    so editing the weights measures the model again."""
    if isinstance(item, Model):
        return item if name is None else replace(item, name=check_label(name, "model: a display name"))
    if isinstance(item, str):
        return named_spec(item) if name is None else Model(check_label(name, "model: a display name"), item)
    from evaluators.backbones.base import Backbone
    from evaluators.backbones.module_adapter import ModuleAdapter

    if isinstance(item, ModuleAdapter):  # a plain module: its adapter says where its blocks and tokens are
        item = item.backbone(f"module:{type(item.module).__name__}")
    if not isinstance(item, Backbone):
        raise BenchError(f"model: expected a spec string, a Backbone or a ModuleAdapter, got {type(item).__name__}")
    info = getattr(item, "info", None)
    if not isinstance(info, BackboneInfo):
        raise BenchError(f"model: {type(item).__name__} has no `info` (a BackboneInfo); a Backbone must set one")
    if not info.revision:
        item = _fingerprinted(item, info)
    shown = name if name is not None else getattr(item, "display_name", None)
    return Model(info.spec if shown is None else check_label(shown, "model: a display name"), info.spec, item)


def _fingerprinted(backbone: Backbone, info: BackboneInfo) -> Backbone:
    """A shallow copy of `backbone` whose `info.revision` is `sha256:` of its weights."""
    import torch

    from evaluators.backbones.weights import state_dict_hash

    module = backbone if isinstance(backbone, torch.nn.Module) else getattr(backbone, "model", None)
    if not isinstance(module, torch.nn.Module):
        raise BenchError(f"model: {info.spec} states no weights fingerprint (info.revision is empty) and has no "
                         "torch module (a `model` attribute) to hash; set info.revision")
    out = copy.copy(backbone)  # the caller's object keeps its own info
    out.info = replace(info, revision=f"sha256:{state_dict_hash(module)[:12]}")
    return out


def models_of(models: ModelInput | Sequence[ModelInput] | Mapping[str, str | Backbone | ModuleAdapter]
              ) -> tuple[Model, ...]:
    """The models of a run, from one model, a sequence of them, or a mapping name -> model;
    the same model twice counts once, two different models under one name are refused."""
    if isinstance(models, Mapping):
        items = [model_of(m, name) for name, m in models.items()]
    elif isinstance(models, (str, Model, *_object_types())):
        items = [model_of(models)]
    else:
        items = [model_of(m) for m in models]
    out: dict[str, Model] = {}
    for m in items:
        seen = out.setdefault(m.name, m)
        if seen != m or seen.backbone is not m.backbone:
            raise BenchError(f"model: two models are named {m.name} ({seen.spec}, {m.spec}); name them apart "
                             "with NAME=SPEC")
    return tuple(out.values())


@dataclass(frozen=True)
class EvaluationRequest:
    """One evaluation run's request, checked when made (a bad one raises BenchError, one line).

    `models`: spec strings, `NAME=SPEC`, backbone objects or `Model`s, or a mapping name ->
    spec or object (stored as a tuple of `Model`). `seeds`: one or more probe seeds in [0, 2^32)
    (each trained once). `layers`, `probes` and `tokens` None take the
    task's defaults (its `Task` record, bench/core/tasks.py: `default_layers`, `default_probes`,
    `views`). `limit` keeps only the first rows of every split, in
    extraction and training (the rows then carry it and the fingerprint of the evaluated
    rows, so they never pass for a full evaluation). `train` overrides the binding training
    defaults (epochs and seed still come from `epochs` and `seeds`); `exclude_background`
    drops issameobject pairs that involve background patches; `unanchored` evaluates a
    dataset without exact priors; `control` (one of the task's `controls`) evaluates a control
    null instead of the real O. `executor` "ray" runs the same units as Ray tasks (on the
    cluster at `address`, `gpus_per_task` GPUs a task); `threads`: torch threads of the
    in-process work (None: the usable cores other work leaves free); `memory_budget`: the host
    bytes a binding fit may hold of activation rows at once (`TrainConfig.memory_budget`; None:
    half of the available memory). `command`, the command
    line that asked for the run, goes into every row's provenance. `image_size`, `mean` and
    `std` (R, G, B) replace the input side and normalisation of every spec given (as
    `resolve_backbone` does; a source without them refuses in one line), e.g. for a
    `save_pretrained` folder without preprocessor_config.json; Ray workers build each backbone
    with them as the driver does (`planning.build_backbone`). `also`: (model name, layers, tokens)
    selections that a model's extraction fills beside its own, from the same forward pass, for
    the runs that read them next (a study's later blocks, `bench.studies.runner`): cache entries,
    no rows; a task whose runner does (`Task.fills_also`), in this process.
    """

    models: tuple[Model, ...]
    dataset: Path
    task: str = DEFAULT_TASK
    layers: str | tuple[int, ...] | None = None
    tokens: tuple[str, ...] | None = None
    probes: tuple[str, ...] | None = None
    seeds: tuple[int, ...] = (0,)
    device: str = "auto"
    dtype: str = "fp32"
    epochs: int | None = None
    limit: int | None = None
    results_dir: Path = Path("results")
    overwrite: bool = False
    train: TrainConfig | None = None
    exclude_background: bool = False
    unanchored: bool = False
    control: str | None = None
    executor: str = "local"
    address: str | None = None
    gpus_per_task: float | None = None
    threads: int | None = None
    memory_budget: int | None = None
    command: str | None = None
    image_size: int | None = None
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    also: tuple[tuple[str, str | tuple[int, ...], tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        # frozen: the normalised values are set once, here, through object.__setattr__
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("results_dir", output_path(self.results_dir, "results"))  # refused before any model is resolved
        put("models", models_of(self.models))
        put("dataset", Path(self.dataset))
        if isinstance(self.layers, Sequence) and not isinstance(self.layers, str):
            put("layers", tuple(self.layers))
        for name in ("tokens", "probes"):  # a string is a comma-separated list, as on the command line
            value = getattr(self, name)
            if value is not None:
                put(name, tuple(p.strip() for p in value.split(",")) if isinstance(value, str) else tuple(value))
        seeds = (self.seeds,) if isinstance(self.seeds, Integral) else tuple(self.seeds)
        if not all(isinstance(s, Integral) and not isinstance(s, bool) for s in seeds):
            raise BenchError(f"seeds: expected integers, got {', '.join(map(str, seeds))}")
        put("seeds", tuple(int(s) for s in seeds))
        for name, value in checked_preprocessing(self.image_size, self.mean, self.std).items():
            put(name, value)  # checked (one line on a bad value) and normalised: an int, tuples of 3 floats
        put("also", tuple((name, layers if isinstance(layers, str) else tuple(layers), tuple(parse_tokens(tokens)))
                          for name, layers, tokens in self.also))
        self._check()
        put("seeds", tuple(dict.fromkeys(self.seeds)))  # each seed once, in order

    def _check(self) -> None:
        task = TASKS.get(self.task)  # an unknown task is one line listing the tasks
        controls = tuple(dict.fromkeys(c for _, t in TASKS.items() for c in t.controls))
        if self.control is not None and self.control not in controls:
            raise BenchError(f"control: unknown {self.control!r}; allowed: {', '.join(controls)}")
        if self.control is not None and self.control not in task.controls:
            raise BenchError(f"control: {self.control} is no control of --task {self.task}; its controls: "
                             f"{', '.join(task.controls) or 'none'}")
        if self.executor == "local" and (self.address is not None or self.gpus_per_task is not None):
            raise BenchError("executor: --address and --gpus-per-task need --executor ray")
        objects = [m.name for m in self.models if m.backbone is not None]
        if self.executor == "ray" and objects:
            raise BenchError(f"executor: Ray workers build each backbone from its spec, and {objects[0]} is a Python "
                             "object; evaluate it with the local executor")
        if self.preprocessing and objects:
            raise BenchError(f"{', '.join(self.preprocessing)}: {objects[0]} is a Python object with its own input "
                             "settings (set them on it, e.g. ModuleAdapter(image_size=..., mean=..., std=...))")
        check_dtype(self.dtype)
        check_device(self.device)
        if not self.models:
            raise BenchError("model: give at least one backbone")
        if not self.families:
            raise BenchError("probes: give at least one probe family")
        if (task.fixed_tokens and self.tokens is not None
                and list(parse_tokens(self.tokens)) != list(task.token_choices)):
            raise BenchError(f"tokens: {self.task} reads {', '.join(task.token_choices)} only; use --tokens "
                             f"{','.join(task.token_choices)}, got {', '.join(self.tokens)}")
        task.probe_registry.check(self.families)
        if task.check is not None:
            task.hook("check")(self)
        if not self.seeds or not all(0 <= s < 2**32 for s in self.seeds) or len(self.seeds) > MAX_SEEDS:
            raise BenchError(f"seeds: 1 to {MAX_SEEDS} integers in [0, 2^32), got "
                             f"{', '.join(map(str, self.seeds)) or 'none'}")
        for name in ("epochs", "limit", "memory_budget"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BenchError(f"{name}: must be ≥ 1, got {value}")
        if self.threads is not None:
            check_threads(self.threads)
        if self.also:
            self._check_also(task)

    def _check_also(self, task: Task) -> None:
        """`also` names models of this request, for a task whose runner fills it, in this process."""
        if not task.fills_also:
            raise BenchError(f"also: the {self.task} task's runner extracts its own selections only")
        if self.executor != "local":
            raise BenchError("also: other selections are filled in this process; use --executor local")
        names = {m.name for m in self.models}
        for name, _, _ in self.also:
            if name not in names:
                raise BenchError(f"also: {name} is no model of this request ({', '.join(sorted(names))})")

    @property
    def preprocessing(self) -> dict[str, object]:
        """The input side and normalisation given in place of every spec's own (only those given):
        each spec is resolved with them, and they join the rows' request fingerprint, so a
        changed one is measured again."""
        return {k: v for k, v in (("image_size", self.image_size), ("mean", self.mean), ("std", self.std))
                if v is not None}

    @property
    def layer_request(self) -> str | tuple[int, ...]:
        """The layers asked for, the task's default when none were named."""
        return TASKS.get(self.task).default_layers if self.layers is None else self.layers

    @property
    def families(self) -> list[str]:
        """The probe families asked for (each once, in order), the task's default when none were named."""
        return list(dict.fromkeys(TASKS.get(self.task).default_probes if self.probes is None else self.probes))

    @property
    def token_choices(self) -> list[str]:
        """The tokens choices: the task's own (`Task.token_choices`) unless named, or always when it fixes them."""
        task = TASKS.get(self.task)
        return parse_tokens(task.token_choices if self.tokens is None or task.fixed_tokens else self.tokens)

    def probe_request(self) -> dict[str, object]:
        """The request behind every row's probe fingerprint (`evaluators.runner.planning.probe_fingerprints`):
        the training settings asked for (device, seed and stack size aside: they do not change what
        is asked), dtype and the task's options, with the preprocessing given in place of the
        models' own. A study plans which rows already exist from it without loading a model."""
        preprocessing = ({"preprocessing": {k: list(v) if isinstance(v, tuple) else v
                                            for k, v in self.preprocessing.items()}} if self.preprocessing else {})
        task = TASKS.get(self.task)
        return {**(task.hook("request")(self) if task.request is not None else {}), "dtype": self.dtype,
                **preprocessing}
