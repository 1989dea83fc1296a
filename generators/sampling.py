"""Exact uniform samplers for object codes.

The priors assume O is *uniform* within Ω(f); a biased sampler would silently make
every reported bit wrong. Rejection from the full grid is exact but hopeless when
coverage is tight (6 colours x 6 shapes with 6 objects accepts ~1 draw in 2,600;
7 x 7 with 7 objects ~1 in 17,000), so two-group grids use an exact row-by-row
dynamic programme over (covered columns, cells used) — `generators.priors.row_options`,
the same counts the exact autoregressive priors use. Counts are big integers and
choices use `random.Random.randrange`, which is exact for any size.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Collection, Sequence

from bench.core.errors import ConfigError
from generators.priors import coverage_count, row_options
from generators.splits import FCode, fcode_key, fcode_of_conjs

#: Rejection sampling (≥ 3 groups) is refused below this acceptance rate.
MIN_ACCEPTANCE = 1e-3


def choose_weighted(rng: random.Random, weights: Sequence[int]) -> int:
    """Index drawn with probability ∝ weights (non-negative big integers)."""
    r = rng.randrange(sum(weights))
    for i, w in enumerate(weights):
        if r < w:
            return i
        r -= w
    raise AssertionError("unreachable")


def covering_acceptance(a: tuple[int, ...], k: int) -> float:
    """Probability that a uniform k-subset of the a-grid covers every value."""
    return coverage_count(k, a) / math.comb(math.prod(a), k)


def sample_covering_cells(rng: random.Random, a: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """A uniform k-subset of the a_1 x ... x a_G grid that hits every value of every group.

    Cells are tuples of local value indices, sorted.
    """
    a = tuple(int(x) for x in a)
    if coverage_count(k, a) == 0:
        raise ValueError(f"no {k}-subset of a {a} grid covers every value")
    if len(a) == 1:
        return [(v,) for v in range(a[0])]
    if len(a) == 2:
        return _sample_two_groups(rng, a[0], a[1], k)
    return _sample_rejection(rng, a, k)


def _sample_two_groups(rng: random.Random, rows: int, cols: int, k: int) -> list[tuple[int, ...]]:
    covered: list[int] = []
    uncovered = list(range(cols))
    used = 0
    cells: list[tuple[int, ...]] = []
    for row in range(rows):
        options, weights = row_options(rows - row, cols, len(covered), used, k)
        t, u = options[choose_weighted(rng, weights)]
        new = rng.sample(uncovered, t)
        old = rng.sample(covered, u)
        cells += [(row, c) for c in new + old]
        covered += new
        uncovered = [c for c in uncovered if c not in new]
        used += t + u
    return sorted(cells)


def _sample_rejection(rng: random.Random, a: tuple[int, ...], k: int) -> list[tuple[int, ...]]:
    grid = math.prod(a)
    while True:
        flat = rng.sample(range(grid), k)
        cells = [_unravel(c, a) for c in flat]
        if all(len({c[g] for c in cells}) == a[g] for g in range(len(a))):
            return sorted(cells)


def _unravel(c: int, a: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for s in reversed(a):
        c, v = divmod(c, s)
        out.append(v)
    return tuple(reversed(out))


def check_object_range(min_objects: int, max_objects: int, n_conjunctions: int) -> None:
    """The `uniform` distribution's object counts: 1 <= min <= max <= distinct conjunctions."""
    if min_objects < 1:
        raise ConfigError("min_objects", f"must be ≥ 1, got {min_objects}")
    if max_objects < min_objects:
        raise ConfigError("max_objects", f"{max_objects} < min_objects={min_objects}")
    if max_objects > n_conjunctions:
        raise ConfigError("max_objects", f"{max_objects} exceeds the {n_conjunctions} distinct conjunctions")


def sample_uniform_objects(rng: random.Random, n_conjunctions: int, min_objects: int, max_objects: int,
                           conj_values: Callable[[int], Sequence[int]], n_groups: int,
                           support: Collection) -> tuple[list[int], FCode]:
    """O uniform over all codes with min..max objects, conditioned on F lying in `support`
    (a split's `fcode_key`s), by exact rejection: object count weighted by C(n, k), then a
    uniform k-subset of conjunctions, redrawn until its F code is in the split."""
    ks = list(range(min_objects, max_objects + 1))
    weights = [math.comb(n_conjunctions, k) for k in ks]
    while True:
        conjs = sorted(rng.sample(range(n_conjunctions), ks[choose_weighted(rng, weights)]))
        code = fcode_of_conjs([conj_values(x) for x in conjs], n_groups)
        if fcode_key(code) in support:
            return conjs, code

