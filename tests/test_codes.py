"""FeatureSpace: F/O orderings of docs/explanation/architecture.md §1 for any number of groups."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bench.core.codes import FeatureSpace
from bench.core.errors import ConfigError

COLOR_SHAPE = FeatureSpace.of([("color", ["red", "blue", "green"]), ("shape", ["circle", "square"])])
THREE = FeatureSpace.of([("color", "abc"), ("shape", "xy"), ("material", ["rubber", "metal", "glass", "wood"])])


def test_sizes_and_lengths():
    assert COLOR_SHAPE.sizes == (3, 2)
    assert COLOR_SHAPE.n_features == 5
    assert COLOR_SHAPE.n_conjunctions == 6
    assert THREE.n_features == 9 and THREE.n_conjunctions == 24


def test_mixed_radix_first_group_most_significant():
    # conj = color * n_shapes + shape
    assert COLOR_SHAPE.conj_id((2, 1)) == 5
    assert COLOR_SHAPE.conj_id((1, 0)) == 2
    assert COLOR_SHAPE.conj_names(3) == ("blue", "square")
    # three groups: ((c * 2) + s) * 4 + m
    assert THREE.conj_id((1, 1, 2)) == (1 * 2 + 1) * 4 + 2


@pytest.mark.parametrize("space", [COLOR_SHAPE, THREE])
def test_conj_roundtrip_all(space):
    ids = [space.conj_id(v) for v in itertools.product(*(range(s) for s in space.sizes))]
    assert ids == list(range(space.n_conjunctions))
    assert all(space.conj_id(space.conj_values(c)) == c for c in ids)


def test_o_to_f_group_major():
    o = COLOR_SHAPE.encode_o([COLOR_SHAPE.conj_id((0, 1)), COLOR_SHAPE.conj_id((2, 1))])
    assert o.tolist() == [0, 1, 0, 0, 0, 1]
    # F = [red, blue, green | circle, square]
    assert COLOR_SHAPE.o_to_f(o).tolist() == [1, 0, 1, 0, 1]


def test_o_to_f_batch_matches_definition():
    rng = np.random.default_rng(0)
    o = (rng.random((50, THREE.n_conjunctions)) < 0.2).astype(np.uint8)
    f = THREE.o_to_f(o)
    for row_o, row_f in zip(o, f):
        expect = np.zeros(THREE.n_features, dtype=np.uint8)
        for c in np.flatnonzero(row_o):
            for off, v in zip(THREE.offsets, THREE.conj_values(int(c))):
                expect[off + v] = 1
        assert row_f.tolist() == expect.tolist()


def test_active_counts_and_key():
    f = COLOR_SHAPE.o_to_f(COLOR_SHAPE.encode_o([0, 5]))
    assert COLOR_SHAPE.active_counts(f) == (2, 2)
    assert COLOR_SHAPE.f_key(f) == "101|11"


def test_dict_roundtrip():
    assert FeatureSpace.from_dict(THREE.to_dict()) == THREE


@pytest.mark.parametrize(
    "groups, param",
    [([], "feature_space"), ([("color", [])], "color"), ([("a", "xy"), ("a", "z")], "feature_space"), ([("a", "xx")], "a")],
)
def test_invalid_spaces_name_the_parameter(groups, param):
    with pytest.raises(ConfigError) as e:
        FeatureSpace.of(groups)
    assert e.value.param == param


def test_out_of_range_values():
    with pytest.raises(ConfigError):
        COLOR_SHAPE.conj_id((3, 0))
    with pytest.raises(ConfigError):
        COLOR_SHAPE.encode_o([6])
    with pytest.raises(ConfigError, match="unknown value 'pink'"):
        COLOR_SHAPE.value_index("color", "pink")
