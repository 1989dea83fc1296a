"""The task registry: what `bench evaluate --task` measures, one `Task` record per task (in the
spirit of MTEB's task metadata), read by every stage that once asked which task it had.

A task is wholly its record: the run, the request's checks, the summary table, the leaderboard's
metrics, the site's boards and the report's section all ask the record, never the name, so a
plugin task (entry-point group `bindingbench.tasks`) gets everything a built-in one gets. The
built-in records live in their own packages (`evaluators.tasks.binding.TASK`,
`evaluators.tasks.issameobject.TASK`, `evaluators.tasks.objective.TASK`); this module names them,
as strings, registers them in that order on first use, and imports no torch:
hooks are `module:function` strings imported when called (`bench.core.registry.load_ref`), as
probe families name their classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from bench.core.registry import Registry, load_ref

#: The task of a request that names none (`bench evaluate`, a study's `[[evaluate]]` block).
DEFAULT_TASK = "binding"


@dataclass(frozen=True)
class Metric:
    """A number a leaderboard can rank: a results column (`name`, with `name_lo`/`name_hi` for its
    interval), how tables title it, its task (set when its task is registered), unit ("%": ratios
    shown x100, or "bits") and direction; `screened` cells are ‡-checked (`metric_checks`)."""

    name: str
    label: str
    task: str = ""
    unit: str = "%"
    higher_is_better: bool = True
    screened: bool = False

    @property
    def paper(self) -> bool:
        """The paper's two-probe estimator (unanchored direct O- and F-probes)."""
        return self.name.endswith("_paper")


@dataclass(frozen=True)
class Task:
    """One task, all of it. Hooks are `module:function` strings (or the functions).

    Running: `runner(request, dataset, progress, on_skipped) -> Path | None` writes the run's rows;
    `ray_runner`, what it hands the work to under `--executor ray` (None: refused); `needs_codes`: it reads the
    dataset's F/O codes; `fills_also`: its runner extracts each backbone's layers and tokens as the
    request names them and fills the request's `also` selections from the same forward pass (a
    study's later blocks, `EvaluationRequest.also`). The request: `probes` names its probe registry (`module:REGISTRY`);
    `default_layers`, `default_probes` and `token_choices` (when none are named) fill what a
    request leaves out; `fixed_tokens`: the tokens cannot be chosen; `controls` the control
    nulls it takes; `check(request)` its own checks of a request (probe names, probe x tokens), and
    `request(request)` the fields of the request behind its rows' probe fingerprints; `hparams`:
    a family's default hyper-parameters join that fingerprint. Per backbone and layer:
    `check_backbone(backbone, probes)`, `backbone_notes(spec, backbone, layers, probes) -> lines`
    and `layer_probes(probes, layer, n_layers)` (the probes that run at a layer; all of them
    when None); `check_dataset(dataset, options)` a study's dataset check before any run.
    Showing: `summary` (help text), `title` (the report's heading), `summary_columns` (`--wide`, CSV, JSON), `short_metrics`
    (label, column) and `short_keys` (the row key columns) of the default table; `sensitivity`:
    its rows carry a probe's sensitivity (the `s %` column, the board's note). Ranking:
    `metrics` (the leaderboard's, the headline `metric` among them), `board_metrics` (the site's
    boards, the headline first); `per_scene`: its rows carry per-scene bits over test F codes, so
    cells pair (the site's matrices) and boards note each dataset's `n_F_eff`; `compare_metrics`:
    what `bench compare` reports of it by default (none: compare does not pair it), each paired on its
    rows' per-scene values (`scene_<metric>`, whose mean is the metric) unless `paired` names a hook
    for it: (metric, `hook(a_rows, b_rows) -> (difference, lo, hi) | None`) for a metric that is no
    mean over scenes (a ratio of sums), pairing two cells' rows (one per seed) on the same scenes;
    `report_section` fills its section of `bench report` (`leaderboards.report`), None: no section.
    """

    summary: str
    probes: str
    runner: Any
    metric: str
    metrics: tuple[Metric, ...]
    default_layers: str = "last"
    default_probes: tuple[str, ...] = ()
    token_choices: tuple[str, ...] = ("cls",)
    fixed_tokens: bool = False
    controls: tuple[str, ...] = ()
    needs_codes: bool = False
    fills_also: bool = False
    ray_runner: Any = None
    check: Any = None
    request: Any = None
    hparams: bool = False
    check_backbone: Any = None
    backbone_notes: Any = None
    layer_probes: Any = None
    check_dataset: Any = None
    split: str = "test"
    summary_columns: tuple[str, ...] = ()
    short_metrics: tuple[tuple[str, str], ...] = ()
    short_keys: tuple[str, ...] = ("backbone", "layer", "probe", "seed")
    sensitivity: bool = False
    board_metrics: tuple[str, ...] = ()
    compare_metrics: tuple[str, ...] = ()
    per_scene: bool = False
    paired: tuple[tuple[str, Any], ...] = ()
    title: str = ""
    report_section: Any = None

    @property
    def probe_registry(self) -> Registry[Any]:
        """The registry its probes are named in."""
        return load_ref(self.probes)

    def pairing(self, metric: str) -> Callable[..., Any] | None:
        """The hook `paired` names for `metric`, imported now; None when it pairs on `scene_<metric>`."""
        ref = dict(self.paired).get(metric)
        return None if ref is None else load_ref(ref)

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The hook `name` (an attribute naming a function), imported now; None when it has none."""
        ref = getattr(self, name)
        return None if ref is None else load_ref(ref)


#: The built-in tasks, in order: each name and where its own package keeps its record.
BUILTIN_TASKS = {"binding": "evaluators.tasks.binding:TASK", "issameobject": "evaluators.tasks.issameobject:TASK",
                 "objective": "evaluators.tasks.objective:TASK",
                 "segmentation": "evaluators.tasks.segmentation:TASK"}


def _register_builtins() -> None:
    for name, ref in BUILTIN_TASKS.items():
        TASKS.register(name, load_ref(ref))


TASKS: Registry[Task] = Registry("task", group="bindingbench.tasks", builtins=(_register_builtins,))

