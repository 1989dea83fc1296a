"""The object-code samplers are exactly uniform within Ω(f) (priors assume it)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from scipy.stats import chisquare

from generators.priors import coverage_count
from generators.sampling import choose_weighted, covering_acceptance, sample_covering_cells


def _all_covering(a, k):
    cells = list(itertools.product(*(range(x) for x in a)))
    return [s for s in itertools.combinations(cells, k) if all(len({c[g] for c in s}) == a[g] for g in range(len(a)))]


@pytest.mark.parametrize("a, k", [((3, 3), 3), ((3, 3), 4), ((2, 4), 5), ((3, 2), 3), ((2, 2, 2), 2), ((2, 2, 2), 3)])
def test_covering_sampler_is_uniform(a, k):
    support = _all_covering(a, k)
    assert len(support) == coverage_count(k, a)
    rng = random.Random(1234)
    n = 200 * len(support)
    counts = Counter(tuple(sample_covering_cells(rng, a, k)) for _ in range(n))
    assert set(counts) <= set(support)  # only covering subsets, each sorted and distinct
    observed = [counts[tuple(s)] for s in support]
    assert min(observed) > 0
    assert chisquare(observed).pvalue > 1e-3


def test_tight_coverage_is_fast_and_valid():
    """7 colours x 7 shapes with 7 objects: a permutation, where rejection would need ~17,000 draws."""
    assert covering_acceptance((7, 7), 7) < 1e-4
    rng = random.Random(0)
    for _ in range(200):
        cells = sample_covering_cells(rng, (7, 7), 7)
        assert sorted(r for r, _ in cells) == list(range(7))
        assert sorted(c for _, c in cells) == list(range(7))


def test_impossible_coverage_raises():
    with pytest.raises(ValueError):
        sample_covering_cells(random.Random(0), (3, 3), 2)


def test_choose_weighted_big_integers():
    rng = random.Random(5)
    big = 10**40
    draws = Counter(choose_weighted(rng, [big, 3 * big, 0]) for _ in range(8000))
    assert draws[2] == 0
    assert 0.22 < draws[0] / 8000 < 0.28
