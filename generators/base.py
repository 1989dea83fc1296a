"""What every scene generator provides, and the registry that names them.

A generator is a class registered with `@register_generator`, in the spirit of
timm's `register_model`: the CLI lists and builds generators by name, and worker
processes rebuild them from (name, config) without pickling renderers.
"""

from __future__ import annotations

import dataclasses
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import pyarrow as pa

from bench.core.codes import FeatureSpace
from bench.core.dataset import Scene
from bench.core.errors import ConfigError
from bench.core.registry import Registry
from bench.core.resources import PIXEL_BYTES
from generators.priors import CoveringSets, ListedSets, PriorsUnavailable, SplitPriors
from generators.splits import FCode, active_counts, assign_splits


@dataclass
class CommonConfig:
    """Parameters every generator shares: split sizes, seeds, F-split policy, output layout."""

    n_train: int = 1000
    n_val: int = 200
    n_test: int = 200
    seed: int = 0
    image_size: int = 256
    #: fraction of F codes in val and test (train gets the rest); the paper's balanced set: 522/131/131 of 784.
    val_fraction: float = 1 / 6
    test_fraction: float = 1 / 6
    #: salt of the hash that ranks F codes into splits.
    salt: str = "bindingbench"
    #: rank F codes within strata of equal active-value counts (so that every split holds every complexity).
    stratify: bool = True
    #: drop the F code with every value active (it can carry a large share of the mass).
    exclude_full_f: bool = False
    shard_size: int = 1000

    def validate_common(self) -> None:
        for name in ("n_train", "n_val", "n_test"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be ≥ 0, got {getattr(self, name)}")
        if self.n_train + self.n_val + self.n_test == 0:
            raise ConfigError("n_train", "all split sizes are 0: nothing to generate")
        if self.image_size <= 0:
            raise ConfigError("image_size", f"must be > 0, got {self.image_size}")
        if self.shard_size <= 0:
            raise ConfigError("shard_size", f"must be > 0, got {self.shard_size}")
        if self.seed < 0:
            raise ConfigError("seed", f"must be ≥ 0, got {self.seed}")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ConfigError(name, f"must be in [0, 1), got {v}")
        if self.val_fraction + self.test_fraction >= 1:
            raise ConfigError("test_fraction", "val_fraction + test_fraction must be < 1 (train needs F codes)")

    @property
    def split_sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


@dataclass
class SplitPlan:
    """What a split draws from: its F codes (generator-specific form) and their priors."""

    n: int
    priors: SplitPriors
    codes: list = field(default_factory=list)


def plan_splits(config: CommonConfig, codes: list, sizes: tuple[int, ...],
                priors_of: "typing.Callable[[list], SplitPriors]") -> dict[str, SplitPlan]:
    """Assign F codes to disjoint splits and give every non-empty split its priors.

    Every generator splits the same way (hash-ranked, optionally stratified, the full-F
    code optionally excluded); only the F-code support and the prior formula differ.
    """
    if config.exclude_full_f:
        codes = [f for f in codes if active_counts(f) != sizes]
    assigned = assign_splits(codes, config.val_fraction, config.test_fraction, config.salt, config.stratify)
    plans = {}
    for split, n in config.split_sizes.items():
        if n == 0:
            continue
        if not assigned[split]:
            param = "val_fraction" if split == "train" else f"{split}_fraction"
            raise ConfigError(param, f"split {split!r} gets no F codes ({len(codes)} in all); change the fractions")
        plans[split] = SplitPlan(n=n, priors=priors_of(assigned[split]), codes=assigned[split])
    return plans


class SceneGenerator(ABC):
    """A scene distribution with exact priors and a renderer."""

    name: ClassVar[str]
    version: ClassVar[str]
    description: ClassVar[str]
    config_cls: ClassVar[type[CommonConfig]]
    presets: ClassVar[dict[str, dict[str, Any]]]
    default_preset: ClassVar[str]
    #: extra per-object and per-scene columns beyond the core schema.
    object_fields: ClassVar[dict[str, pa.DataType]] = {}
    scene_fields: ClassVar[dict[str, pa.DataType]] = {}

    def __init__(self, config: CommonConfig) -> None:
        self.config = config
        config.validate_common()
        self.validate()
        self.feature_space = self.build_feature_space()
        self.plans: dict[str, SplitPlan] = self.plan()

    @abstractmethod
    def validate(self) -> None:
        """Raise ConfigError naming the parameter for any impossible configuration."""

    @abstractmethod
    def build_feature_space(self) -> FeatureSpace: ...

    @abstractmethod
    def plan(self) -> dict[str, SplitPlan]:
        """Assign F codes to splits and compute each split's exact priors."""

    @abstractmethod
    def render(self, split: str, index: int, seed: int) -> tuple[Scene, float]:
        """Draw and render one scene from its own seed; return it with H(O|F=f)."""

    @classmethod
    def render_bytes(cls, config: CommonConfig) -> int:
        """The least memory one scene of `config` takes while it is rendered (a lower bound, so
        that a size it refuses cannot work): its image and mask."""
        return config.image_size ** 2 * PIXEL_BYTES

    @classmethod
    def expand(cls, config: CommonConfig) -> list[tuple[str, CommonConfig]]:
        """Sweeps write one dataset per setting: (subdirectory, config) pairs; '' = no sweep."""
        return [("", config)]

    # -- the distribution, for exact autoregressive priors (generators.conditionals) -----------
    def f_support(self, split: str) -> list[tuple[FCode, int]]:
        """The split's F codes with exact integer weights, P(f) ∝ weight."""
        raise PriorsUnavailable(f"generator: {self.name} does not describe its F distribution; "
                                "evaluate its datasets with --unanchored")

    def o_given_f(self) -> CoveringSets | ListedSets:
        """How O is distributed given F (uniform within Ω(f) in every generator here)."""
        raise PriorsUnavailable(f"generator: {self.name} does not describe its O-given-F distribution; "
                                "evaluate its datasets with --unanchored")

    def summarize(self, split: str, table: pa.Table) -> dict[str, Any]:
        """Extra per-split statistics for the card, from the written rows."""
        return {}

    summary_columns: ClassVar[tuple[str, ...]] = ()


#: Generators by name: the built-in ones register when their modules are imported (on first
#: use), plugins' through the `bindingbench.generators` entry-point group.
GENERATORS: Registry[type[SceneGenerator]] = Registry(
    "generator", group="bindingbench.generators",
    builtins=("generators.colorshape", "generators.clevr", "generators.toys"))


def register_generator(cls: type[SceneGenerator]) -> type[SceneGenerator]:
    """Class decorator: make a generator available by its `name`."""
    return GENERATORS.register(cls.name, cls)


def list_generators() -> list[str]:
    return sorted(GENERATORS.names())


def get_generator(name: str) -> type[SceneGenerator]:
    return GENERATORS.get(name)


def build_config(gen: type[SceneGenerator], preset: str | None, overrides: dict[str, Any]) -> CommonConfig:
    """A generator's config from a preset plus overrides (strings from the CLI are coerced)."""
    preset = gen.default_preset if preset is None else preset
    if preset not in gen.presets:  # "" too: an empty --preset is a mistake, not the default
        raise ConfigError("preset", f"unknown {preset!r} for {gen.name}; available: {', '.join(gen.presets)}")
    values = dict(gen.presets[preset])
    known = {f.name: f for f in fields(gen.config_cls)}
    for key, raw in overrides.items():
        if key not in known:
            raise ConfigError(key, f"unknown parameter for {gen.name}; allowed: {', '.join(sorted(known))}")
        values[key] = coerce(key, raw, known[key].type, gen.config_cls)
    return gen.config_cls(**values)


def coerce(name: str, raw: Any, annotation: Any, owner: type) -> Any:
    """Turn a CLI string into the field's type (int, float, bool, str, tuples of those)."""
    if not isinstance(raw, str):
        return raw
    hints = typing.get_type_hints(owner)
    tp = hints.get(name, annotation)
    try:
        if typing.get_origin(tp) is tuple:
            (inner, *_rest) = typing.get_args(tp)
            parts = [p.strip() for p in raw.split(",") if p.strip()]
            return tuple(_scalar(inner, p) for p in parts)
        return _scalar(tp, raw)
    except ValueError:
        raise ConfigError(name, f"cannot read {raw!r} as {getattr(tp, '__name__', tp)}") from None


def _scalar(tp: Any, raw: str) -> Any:
    if tp is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(raw)
    if tp in (int, float, str):
        return tp(raw)
    raise ValueError(raw)


def config_to_dict(config: CommonConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)
