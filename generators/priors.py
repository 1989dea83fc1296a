"""Exact entropy priors H(O), H(F), H(O|F) in bits (docs/explanation/architecture.md §1).

Everything is counted with Python big integers, never sampled: the priors are the
reference against which probe losses become "bits of binding", so an estimate here
would put its error straight into every reported number.

Notation: a scene's F code activates `a_g` values of group g. Ω(f) is the set of
object codes O consistent with f, and |Ω(f)| depends on f only through `a`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Iterable, Sequence

from bench.core.errors import BenchError


class PriorsUnavailable(BenchError):
    """A dataset card or generator does not say enough to rebuild its exact priors."""


@lru_cache(maxsize=None)
def coverage_count(k: int, a: tuple[int, ...]) -> int:
    """N_k(a): k-subsets of the a_1 x ... x a_G grid that hit every value of every group.

    Inclusion–exclusion over the values i_g left out of each group:
    N_k(a) = Σ_i (-1)^{Σ i_g} Π_g C(a_g, i_g) · C(Π_g (a_g - i_g), k).
    """
    if k < 0 or any(x < 0 for x in a):
        return 0
    total = 0
    for drop in itertools.product(*(range(x + 1) for x in a)):
        sign = -1 if sum(drop) % 2 else 1
        ways = math.prod(math.comb(x, i) for x, i in zip(a, drop))
        cells = math.prod(x - i for x, i in zip(a, drop))
        total += sign * ways * math.comb(cells, k)
    return total


def omega_size(a: Sequence[int], k_min: int, k_max: int) -> int:
    """|Ω(f)| for an F code with active counts `a` when min ≤ |O| ≤ max objects."""
    a = tuple(int(x) for x in a)
    return sum(coverage_count(k, a) for k in range(max(k_min, 0), k_max + 1))


@lru_cache(maxsize=None)
def grid_completions(rows_left: int, cols: int, covered: int, used: int, k: int) -> int:
    """Ways to fill `rows_left` non-empty rows of a 2-group grid with `cols` columns, `covered`
    of them already hit and `used` cells already chosen, so that every column ends covered
    with exactly k cells in all.

    The row-by-row dynamic programme shared by the exact sampler (generators.sampling) and the
    exact autoregressive priors (generators.conditionals): columns are exchangeable, so the
    state needs only how many are covered, never which.
    """
    if rows_left == 0:
        return int(covered == cols and used == k)
    return sum(row_options(rows_left, cols, covered, used, k)[1])


@lru_cache(maxsize=None)
def row_options(rows_left: int, cols: int, covered: int, used: int, k: int) -> tuple[list, list]:
    """Choices (new columns t, old columns u) for the next row, weighted by their completions:
    C(cols - covered, t) · C(covered, u) · grid_completions(the rows after it)."""
    options, weights = [], []
    for t in range(cols - covered + 1):
        for u in range(covered + 1):
            if t + u == 0 or used + t + u > k:
                continue
            w = math.comb(cols - covered, t) * math.comb(covered, u) * grid_completions(
                rows_left - 1, cols, covered + t, used + t + u, k
            )
            if w:
                options.append((t, u))
                weights.append(w)
    return options, weights


@dataclass(frozen=True)
class CoveringSets:
    """O given F: uniform over the subsets of f's active grid (any number of groups) with
    k_min ≤ |O| ≤ k_max conjunctions that hit every active value (`balanced`: k_min = k_max = n;
    `uniform`: the object range)."""

    k_min: int
    k_max: int


@dataclass(frozen=True)
class ListedSets:
    """O given F: uniform over those of the listed conjunction sets whose F is f (toys: the
    fixed core plus every distractor set; each set listed once)."""

    sets: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class SplitPriors:
    """A split's analytic priors; `max_F_mass` is the largest single-F probability and
    `n_F_eff` = 1 / Σ_f P(f)² the effective number of F codes (as many equally likely codes
    would have the same concentration): bootstrap intervals resample whole F codes, so it
    is their effective sample size."""

    n_F_codes: int
    H_O: float
    H_F: float
    H_O_given_F: float
    max_F_mass: float
    n_F_eff: float

    def to_dict(self) -> dict:
        return asdict(self)


def priors_from_counts(omega: Sequence[int], weight: Sequence[int]) -> SplitPriors:
    """Priors of a split whose F codes have |Ω(f)| = `omega` and P(f) ∝ `weight`.

    O is uniform within Ω(f) in every distribution we generate, so
    H(O|F) = Σ P(f) log2|Ω(f)| and H(O) = H(F) + H(O|F).
    """
    if not omega or len(omega) != len(weight):
        raise ValueError("a split needs at least one F code, with one weight per code")
    if any(w <= 0 for w in weight) or any(o <= 0 for o in omega):
        raise ValueError("every F code in a split must be reachable (|Ω(f)| > 0, P(f) > 0)")
    total = sum(weight)
    log_total = math.log2(total)
    h_f = 0.0
    h_o_f = 0.0
    for o, w in zip(omega, weight):
        p = w / total
        h_f -= p * (math.log2(w) - log_total)
        h_o_f += p * math.log2(o)
    return SplitPriors(
        n_F_codes=len(omega),
        H_O=h_f + h_o_f,
        H_F=h_f,
        H_O_given_F=h_o_f,
        max_F_mass=max(weight) / total,
        # exact: (Σw)² / Σw² on big integers, one correctly rounded division
        n_F_eff=total * total / sum(w * w for w in weight),
    )


def uniform_priors(active: Iterable[Sequence[int]], k_min: int, k_max: int) -> SplitPriors:
    """`uniform`: O uniform over all codes with k_min ≤ |O| ≤ k_max whose F is in the split.

    `active` lists the active counts `a` of every F code in the split.
    Then P(f) ∝ |Ω(f)| and H(O) = log2 Σ_f |Ω(f)|.
    """
    omega = [omega_size(a, k_min, k_max) for a in active]
    p = priors_from_counts(omega, omega)
    # H(O) is exactly log2 of the support size; say so without float round-off.
    return replace(p, H_O=math.log2(sum(omega)))


def balanced_priors(n_codes: int, a: Sequence[int], n_objects: int) -> SplitPriors:
    """`balanced`: F uniform over the split's `n_codes` codes, each activating `a` values;
    O uniform over the n-object subsets of that grid covering every active value."""
    omega = coverage_count(n_objects, tuple(int(x) for x in a))
    return priors_from_counts([omega] * n_codes, [1] * n_codes)
