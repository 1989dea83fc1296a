"""Exact priors against brute-force enumeration of every object code."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from generators.priors import balanced_priors, coverage_count, omega_size, uniform_priors


def _cells(a):
    return list(itertools.product(*(range(x) for x in a)))


def _covers(subset, a):
    return all(len({c[g] for c in subset}) == a[g] for g in range(len(a)))


@pytest.mark.parametrize("a", [(1,), (3,), (2, 2), (3, 2), (3, 3), (2, 4), (2, 2, 2), (3, 2, 2), (1, 3, 2)])
def test_coverage_count_matches_enumeration(a):
    cells = _cells(a)
    for k in range(len(cells) + 1):
        brute = sum(_covers(s, a) for s in itertools.combinations(cells, k))
        assert coverage_count(k, a) == brute, (a, k)


def _brute_uniform(sizes, k_min, k_max):
    """Group every O with k_min..k_max objects by its F code: {F: |Ω(F)|}."""
    cells = _cells(sizes)
    omega = Counter()
    for k in range(k_min, k_max + 1):
        for subset in itertools.combinations(cells, k):
            f = tuple(frozenset(c[g] for c in subset) for g in range(len(sizes)))
            omega[f] += 1
    return omega


def _entropies(omega, weight):
    total = sum(weight.values())
    p = {f: w / total for f, w in weight.items()}
    h_f = -sum(q * math.log2(q) for q in p.values())
    h_of = sum(p[f] * math.log2(omega[f]) for f in omega)
    return h_f + h_of, h_f, h_of


@pytest.mark.parametrize(
    "sizes, k_min, k_max",
    [((3, 3), 1, 9), ((3, 3), 2, 4), ((2, 4), 1, 3), ((2, 2, 2), 1, 8), ((3, 2, 2), 2, 5), ((2, 2, 3), 1, 12)],
)
def test_uniform_priors_match_brute_force(sizes, k_min, k_max):
    omega = _brute_uniform(sizes, k_min, k_max)
    # the analytic count depends on F only through the active counts
    for f, n in omega.items():
        assert omega_size([len(g) for g in f], k_min, k_max) == n
    # a split: every third F code in a fixed order
    split = dict(sorted(omega.items(), key=lambda kv: sorted(map(sorted, kv[0])))[::3])
    h_o, h_f, h_of = _entropies(split, split)
    p = uniform_priors([[len(g) for g in f] for f in split], k_min, k_max)
    assert p.n_F_codes == len(split)
    assert p.H_O == pytest.approx(math.log2(sum(split.values())), abs=1e-12)
    assert p.H_O == pytest.approx(h_o, abs=1e-9)
    assert p.H_F == pytest.approx(h_f, abs=1e-9)
    assert p.H_O_given_F == pytest.approx(h_of, abs=1e-9)
    assert p.max_F_mass == pytest.approx(max(split.values()) / sum(split.values()))


@pytest.mark.parametrize("sizes, counts, n", [((3, 3), (2, 2), 3), ((4, 3), (2, 3), 4), ((2, 3, 2), (2, 2, 2), 3)])
def test_balanced_priors_match_brute_force(sizes, counts, n):
    # enumerate every scene of the balanced distribution: F uniform over codes with exactly
    # `counts` active values, then O uniform among n-subsets covering them.
    scenes = Counter()
    codes = list(itertools.product(*(itertools.combinations(range(s), c) for s, c in zip(sizes, counts))))
    for code in codes:
        grid = list(itertools.product(*code))
        valid = [s for s in itertools.combinations(grid, n) if _covers_values(s, code)]
        for s in valid:
            scenes[frozenset(s)] += 1 / (len(codes) * len(valid))
    h_o = -sum(p * math.log2(p) for p in scenes.values())
    p = balanced_priors(len(codes), counts, n)
    assert p.H_O == pytest.approx(h_o, abs=1e-9)
    assert p.H_F == pytest.approx(math.log2(len(codes)), abs=1e-12)
    assert p.H_O_given_F == pytest.approx(math.log2(coverage_count(n, counts)), abs=1e-12)


def _covers_values(subset, code):
    return all({c[g] for c in subset} == set(code[g]) for g in range(len(code)))


def test_paper_balanced_test_split():
    p = balanced_priors(131, (6, 6), 18)
    assert round(p.H_O, 2) == 39.94
    assert round(p.H_F, 2) == 7.03
    assert round(p.H_O_given_F, 2) == 32.91


def test_uniform_full_f_trap_mass():
    """7x7, ≤16 objects: the all-features-present F alone holds ~38% of the mass."""
    active = [(a, b) for a in range(1, 8) for b in range(1, 8) for _ in range(math.comb(7, a) * math.comb(7, b))]
    p = uniform_priors(active, 1, 16)
    assert p.n_F_codes == 127 * 127
    assert 0.37 < p.max_F_mass < 0.39
    assert p.max_F_mass == pytest.approx(omega_size((7, 7), 1, 16) / sum(omega_size(a, 1, 16) for a in active))
