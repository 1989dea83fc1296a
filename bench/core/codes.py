"""Scene codes: the feature code F and the object code O (docs/explanation/architecture.md §1).

A scene is a set of objects, each a conjunction of one value per feature group.
O is multi-hot over all conjunctions (mixed radix, first group most significant);
F is multi-hot over all feature values (group-major). F is a function of O, which
is what makes "binding information" H(O|F) well defined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from bench.core.errors import ConfigError


@dataclass(frozen=True)
class FeatureSpace:
    """An ordered list of feature groups, each an ordered list of value names."""

    groups: tuple[tuple[str, tuple[str, ...]], ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("feature_space", "needs at least one feature group")
        names = [g for g, _ in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError("feature_space", f"duplicate group names in {names}")
        for name, values in self.groups:
            if len(values) == 0:
                raise ConfigError(name, "empty vocabulary: a feature group needs at least one value")
            if len(set(values)) != len(values):
                raise ConfigError(name, f"duplicate values in {list(values)}")

    @classmethod
    def of(cls, groups: Sequence[tuple[str, Sequence[str]]]) -> "FeatureSpace":
        """Build from any sequence of (group name, values) pairs."""
        return cls(tuple((str(g), tuple(str(v) for v in vs)) for g, vs in groups))

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSpace":
        """Inverse of `to_dict` (the dataset card's `feature_space`)."""
        return cls.of([(g["name"], g["values"]) for g in d["groups"]])

    def to_dict(self) -> dict:
        return {"groups": [{"name": g, "values": list(vs)} for g, vs in self.groups]}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g for g, _ in self.groups)

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(vs) for _, vs in self.groups)

    @cached_property
    def n_features(self) -> int:
        """Length of F: the total number of feature values."""
        return sum(self.sizes)

    @cached_property
    def n_conjunctions(self) -> int:
        """Length of O: the number of distinct object kinds."""
        return math.prod(self.sizes)

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """Index in F of each group's first value."""
        out, acc = [], 0
        for s in self.sizes:
            out.append(acc)
            acc += s
        return tuple(out)

    def conj_id(self, values: Sequence[int]) -> int:
        """Conjunction id of one value index per group (first group most significant)."""
        if len(values) != len(self.sizes):
            raise ConfigError("conjunction", f"expected {len(self.sizes)} values, got {len(values)}")
        c = 0
        for v, s, name in zip(values, self.sizes, self.names):
            if not 0 <= v < s:
                raise ConfigError(name, f"value index {v} out of range 0..{s - 1}")
            c = c * s + int(v)
        return c

    def conj_values(self, conj: int) -> tuple[int, ...]:
        """Value index per group of a conjunction id (inverse of `conj_id`)."""
        if not 0 <= conj < self.n_conjunctions:
            raise ConfigError("conjunction", f"id {conj} out of range 0..{self.n_conjunctions - 1}")
        out = []
        for s in reversed(self.sizes):
            conj, v = divmod(conj, s)
            out.append(v)
        return tuple(reversed(out))

    def conj_names(self, conj: int) -> tuple[str, ...]:
        """Value names per group of a conjunction id, e.g. ("red", "circle")."""
        if not 0 <= conj < self.n_conjunctions:
            raise ConfigError("conjunction", f"id {conj} out of range 0..{self.n_conjunctions - 1}")
        return self._names_table[conj]

    @cached_property
    def _names_table(self) -> tuple[tuple[str, ...], ...]:
        return tuple(
            tuple(vs[v] for (_, vs), v in zip(self.groups, self.conj_values(c))) for c in range(self.n_conjunctions)
        )

    def value_index(self, group: str, value: str) -> int:
        """Index of a named value inside its group; bad names raise a one-line error."""
        for name, values in self.groups:
            if name == group:
                if value not in values:
                    raise ConfigError(group, f"unknown value {value!r}; allowed: {', '.join(values)}")
                return values.index(value)
        raise ConfigError("group", f"unknown group {group!r}; allowed: {', '.join(self.names)}")

    @cached_property
    def conj_to_feature(self) -> np.ndarray:
        """Boolean matrix (n_conjunctions x n_features): which F bits each conjunction sets."""
        m = np.zeros((self.n_conjunctions, self.n_features), dtype=bool)
        for c in range(self.n_conjunctions):
            for off, v in zip(self.offsets, self.conj_values(c)):
                m[c, off + v] = True
        return m

    def encode_o(self, conjs: Iterable[int]) -> np.ndarray:
        """Multi-hot O (uint8) of a collection of conjunction ids."""
        o = np.zeros(self.n_conjunctions, dtype=np.uint8)
        for c in conjs:
            if not 0 <= c < self.n_conjunctions:
                raise ConfigError("conjunction", f"id {c} out of range 0..{self.n_conjunctions - 1}")
            o[c] = 1
        return o

    def o_to_f(self, o: np.ndarray) -> np.ndarray:
        """F from O; works on one code (n_conj,) or a batch (N, n_conj)."""
        o = np.asarray(o)
        if o.shape[-1] != self.n_conjunctions:
            raise ConfigError("O", f"last axis must have length {self.n_conjunctions}, got {o.shape[-1]}")
        return ((o.astype(np.int32) @ self.conj_to_feature.astype(np.int32)) > 0).astype(np.uint8)

    def active_counts(self, f: np.ndarray) -> tuple[int, ...]:
        """Number of active values per group of one F code: the `a` of the balanced distribution."""
        f = np.asarray(f)
        return tuple(int(f[off : off + s].sum()) for off, s in zip(self.offsets, self.sizes))

    def f_key(self, f: np.ndarray) -> str:
        """Stable text form of an F code ('0110|1010'), used for hashing and display."""
        f = np.asarray(f).astype(np.uint8)
        return "|".join(
            "".join(str(int(b)) for b in f[off : off + s]) for off, s in zip(self.offsets, self.sizes)
        )
