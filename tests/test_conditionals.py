"""Exact autoregressive bit priors (generators/conditionals.py) against the cards and brute force."""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from generators.base import build_config, config_to_dict, get_generator
from generators.conditionals import _active_grid, bit_priors, effective_f_codes, resample_o
from generators.covering_conditionals import inclusion_exclusion_probs, row_programme_probs
from generators.engine import generate
from generators.from_card import generator_of
from generators.priors import PriorsUnavailable, omega_size
from tests.helpers import make_dataset


def observed_bits(p: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """−log2 of each observed bit's probability, summed per row."""
    q = np.where(bits == 1, p, 1.0 - p)
    with np.errstate(divide="ignore"):
        return -np.log2(q).sum(axis=1)


def f_probability(gen, split: str, f_row: np.ndarray) -> float:
    """P(f) from the plan: 1/n_codes (balanced), |Ω(f)| / Σ|Ω| (uniform), sets giving f / all (toys)."""
    space = gen.feature_space
    weights = {}
    for code, w in gen.f_support(split):
        bits = np.zeros(space.n_features, dtype=np.uint8)
        for off, vals in zip(space.offsets, code):
            bits[[off + v for v in vals]] = 1
        weights[bits.tobytes()] = w
    return weights[f_row.astype(np.uint8).tobytes()] / sum(weights.values())


def fcodes_of(gen, split: str) -> list[np.ndarray]:
    """The split's F codes as bit rows, largest |Ω(f)| first (the richest test of a sampler)."""
    space = gen.feature_space
    rows = []
    for code, w in sorted(gen.f_support(split), key=lambda cw: -cw[1]):
        bits = np.zeros(space.n_features, dtype=np.uint8)
        for off, vals in zip(space.offsets, code):
            bits[[off + v for v in vals]] = 1
        rows.append(bits)
    return rows


def card_of(gen) -> dict:
    """The card `bench generate` would write, without any scenes (through JSON: tuples become lists)."""
    return json.loads(json.dumps({
        "schema_version": 1,
        "generator": {"name": gen.name, "version": gen.version},
        "config": config_to_dict(gen.config),
        "feature_space": gen.feature_space.to_dict(),
        "splits": {s: {"n": p.n, **p.priors.to_dict()} for s, p in gen.plans.items()},
    }))


def check_dataset(path: Path) -> None:
    """Every row of every split: O bits sum to its H(O|F=f), F bits to −log2 P(f); outside the grid 0."""
    ds = Dataset(path)
    gen = generator_of(ds.card)
    space = ds.feature_space
    for split in ds.splits:
        F, O, h = ds.codes(split)
        seen = []
        pF, pO = bit_priors(ds.card, split, F, O, progress=seen.append)
        assert sum(seen) == len(O)
        assert pF.shape == F.shape and pO.shape == O.shape and pF.dtype == pO.dtype == np.float64
        np.testing.assert_allclose(observed_bits(pO, O), h, rtol=0, atol=1e-9)
        want = [-math.log2(f_probability(gen, split, f)) for f in F]
        np.testing.assert_allclose(observed_bits(pF, F), want, rtol=0, atol=1e-9)
        # every conjunction outside f's active grid is exactly 0
        in_grid = (F.astype(int) @ space.conj_to_feature.T.astype(int)) == len(space.sizes)
        assert (pO[~in_grid] == 0).all()
        assert ((pO >= 0) & (pO <= 1)).all() and ((pF >= 0) & (pF <= 1)).all()


# -- generated datasets --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def balanced_tiny(tmp_path_factory) -> Path:
    """Paper-shaped balanced ColorShape (8x8, 6 colours, 6 shapes, 18 objects), few scenes."""
    return make_dataset(tmp_path_factory.mktemp("cond") / "balanced", n_train=12, n_val=6, n_test=6, image_size=128,
                        object_size=8, margin=2)


def test_balanced_rows_match_their_priors(balanced_tiny):
    check_dataset(balanced_tiny)


def test_uniform_rows_match_their_priors(uniform_small):
    check_dataset(uniform_small)


def test_complexity_sweep_members_rebuild_and_match(tmp_path):
    cls = get_generator("colorshape")
    cfg = build_config(cls, "complexity-sweep", dict(sweep=(1, 3), n_train=6, n_val=3, n_test=3, image_size=96))
    for sub, member in cls.expand(cfg):
        generate(cls, member, tmp_path / sub)
        check_dataset(tmp_path / sub)
        card = Dataset(tmp_path / sub).card
        assert effective_f_codes(card, "test") == card["splits"]["test"]["n_F_codes"]


def test_clevr_rows_match_their_priors(tmp_path):
    make_dataset(tmp_path / "clevr", "clevr", "small", n_train=4, n_val=2, n_test=3, image_size=48)
    check_dataset(tmp_path / "clevr")


def test_clevr_three_groups_rows_match_their_priors(tmp_path):
    make_dataset(tmp_path / "clevr3", "clevr", "small", n_train=3, n_val=2, n_test=2, image_size=48,
                 colors=("gray", "red", "blue"), materials=("rubber", "metal"), min_objects=2, max_objects=6)
    assert len(Dataset(tmp_path / "clevr3").feature_space.sizes) == 3
    check_dataset(tmp_path / "clevr3")


def test_toys_with_distractors_rows_match_their_priors(tmp_path):
    make_dataset(tmp_path / "toys", "toys", "identical-cars-distractors", n_train=3, n_val=2, n_test=3, image_size=48)
    check_dataset(tmp_path / "toys")


def test_occlusion_sweep_cards_rebuild():
    """Each height of a sweep is its own card with the expanded config; its codes get exact priors."""
    cls = get_generator("clevr")
    for _sub, cfg in cls.expand(build_config(cls, "occlusion-sweep", dict(n_train=5, n_val=3, n_test=3))):
        gen = cls(cfg)
        card = card_of(gen)
        assert generator_of(card).config == cfg
        space = gen.feature_space
        O = np.zeros((3, space.n_conjunctions), dtype=np.uint8)
        for i in range(3):
            conjs, _f = gen.sample_conjunctions(random.Random(i), "test")
            O[i, conjs] = 1
        F = space.o_to_f(O)
        pF, pO = bit_priors(card, "test", F, O)
        want_f = [-math.log2(f_probability(gen, "test", f)) for f in F]
        np.testing.assert_allclose(observed_bits(pF, F), want_f, rtol=0, atol=1e-9)
        c = gen.config
        want_o = [math.log2(omega_size(space.active_counts(f), c.min_objects, c.max_objects)) for f in F]
        np.testing.assert_allclose(observed_bits(pO, O), want_o, rtol=0, atol=1e-9)


def test_toys_without_distractors_are_certain(tmp_path):
    gen = get_generator("toys")(build_config(get_generator("toys"), "identical-cars", {}))
    space = gen.feature_space
    O = space.encode_o([0, 1, 2])[None, :]
    pF, pO = bit_priors(card_of(gen), "test", space.o_to_f(O), O)
    assert set(np.unique(pF)) <= {0.0, 1.0} and set(np.unique(pO)) <= {0.0, 1.0}
    assert observed_bits(pF, space.o_to_f(O))[0] == 0 and observed_bits(pO, O)[0] == 0


# -- brute force ---------------------------------------------------------------------------------


def enumerate_omega(a: tuple[int, ...], k_min: int, k_max: int) -> list[tuple[int, ...]]:
    """Every subset of the a-grid (lexicographic cells) with k_min..k_max cells hitting every value."""
    cells = list(itertools.product(*(range(x) for x in a)))
    out = []
    for k in range(k_min, k_max + 1):
        for chosen in itertools.combinations(range(len(cells)), k):
            if all(len({cells[i][g] for i in chosen}) == a[g] for g in range(len(a))):
                bits = [0] * len(cells)
                for i in chosen:
                    bits[i] = 1
                out.append(tuple(bits))
    return out


def assert_exact(omega, target, probs):
    for j in range(len(target)):
        match = [o for o in omega if o[:j] == tuple(target[:j])]
        want = Fraction(sum(o[j] for o in match), len(match))
        assert abs(probs[j] - want) <= 1e-12, (target, j)
        if want in (0, 1):
            assert probs[j] == want  # bits the prior fixes are exactly 0 or 1


GRIDS = [((3, 3), 1, 9), ((3, 3), 4, 4), ((2, 4), 2, 5), ((4, 2), 4, 4), ((3, 4), 6, 6), ((1, 3), 1, 3),
         ((2, 2, 2), 2, 5), ((2, 2, 2), 4, 4), ((3, 2, 2), 3, 6), ((2, 3, 2), 12, 12), ((2, 2, 2, 2), 2, 4),
         ((4,), 4, 4), ((3,), 1, 3)]


@pytest.mark.parametrize("a, k_min, k_max", GRIDS)
def test_every_code_of_small_grids_matches_enumeration(a, k_min, k_max):
    """Both counting methods, along 40 random codes of Ω(f), against the enumerated ratios."""
    omega = enumerate_omega(a, k_min, k_max)
    rng = random.Random(hash((a, k_min, k_max)) & 0xFFFF)
    for target in rng.sample(omega, min(40, len(omega))):
        probs, bad = inclusion_exclusion_probs(a, list(target), k_min, k_max)
        assert bad is None
        assert_exact(omega, target, probs)
        if len(a) == 2:
            dp, bad = row_programme_probs(a, list(target), k_min, k_max)
            assert bad is None and dp == probs


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_prefixes_match_enumeration(data):
    """Random grids (2 and 3 groups), ranges and codes: p(o_k = 1 | prefix) is the enumerated ratio."""
    G = data.draw(st.sampled_from([2, 3]))
    a = tuple(data.draw(st.lists(st.integers(1, 4 if G == 2 else 3), min_size=G, max_size=G)
                        .filter(lambda s: math.prod(s) <= 12)))
    m = math.prod(a)
    k_min = data.draw(st.integers(max(a), m))
    k_max = data.draw(st.integers(k_min, m))
    omega = enumerate_omega(a, k_min, k_max)
    target = omega[data.draw(st.integers(0, len(omega) - 1))]
    probs, _ = inclusion_exclusion_probs(a, list(target), k_min, k_max)
    assert_exact(omega, target, probs)
    if G == 2:
        dp, _ = row_programme_probs(a, list(target), k_min, k_max)
        assert max(abs(x - y) for x, y in zip(dp, probs)) <= 1e-15


@pytest.mark.parametrize("name, overrides", [
    ("colorshape", dict(distribution="uniform", n_colors=3, n_shapes=2, min_objects=2, max_objects=4)),
    ("colorshape", dict(distribution="balanced", n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2,
                        n_objects=3)),
    ("clevr", dict(colors=("gray", "red"), materials=("rubber", "metal"), min_objects=1, max_objects=4)),
])
def test_whole_generator_against_enumeration(name, overrides):
    """Through the public API: every object code of every test F code, F and O priors by brute force."""
    cls = get_generator(name)
    gen = cls(build_config(cls, "small" if name == "clevr" else "uniform", overrides))
    space = gen.feature_space
    support = {}
    for k in range(1, space.n_conjunctions + 1):
        for conjs in itertools.combinations(range(space.n_conjunctions), k):
            o = space.encode_o(conjs)
            support.setdefault(space.o_to_f(o).tobytes(), []).append(o)
    weights = {}
    for code, w in gen.f_support("test"):
        bits = np.zeros(space.n_features, dtype=np.uint8)
        for off, vals in zip(space.offsets, code):
            bits[[off + v for v in vals]] = 1
        weights[bits.tobytes()] = w
    k_min, k_max = gen.o_given_f().k_min, gen.o_given_f().k_max
    rows = [o for f in weights for o in support[f] if k_min <= o.sum() <= k_max]
    O = np.stack(rows)
    F = space.o_to_f(O)
    pF, pO = bit_priors(card_of(gen), "test", F, O)
    for i in range(len(O)):
        omega = [o for o in rows if (space.o_to_f(o) == F[i]).all()]
        for j in range(space.n_conjunctions):
            match = [o for o in omega if (o[:j] == O[i, :j]).all()]
            assert pO[i, j] == pytest.approx(Fraction(sum(int(o[j]) for o in match), len(match)), abs=1e-12)
        fs = [np.frombuffer(f, dtype=np.uint8) for f in weights]
        for j in range(space.n_features):
            match = [(f, weights[f.tobytes()]) for f in fs if (f[:j] == F[i, :j]).all()]
            want = Fraction(sum(w for f, w in match if f[j]), sum(w for _f, w in match))
            assert pF[i, j] == pytest.approx(want, abs=1e-12)


# -- bad input -----------------------------------------------------------------------------------


def test_rows_outside_the_support_raise_one_line(balanced_tiny):
    ds = Dataset(balanced_tiny)
    F, O, _h = ds.codes("test")
    Fv, Ov, _ = ds.codes("val")
    with pytest.raises(BenchError, match=r"row 0: F code .* not in the split") as e:
        bit_priors(ds.card, "test", Fv[:1], Ov[:1])  # splits are disjoint in F
    assert "\n" not in str(e.value)
    # same F, one object fewer (if its values stay covered): a balanced scene has exactly 18
    space = ds.feature_space
    O2 = O.copy()
    for c in np.flatnonzero(O2[2]):
        trial = O2[2].copy()
        trial[c] = 0
        if (space.o_to_f(trial) == F[2]).all():
            O2[2] = trial
            break
    with pytest.raises(BenchError, match=r"row 2: O bit \d+ .* prior probability 0") as e:
        bit_priors(ds.card, "test", F, O2)
    assert "\n" not in str(e.value) and not isinstance(e.value, PriorsUnavailable)
    with pytest.raises(BenchError, match="row 1: its F is not the F of its O"):
        bad = F.copy()
        bad[1] = F[0] if (F[0] != F[1]).any() else 1 - F[1]
        bit_priors(ds.card, "test", bad, O)


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.pop("config"), "no generator config"),
    (lambda c: c.pop("generator"), "no generator config"),
    (lambda c: c["generator"].update(name="nope"), "unknown generator 'nope'"),
    (lambda c: c["generator"].update(version="0.0"), "v0.0"),
    (lambda c: c["config"].update(frobnicate=1), "no longer builds"),
    (lambda c: c["config"].update(n_objects=99), "no longer builds"),
    (lambda c: c["config"].update(val_fraction=0.25), "no longer reproduces"),
])
def test_cards_without_what_priors_need(balanced_tiny, edit, needle):
    ds = Dataset(balanced_tiny)
    card = copy.deepcopy(ds.card)
    edit(card)
    F, O, _ = ds.codes("test")
    with pytest.raises(PriorsUnavailable, match=needle) as e:
        bit_priors(card, "test", F, O)
    msg = str(e.value)
    assert "\n" not in msg and ("--unanchored" in msg)


# -- effective number of F codes -------------------------------------------------------------------


def test_effective_f_codes_balanced_is_the_code_count(balanced_tiny):
    card = Dataset(balanced_tiny).card
    for split, info in card["splits"].items():
        assert effective_f_codes(card, split) == info["n_F_codes"] == info["n_F_eff"]
        old = copy.deepcopy(card)
        del old["splits"][split]["n_F_eff"]  # a card written before n_F_eff: rebuilt from the plan
        assert effective_f_codes(old, split) == info["n_F_codes"]


def test_effective_f_codes_uniform_by_hand():
    """2 colours x 2 shapes, 1..4 objects: 9 F codes; |Ω| = 1 except the full F's 2 + 4 + 1 = 7.
    Strata (1,1): 4 codes (train 2, val 1, test 1); (1,2), (2,1): 2 each and (2,2): 1, all train.
    Train weights 1,1,1,1,1,1,7: n_eff = 13² / (6 + 49) = 169/55."""
    cls = get_generator("colorshape")
    gen = cls(build_config(cls, "uniform", dict(n_colors=2, n_shapes=2, min_objects=1, max_objects=4)))
    card = card_of(gen)
    assert effective_f_codes(card, "train") == 169 / 55 == card["splits"]["train"]["n_F_eff"]
    assert effective_f_codes(card, "test") == 1.0
    del card["splits"]["train"]["n_F_eff"]
    assert effective_f_codes(card, "train") == 169 / 55


# -- the control null's resampler --------------------------------------------------------------


@pytest.mark.parametrize("name, overrides", [
    ("colorshape", dict(distribution="uniform", n_colors=3, n_shapes=2, min_objects=2, max_objects=4)),
    ("colorshape", dict(distribution="balanced", n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2,
                        n_objects=3)),
])
def test_resampled_o_is_uniform_over_omega(name, overrides):
    """Draws for one F code cover exactly Ω(f), each code about equally often (|Ω(f)| codes,
    12,000 draws: every frequency within 5 standard errors of 1/|Ω|)."""
    cls = get_generator(name)
    gen = cls(build_config(cls, "uniform", overrides))
    space = gen.feature_space
    f = next(iter(fcodes_of(gen, "test")))
    n = 12_000
    drawn = resample_o(card_of(gen), np.repeat(f[None, :], n, axis=0), [f"scene-{i}" for i in range(n)])
    assert (space.o_to_f(drawn) == f).all()
    a, _ = _active_grid(space, f)
    model = gen.o_given_f()
    omega = enumerate_omega(a, model.k_min, model.k_max)
    codes, counts = np.unique(drawn, axis=0, return_counts=True)
    assert len(codes) == len(omega)
    p = 1 / len(omega)
    assert np.abs(counts / n - p).max() <= 5 * math.sqrt(p * (1 - p) / n)


def test_resampled_o_depends_on_the_scene_key_and_seed_only():
    gen = get_generator("toys")(build_config(get_generator("toys"), "identical-cars-distractors", {}))
    space = gen.feature_space
    f = next(iter(fcodes_of(gen, "test")))
    F = np.repeat(f[None, :], 50, axis=0)
    keys = [f"k{i}" for i in range(50)]
    once = resample_o(card_of(gen), F, keys)
    assert (once == resample_o(card_of(gen), F[::-1], keys[::-1])[::-1]).all()  # order-free
    assert (space.o_to_f(once) == F).all()
    assert not (once == resample_o(card_of(gen), F, keys, seed=1)).all()
