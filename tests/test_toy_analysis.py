"""Toy analysis: pair-category bookkeeping on real `toys` scenes, and the per-layer
score distributions on tokens whose answer is known (instance vs category identity)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.core.dataset import Dataset
from evaluators.tasks.issameobject.scorers import PairTrainConfig
from evaluators.tasks.issameobject.patch_labels import split_patch_labels
from evaluators.tasks.issameobject.toy_analysis import (
    PAIR_CATEGORIES,
    analyse_activations,
    categorized_pairs,
    decode_scores,
    pair_category,
    read_analysis,
    table_rows,
    write_analysis,
)
from tests.helpers import make_dataset
from tests.test_issameobject import FakeActivations

GRID = (24, 24)  # 4 px patches on 96 px scenes: a toy covers several patches


@pytest.fixture(scope="session")
def toys_small(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data") / "toys", generator="toys", preset=None,
                        n_train=12, n_val=4, n_test=3, image_size=96)


def test_pair_category_by_hand():
    a = {"id": 1, "category": "car_make_1", "identity": 0}
    b = {"id": 2, "category": "car_make_1", "identity": 0}
    c = {"id": 3, "category": "car_make_2", "identity": 1}
    d = {"id": 4, "category": "boat", "identity": 2}
    blue = {"id": 5, "category": "car_make_1", "identity": 7}
    assert pair_category(a, a) == "same-instance"
    assert pair_category(a, b) == pair_category(b, a) == "identical-twin"
    assert pair_category(a, c) == "same-class-different-make"
    assert pair_category(c, d) == pair_category(d, a) == "different-class"
    assert pair_category(a, blue) == "same-make-different-colour"
    assert pair_category(None, d) == pair_category(d, None) == "object-vs-background"
    assert pair_category(None, None) is None


def test_categorized_pairs_hand_built_scene():
    # patches: 0,1 = car A; 2 = car B; 3 = car C; 4 = boat; 5,6 = background; 7 ignored
    objects = [
        {"id": 1, "category": "car_make_1", "identity": 0}, {"id": 2, "category": "car_make_1", "identity": 0},
        {"id": 3, "category": "car_make_2", "identity": 1}, {"id": 4, "category": "boat", "identity": 2},
    ]
    labels = np.array([1, 1, 2, 3, 4, 0, 0, -1])
    i, j, cat = categorized_pairs(labels, objects)
    assert len(i) == 21  # C(7, 2): the ignored patch takes part in no pair
    got = {(int(a), int(b)): (PAIR_CATEGORIES[c] if c >= 0 else None) for a, b, c in zip(i, j, cat)}
    assert got[(0, 1)] == "same-instance"
    assert got[(0, 2)] == got[(1, 2)] == "identical-twin"
    assert got[(0, 3)] == got[(2, 3)] == "same-class-different-make"
    assert got[(0, 4)] == got[(3, 4)] == "different-class"
    assert got[(4, 5)] == got[(0, 6)] == "object-vs-background"
    assert got[(5, 6)] is None
    counts = {name: sum(v == name for v in got.values()) for name in PAIR_CATEGORIES}
    assert counts == {"same-instance": 1, "identical-twin": 2, "same-make-different-colour": 0,
                      "same-class-different-make": 3, "different-class": 4, "object-vs-background": 10}


def test_categories_on_generated_toy_scenes_follow_roles(toys_small):
    ds = Dataset(toys_small)
    labels = split_patch_labels(ds, "test", GRID)
    objects = ds.table("test", ["objects"])["objects"].to_pylist()
    expected_roles = {
        "identical-twin": {frozenset("AB")},
        "same-class-different-make": {frozenset("AC"), frozenset("BC")},
        "different-class": {frozenset("AD"), frozenset("BD"), frozenset("CD")},
    }
    seen = set()
    for row, objs in zip(labels, objects):
        role = {0: None, **{o["id"]: o["role"] for o in objs}}
        i, j, cat = categorized_pairs(row, objs)
        for a, b, c in zip(row[i], row[j], cat):
            if c < 0:
                assert a == b == 0
                continue
            name = PAIR_CATEGORIES[c]
            seen.add(name)
            if name == "same-instance":
                assert a == b != 0
            elif name == "object-vs-background":
                assert (a == 0) != (b == 0)
            else:
                assert frozenset((role[a], role[b])) in expected_roles[name]
    assert seen == set(PAIR_CATEGORIES) - {"same-make-different-colour"}  # no distractors in the preset


def _identity_tokens(ds: Dataset, split: str, by: str) -> np.ndarray:
    """One-hot tokens of each patch's object: by instance id, or by identity (twins collide)."""
    labels = split_patch_labels(ds, split, GRID)
    objects = ds.table(split, ["objects"])["objects"].to_pylist()
    out = np.zeros((*labels.shape, 8), np.float16)
    for n, objs in enumerate(objects):
        out[n, labels[n] == 0, 0] = 1  # background
        for o in objs:
            out[n, labels[n] == o["id"], 1 + (o["id"] if by == "instance" else o["identity"])] = 1
    return out


def test_identical_twins_collapse_only_without_instance_information(toys_small, tmp_path):
    ds = Dataset(toys_small)
    acts = {
        key: FakeActivations({0: _identity_tokens(ds, s, "identity"), 1: _identity_tokens(ds, s, "instance")}, GRID)
        for key, s in (("train", "train"), ("val", "val"), ("toys", "test"))
    }
    analysis = analyse_activations(acts, ds, ds, "test", probe="quadratic", train_config=PairTrainConfig(epochs=30), heatmap_scenes=2, progress=False)
    stats = {(r["layer"], r["category"]): r for r in analysis["stats"]}
    # layer 0 knows only *what* a patch shows: twins look like one object
    assert stats[(0, "identical-twin")]["mean_score"] > 0.5
    # layer 1 knows *which* object: twins are as different as any two objects
    assert stats[(1, "identical-twin")]["mean_score"] < 0.2
    assert stats[(1, "same-instance")]["mean_score"] > 0.9
    for layer in (0, 1):
        assert stats[(layer, "different-class")]["frac_above_half"] < 0.1
        assert stats[(layer, "object-vs-background")]["frac_above_half"] < 0.1
    assert stats[(0, "same-make-different-colour")]["n"] == 0
    # score maps: T x T, symmetric, the clicked-patch row matches the pair scores
    t = GRID[0] * GRID[1]
    scene = analysis["scenes"][0]
    labels = np.array(scene["labels"])
    car_a, car_b = np.flatnonzero(labels == 1), np.flatnonzero(labels == 2)
    m0, m1 = (decode_scores(scene["scores"][layer], t) for layer in ("0", "1"))
    np.testing.assert_allclose(m1, m1.T, atol=1 / 255)
    # a twin pair has exactly the tokens of a same-instance pair at layer 0: equal scores
    np.testing.assert_allclose(m0[car_a[0], car_b], m0[car_a[0], car_a[1]], atol=1 / 255)
    assert m1[car_a[0], car_a].min() > 0.9 and m1[car_a[0], car_b].max() < 0.1
    json_path, png = write_analysis(analysis, tmp_path)
    assert png.stat().st_size > 10_000
    again = read_analysis(tmp_path)
    assert again["stats"] == analysis["stats"]
    rows = table_rows(again)
    assert {r["category"] for r in rows} == set(PAIR_CATEGORIES) - {"same-make-different-colour"}


def test_toys_analysis_command(toys_small, tmp_path, monkeypatch, capsys):
    """`bench toys-analysis` end to end on raw pixel tokens (layer 0 only), JSON table on stdout."""
    import json

    from bench.cli import main

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "analysis"
    code = main(["toys-analysis", "--model", "pixels:8", "--dataset", str(toys_small), "--out", str(out),
                 "--epochs", "3", "--heatmap-scenes", "1", "--device", "cpu", "--format", "json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["category"] for r in rows} == set(PAIR_CATEGORIES) - {"same-make-different-colour"}
    assert all(r["layer"] == 0 and 0 <= r["mean_score"] <= 1 for r in rows)
    analysis = read_analysis(out)
    assert analysis["grid"] == [12, 12] and len(analysis["scenes"]) == 1
    assert len(decode_scores(analysis["scenes"][0]["scores"]["0"], 144)) == 144
    assert (out / "toy_analysis.png").stat().st_size > 10_000
    assert main(["toys-analysis", "--model", "pixels:8", "--dataset", str(toys_small), "--probe", "attention-qk"]) == 2
