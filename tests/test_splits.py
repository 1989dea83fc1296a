"""F-disjoint splits, the paper's 522/131/131 cut, and stratification."""

from __future__ import annotations

from collections import Counter

from generators.base import build_config, get_generator
from generators.splits import active_counts, assign_splits, fcode_key, fcodes_exact, fcodes_feasible


def test_paper_balanced_split_sizes():
    codes = fcodes_exact((8, 8), (6, 6))
    assert len(codes) == 784
    splits = assign_splits(codes, 1 / 6, 1 / 6, "bindingbench")
    assert {k: len(v) for k, v in splits.items()} == {"train": 522, "val": 131, "test": 131}
    keys = [set(map(fcode_key, v)) for v in splits.values()]
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert set().union(*keys) == set(map(fcode_key, codes))


def test_salt_changes_assignment_deterministically():
    codes = fcodes_exact((5, 5), (2, 2))
    a = assign_splits(codes, 0.2, 0.2, "x")
    assert a == assign_splits(codes, 0.2, 0.2, "x")
    assert a["test"] != assign_splits(codes, 0.2, 0.2, "y")["test"]


def test_stratified_split_shares_every_stratum():
    codes = fcodes_feasible((4, 4), lambda a: True)
    splits = assign_splits(codes, 1 / 6, 1 / 6, "s", stratify=True)
    strata = Counter(active_counts(c) for c in codes)
    test_strata = Counter(active_counts(c) for c in splits["test"])
    for key, n in strata.items():
        expected = int(n / 6 + 0.5) if n - 2 * int(n / 6 + 0.5) > 0 else 0
        assert test_strata[key] == expected, key
    # the single all-active code can't be shared: it stays in train
    assert ((0, 1, 2, 3), (0, 1, 2, 3)) in splits["train"]


def test_generator_splits_are_disjoint_in_f():
    gen = get_generator("colorshape")
    g = gen(build_config(gen, "uniform", {"n_colors": 4, "n_shapes": 4, "max_objects": 6}))
    keys = {s: {fcode_key(f) for f in p.codes} for s, p in g.plans.items()}
    assert not (keys["train"] & keys["test"]) and not (keys["val"] & keys["test"]) and not (keys["train"] & keys["val"])


def test_exclude_full_f():
    gen = get_generator("colorshape")
    cfg = {"n_colors": 4, "n_shapes": 4, "max_objects": 6}
    with_full = gen(build_config(gen, "uniform", cfg)).plans["train"].priors
    without = gen(build_config(gen, "uniform", {**cfg, "exclude_full_f": "true"})).plans["train"].priors
    assert without.n_F_codes == with_full.n_F_codes - 1
    assert without.max_F_mass < with_full.max_F_mass
