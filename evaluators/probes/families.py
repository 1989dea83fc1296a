"""The registries of what `bench evaluate` reads and with what: binding probe families,
IsSameObject probes and tokens choices (bench/core/registry.py).

Kept free of torch so that help texts, validation and leaderboard column order can read
the names cheaply; a family names its class as `module:Class`, imported when a probe is
built. Plugins register more through the `bindingbench.binding_probes` and
`bindingbench.issameobject_probes` entry-point groups (the old `bindingbench.probes` still reaches
the binding families).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.core.errors import BenchError
from bench.core.registry import Registry, load_ref
from bench.core.tasks import TASKS


#: The hyper-parameters of `ProbeFamily.defaults` that set its optimiser (`ProbeOptim`), not its class.
OPTIM_KEYS = ("lr", "weight_decay", "ema")


@dataclass(frozen=True)
class ProbeOptim:
    """The AdamW settings a probe's gradient stage uses (`evaluators.fitting`), from its family's
    entry (`evaluators.probes.build.probe_optim`); carried on the job, never set on the module.

    `ema`: the decay of the moving average of the weights that validation scores and the fit
    keeps (None: the raw weights). Adam's noise at a rate high enough to learn quickly kept an
    attention probe's validation bits ~2x above what the averaged weights reach."""

    lr: float = 1e-2
    weight_decay: float = 1e-4
    ema: float | None = None
    #: the family's `ProbeFamily.device_batches`
    device_batches: bool = True
    #: the family's plateau rule and CPU batches (`ProbeFamily.patience`, `lr_patience`, `cpu_steps`)
    patience: int = 3
    lr_patience: int = 1
    cpu_steps: int = 16
    #: the family's `ProbeFamily.amp`
    amp: bool = True


@dataclass(frozen=True)
class ProbeFamily:
    """A binding probe family, all of it: its class (`module:Class` or the class), hyper-parameters
    and hooks. A plugin's entry gets everything a built-in's gets.

    `defaults`: hyper-parameters, recorded in every result row's config (see `BINDING_PROBES`):
    the class's constructor arguments, and `OPTIM_KEYS` for its optimiser (`ProbeOptim`).
    `spatial`: reads every token (`--tokens all`) instead of one pooled vector.
    `raw_lr`: its learning rate is not scaled down with the input width (`build.probe_lr`):
    its inputs pass through a learned encoder first, whose width, not the input's, sets the step.
    `conjunction_args`: a hook (`module:function` or the function) from the feature groups' sizes
    to the extra constructor arguments of its probes that predict O, whose bits are conjunctions
    of feature values (quadratic-shared's shared factors, attention's feature members).
    `warm_starts`: its other probes start from the token encoder its O|F-probe learned
    (`evaluators.fitting.warm_start_from`), and are fitted after it.
    `device_batches`: on CUDA its gradient stage takes batches sized for the device
    (`evaluators.fitting.auto_batch_size`); False keeps the CPU's: on an H200 the attention probe
    read β* 0.53 on pixels in batches of 500 rows, where batches of 32 read 0.915.
    `patience`, `lr_patience`: its gradient stage's plateau rule (`evaluators.fitting`), the epochs
    without a 0.001-bit improvement of the mean validation bits before a probe stops, and before its
    rate drops (`TrainConfig` overrides them for every family). `cpu_steps`: its optimiser steps per
    epoch on a CPU (`evaluators.fitting.auto_batch_size`). The pooled families start from the linear
    stage's solution and their best epochs lie within the first few (dinov2-small: 0–4), so 3 and 1
    at 16 steps read the β*, sensitivity and planted teachers' shares that 5 and 2 at 64 did, in a
    sixth of the steps; the attention probe learns for about 100 epochs in small steps, and at 3 and
    1 it stopped early (pixels: β* 0.875 at 64 steps, 0.845 at 32, where 5 and 2 at 64 read 0.915).
    `amp`: on CUDA its gradient stage and scoring run under bf16 autocast; False keeps float32: the
    attention probe read β* 0.885 on pixels under bf16 on an H200, where the same stacked fit in
    float32 (on a CPU) read 0.930 and the CPU's own 0.915."""

    cls: Any
    defaults: dict[str, Any] = field(default_factory=dict)
    spatial: bool = False
    raw_lr: bool = False
    conjunction_args: Any = None
    warm_starts: bool = False
    device_batches: bool = True
    patience: int = ProbeOptim.patience
    lr_patience: int = ProbeOptim.lr_patience
    cpu_steps: int = ProbeOptim.cpu_steps
    amp: bool = ProbeOptim.amp

    def probe_class(self) -> type:
        """The class, imported on first use when given as `module:Class`."""
        return load_ref(self.cls)

    def conjunction_kwargs(self, sizes: tuple[int, ...]) -> dict[str, Any]:
        """What `conjunction_args` gives for feature groups of these sizes (nothing without the hook)."""
        return {} if self.conjunction_args is None else dict(load_ref(self.conjunction_args)(sizes))



@dataclass(frozen=True)
class PairProbe:
    """An IsSameObject probe: `trained` on pairs, or a training-free baseline, and how it is made.

    A trained probe's `cls` (`module:Class` or the class) is built as cls(D, *its `config_args`
    read from `PairTrainConfig`); a baseline's `similarity` (`module:function` or the function)
    scores token pairs as f(x, y, qk), and a baseline without one predicts the majority class.
    `reads_qk`: the similarity needs the query/key projections of the block that reads the layer."""

    trained: bool
    note: str = ""
    cls: Any = None
    config_args: tuple[str, ...] = ()
    similarity: Any = None
    reads_qk: bool = False

    def probe_class(self) -> type:
        return load_ref(self.cls)

    def similarity_function(self) -> Any:
        return load_ref(self.similarity)


@dataclass(frozen=True)
class TokenChoice:
    """A tokens choice: one pooled vector per scene, or every token (`spatial`)."""

    spatial: bool = False


#: Each task's probes, a registry of their own with an entry-point group of their own; the binding
#: families' group before the split, `bindingbench.probes`, is still read (installed plugins keep working).
BINDING_PROBES: Registry[ProbeFamily] = Registry("probe", group=("bindingbench.binding_probes", "bindingbench.probes"))
ISSAMEOBJECT_PROBES: Registry[PairProbe] = Registry("probe", group="bindingbench.issameobject_probes")
TOKEN_CHOICES: Registry[TokenChoice] = Registry("tokens")

#: Default hyper-parameters per family. `lr` is the AdamW learning rate at input widths up
#: to `build.LR_WIDTH`; `build_probe` scales it down as sqrt(LR_WIDTH / in_dim) beyond (see
#: `probe_lr`). Chosen on planted teachers (benchmarks/planted_teacher.py, z = 64 and 1024,
#: 2,000 training scenes) and on copy tasks: the dnn overfits within an epoch or two at 1e-2
#: and ends closest to its teacher at 1e-3; the linear probe needs 3e-2 to grow the large
#: weights of near-deterministic (oracle) targets within the budget (1e-2 took 160 epochs on
#: a copy task), at +0.2 bit on a noisy teacher; the quadratic forms and attention do best at
#: 1e-2. `weight_decay` (AdamW, default 1e-4): quadratic-shared's bilinear colour x shape
#: factors fit spurious products within a few epochs; 0.1 holds them back (oracle:mix-0.25 β*
#: 0.21 -> 0.23 of a true 0.27, oracle:objects 0.97 -> 0.98, 2,000 scenes), where it would
#: stop the linear probe from growing the large weights oracle targets need.
BINDING_PROBES.register("linear", ProbeFamily("evaluators.probes.pooled:LinearProbe", {"lr": 3e-2}))
BINDING_PROBES.register("quadratic", ProbeFamily("evaluators.probes.pooled:QuadraticProbe", {"rank": 8, "lr": 1e-2}))
BINDING_PROBES.register("quadratic-shared", ProbeFamily("evaluators.probes.pooled:SharedQuadraticProbe",
                                                        {"rank": 8, "lr": 2e-2, "weight_decay": 0.1},
                                                        conjunction_args="evaluators.probes.pooled:shared_factors"))
BINDING_PROBES.register("dnn", ProbeFamily("evaluators.probes.pooled:MadeProbe", {"hidden": 256, "depth": 1, "lr": 1e-3}))
BINDING_PROBES.register("attention", ProbeFamily(
    "evaluators.probes.attention:AttentionProbe",
    {"heads": 2, "key_dim": 32, "rank": 8, "width": 256, "lr": 3e-3, "weight_decay": 0.05, "ema": 0.998},
    spatial=True, raw_lr=True, conjunction_args="evaluators.probes.attention:feature_members", warm_starts=True,
    device_batches=False, patience=5, lr_patience=2, cpu_steps=64, amp=False))

_SCORERS = "evaluators.tasks.issameobject.scorers"
ISSAMEOBJECT_PROBES.register("linear", PairProbe(trained=True, cls=f"{_SCORERS}:LinearPair"))
ISSAMEOBJECT_PROBES.register("diag-quadratic", PairProbe(trained=True, cls=f"{_SCORERS}:DiagQuadraticPair"))
ISSAMEOBJECT_PROBES.register("quadratic", PairProbe(trained=True, cls=f"{_SCORERS}:QuadraticPair",
                                                    config_args=("rank",)))
ISSAMEOBJECT_PROBES.register("pointwise-identity", PairProbe(trained=True, cls=f"{_SCORERS}:PointwiseIdentityPair",
                                                             config_args=("slots",)))
ISSAMEOBJECT_PROBES.register("cosine", PairProbe(trained=False, similarity=f"{_SCORERS}:cosine_similarity"))
ISSAMEOBJECT_PROBES.register("dot", PairProbe(trained=False, similarity=f"{_SCORERS}:dot_similarity"))
ISSAMEOBJECT_PROBES.register("attention-qk", PairProbe(trained=False, note="Hugging Face, timm or OpenCLIP ViTs",
                                                       similarity=f"{_SCORERS}:attention_qk_similarity", reads_qk=True))
ISSAMEOBJECT_PROBES.register("distance", PairProbe(trained=False, similarity=f"{_SCORERS}:distance_similarity"))
ISSAMEOBJECT_PROBES.register("majority", PairProbe(trained=False))

TOKEN_CHOICES.register("cls", TokenChoice())
TOKEN_CHOICES.register("mean", TokenChoice())
TOKEN_CHOICES.register("cls+mean", TokenChoice())
TOKEN_CHOICES.register("all", TokenChoice(spatial=True))


def family_defaults(family: str) -> dict[str, Any]:
    """A binding family's default hyper-parameters (a copy; unknown names are a BenchError)."""
    return dict(BINDING_PROBES.get(family).defaults)


def pair_probe_names(trained: bool) -> tuple[str, ...]:
    """The IsSameObject probes that are trained (True) or training-free baselines (False)."""
    return tuple(n for n, p in ISSAMEOBJECT_PROBES.items() if p.trained == trained)


def probes_help() -> str:
    """`bench evaluate --probes` help: every registered probe per task (its task's probe registry),
    with its notes, and the task's defaults."""
    def shown(name: str, entry: Any) -> str:
        note = getattr(entry, "note", "") or ("needs --tokens all" if getattr(entry, "spatial", False) else "")
        return f"{name} ({note})" if note else name

    return "Probe families. " + " ".join(
        f"{name}: {', '.join(shown(n, e) for n, e in task.probe_registry.items())} [{','.join(task.default_probes)}]."
        for name, task in TASKS.items())


def tokens_help() -> str:
    """`bench evaluate --tokens` help: every registered tokens choice, and each task's default."""
    defaults = "; ".join(f"{name}: {','.join(task.token_choices)}" for name, task in TASKS.items())
    return f"Tokens choices: {', '.join(TOKEN_CHOICES.names())} (repeatable or comma-separated) [{defaults}]."


def tokens_filter_help() -> str:
    """The leaderboard's `--tokens` help: every registered tokens choice."""
    return f"Only these tokens choices (repeatable): {', '.join(TOKEN_CHOICES.names())}."


def check_family(family: str, tokens: str) -> None:
    """Reject an unknown family, or a family that cannot read the given tokens."""
    spatial = BINDING_PROBES.get(family).spatial
    tokens_spatial = TOKEN_CHOICES.get(tokens).spatial
    if spatial and not tokens_spatial:
        raise BenchError(
            f"probe: {family!r} needs spatial tokens (--tokens all); tokens {tokens!r} has none"
        )
    if not spatial and tokens_spatial:
        readers = [n for n, f in BINDING_PROBES.items() if f.spatial]
        pooled = [n for n, v in TOKEN_CHOICES.items() if not v.spatial]
        raise BenchError(
            f"probe: {family!r} reads one pooled vector per scene; tokens {tokens!r} is spatial "
            f"(use {', '.join(readers)} for it, or --tokens {'/'.join(pooled)})"
        )
