"""The registries of what `bench evaluate` reads and with what: binding probe families,
IsSameObject probes and token views (bench/core/registry.py).

Kept free of torch so that help texts, validation and leaderboard column order can read
the names cheaply; a family names its class as `module:Class`, imported when a probe is
built. Plugins register more through the `bindingbench.probes` entry-point group.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from bench.core.registry import Registry


@dataclass(frozen=True)
class ProbeFamily:
    """A binding probe family: its class (`module:Class` or the class) and defaults.

    `spatial`: reads every token (`--tokens all`) instead of one pooled vector.
    `raw_lr`: its learning rate is not scaled down with the input width (`probes.probe_lr`):
    its inputs pass through a learned encoder first, whose width, not the input's, sets the step.
    `defaults`: hyper-parameters, recorded in every result row's config (see `BINDING_PROBES`)."""

    cls: Any
    defaults: dict[str, Any] = field(default_factory=dict)
    spatial: bool = False
    raw_lr: bool = False

    def probe_class(self) -> type:
        """The class, imported on first use when given as `module:Class`."""
        if not isinstance(self.cls, str):
            return self.cls
        module, _, name = self.cls.partition(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class PairProbe:
    """An IsSameObject probe: `trained` on pairs, or a training-free baseline."""

    trained: bool
    note: str = ""


@dataclass(frozen=True)
class TokenView:
    """A token view: one pooled vector per scene, or every token (`spatial`)."""

    spatial: bool = False


BINDING_PROBES: Registry[ProbeFamily] = Registry("probe", group="bindingbench.probes")
PAIR_PROBES: Registry[PairProbe] = Registry("probe", group="bindingbench.probes")
TOKEN_VIEWS: Registry[TokenView] = Registry("tokens")

#: Default hyper-parameters per family. `lr` is the AdamW learning rate at input widths up
#: to `probes.LR_WIDTH`; `build_probe` scales it down as sqrt(LR_WIDTH / in_dim) beyond (see
#: `probe_lr`). Chosen on planted teachers (benchmarks/planted_teacher.py, z = 64 and 1024,
#: 2,000 training scenes) and on copy tasks: the dnn overfits within an epoch or two at 1e-2
#: and ends closest to its teacher at 1e-3; the linear probe needs 3e-2 to grow the large
#: weights of near-deterministic (oracle) targets within the budget (1e-2 took 160 epochs on
#: a copy task), at +0.2 bit on a noisy teacher; the quadratic forms and attention do best at
#: 1e-2. `weight_decay` (AdamW, default 1e-4): quadratic-shared's bilinear colour x shape
#: factors fit spurious products within a few epochs; 0.1 holds them back (oracle:mix-0.25 β*
#: 0.21 -> 0.23 of a true 0.27, oracle:objects 0.97 -> 0.98, 2,000 scenes), where it would
#: stop the linear probe from growing the large weights oracle targets need.
BINDING_PROBES.register("linear", ProbeFamily("evaluators.probes:LinearProbe", {"lr": 3e-2}))
BINDING_PROBES.register("quadratic", ProbeFamily("evaluators.probes:QuadraticProbe", {"rank": 8, "lr": 1e-2}))
BINDING_PROBES.register("quadratic-shared", ProbeFamily("evaluators.probes:SharedQuadraticProbe",
                                                        {"rank": 8, "lr": 2e-2, "weight_decay": 0.1}))
BINDING_PROBES.register("dnn", ProbeFamily("evaluators.probes:MadeProbe", {"hidden": 256, "depth": 1, "lr": 1e-3}))
BINDING_PROBES.register("attention", ProbeFamily(
    "evaluators.probes:AttentionProbe",
    {"heads": 2, "key_dim": 32, "rank": 8, "width": 256, "lr": 3e-3, "weight_decay": 0.05, "ema": 0.998},
    spatial=True, raw_lr=True))

PAIR_PROBES.register("linear", PairProbe(trained=True))
PAIR_PROBES.register("diag-quadratic", PairProbe(trained=True))
PAIR_PROBES.register("quadratic", PairProbe(trained=True))
PAIR_PROBES.register("pointwise-identity", PairProbe(trained=True))
PAIR_PROBES.register("cosine", PairProbe(trained=False))
PAIR_PROBES.register("dot", PairProbe(trained=False))
PAIR_PROBES.register("attention-qk", PairProbe(trained=False, note="Hugging Face, timm or OpenCLIP ViTs"))
PAIR_PROBES.register("distance", PairProbe(trained=False))
PAIR_PROBES.register("majority", PairProbe(trained=False))

TOKEN_VIEWS.register("cls", TokenView())
TOKEN_VIEWS.register("mean", TokenView())
TOKEN_VIEWS.register("cls+mean", TokenView())
TOKEN_VIEWS.register("all", TokenView(spatial=True))


#: Per task, the probes evaluated when none are named.
DEFAULT_PROBES = {"binding": ("linear", "quadratic", "dnn"), "issameobject": ("linear", "diag-quadratic", "quadratic")}


def family_defaults(family: str) -> dict[str, Any]:
    """A binding family's default hyper-parameters (a copy; unknown names are a BenchError)."""
    return dict(BINDING_PROBES.get(family).defaults)


def pair_probe_names(trained: bool) -> tuple[str, ...]:
    """The IsSameObject probes that are trained (True) or training-free baselines (False)."""
    return tuple(n for n, p in PAIR_PROBES.items() if p.trained == trained)


def probes_help() -> str:
    """`bench evaluate --probes` help: every registered probe per task, with its notes and the defaults."""
    binding = [f"{n} (needs --tokens all)" if f.spatial else n for n, f in BINDING_PROBES.items()]
    pair = [f"{n} ({p.note})" if p.note else n for n, p in PAIR_PROBES.items()]
    return (f"Probe families. binding: {', '.join(binding)} [{','.join(DEFAULT_PROBES['binding'])}]. "
            f"issameobject: {', '.join(pair)} [{','.join(DEFAULT_PROBES['issameobject'])}].")


def tokens_help() -> str:
    """`bench evaluate --tokens` help: every registered token view."""
    return (f"Token views: {', '.join(TOKEN_VIEWS.names())} (repeatable or comma-separated) "
            "[binding: cls; issameobject: all].")


def tokens_filter_help() -> str:
    """The leaderboard's `--tokens` help: every registered token view."""
    return f"Only these token views (repeatable): {', '.join(TOKEN_VIEWS.names())}."
