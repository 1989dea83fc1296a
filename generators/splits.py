"""F codes and their assignment to splits.

Splits are disjoint in F (train, val and test), so a probe is always tested on
feature combinations it never saw. F codes are ranked by a salted hash; ranking
within strata of equal active-value counts keeps every split's mix of scene
complexities alike.

An F code is represented here as a tuple, per group, of the active value indices.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

from bench.core.errors import ConfigError
from bench.core.hashing import sha256_hex

FCode = tuple[tuple[int, ...], ...]

#: Above this many F codes, enumeration (and so exact priors) is refused.
MAX_F_CODES = 2_000_000


def fcode_key(code: FCode) -> str:
    """Stable text of an F code, e.g. '0,2,5;1,3'."""
    return ";".join(",".join(str(v) for v in g) for g in code)


def active_counts(code: FCode) -> tuple[int, ...]:
    return tuple(len(g) for g in code)


def fcode_of_conjs(conj_values: Sequence[Sequence[int]], n_groups: int) -> FCode:
    """The F code set by a list of conjunctions (each a tuple of value indices)."""
    return tuple(tuple(sorted({c[g] for c in conj_values})) for g in range(n_groups))


def fcodes_exact(sizes: Sequence[int], counts: Sequence[int]) -> list[FCode]:
    """All F codes with exactly counts[g] active values in group g (the `balanced` support)."""
    n = math.prod(math.comb(s, c) for s, c in zip(sizes, counts))
    _check_count(n)
    return [tuple(code) for code in itertools.product(*(itertools.combinations(range(s), c) for s, c in zip(sizes, counts)))]


def fcodes_feasible(sizes: Sequence[int], reachable: Callable[[tuple[int, ...]], bool]) -> list[FCode]:
    """All F codes with ≥1 active value per group whose active counts are reachable."""
    _check_count(math.prod(2**s - 1 for s in sizes))
    per_group = [
        [c for r in range(1, s + 1) for c in itertools.combinations(range(s), r)] for s in sizes
    ]
    return [code for code in itertools.product(*per_group) if reachable(active_counts(code))]


def _check_count(n: int) -> None:
    if n > MAX_F_CODES:
        raise ConfigError(
            "feature_space", f"{n} possible F codes exceed the {MAX_F_CODES} that exact priors enumerate; use smaller vocabularies"
        )


def assign_splits(
    codes: Sequence[FCode],
    val_fraction: float,
    test_fraction: float,
    salt: str,
    stratify: bool = True,
) -> dict[str, list[FCode]]:
    """Rank codes by salted hash and cut them train | val | test, per stratum if asked.

    Per group of n codes, val and test get round(n * fraction) each (half rounds up)
    and train the rest; a stratum too small to share stays in train.
    """
    strata: dict[tuple[int, ...], list[FCode]] = {}
    for code in codes:
        strata.setdefault(active_counts(code) if stratify else (), []).append(code)
    out: dict[str, list[FCode]] = {"train": [], "val": [], "test": []}
    for key in sorted(strata):
        ranked = sorted(strata[key], key=lambda c: sha256_hex(salt, fcode_key(c)))
        n = len(ranked)
        n_val = math.floor(n * val_fraction + 0.5)
        n_test = math.floor(n * test_fraction + 0.5)
        if n_val + n_test >= n:  # too small to share: keep train non-empty
            n_val = n_test = 0
        out["train"] += ranked[: n - n_val - n_test]
        out["val"] += ranked[n - n_val - n_test : n - n_test]
        out["test"] += ranked[n - n_test :]
    return out
