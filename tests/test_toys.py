"""The `toys` generator: identical twins, roles and categories, distractor priors, bad input."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from bench.cli import main
from bench.core.dataset import Dataset
from generators.base import build_config, get_generator

TOYS = get_generator("toys")


@pytest.fixture(scope="module")
def cars(tmp_path_factory):
    out = tmp_path_factory.mktemp("toys") / "cars"
    assert main(["generate", "toys", "--out", str(out), "--n-train", "4", "--n-val", "2", "--n-test", "4",
                 "--image-size", "128"]) == 0
    return Dataset(out)


def test_identical_cars_rows(cars):
    space = cars.feature_space
    assert space.names == ("color", "category")
    for row in cars.iter_scenes("test"):
        objs = row["objects"]
        assert [o["role"] for o in objs] == ["A", "B", "C", "D"]
        assert [o["category"] for o in objs] == ["car_make_1", "car_make_1", "car_make_2", "boat"]
        assert {o["attributes"][0] for o in objs} == {"red"}
        a, b, c, d = objs
        assert a["identity"] == b["identity"] and len({a["identity"], c["identity"], d["identity"]}) == 3
        assert a["twins"] == [2] and b["twins"] == [1] and c["twins"] == [] and d["twins"] == []
        assert sum(row["O"]) == 3 and row["n_objects"] == 4  # the twins share one conjunction
        counts = np.bincount(row["mask"].ravel(), minlength=5)
        assert len(counts) == 5 and all(o["visible_px"] == counts[o["id"]] > 0 for o in objs)
        assert row["H_O_given_F"] == 0.0
    info = cars.split_info("test")
    assert (info["H_O"], info["H_F"], info["H_O_given_F"], info["n_F_codes"]) == (0.0, 0.0, 0.0, 1)
    assert 0 < info["mean_visibility"] <= 1


def test_makes_and_boat_have_distinct_silhouettes():
    """The three models differ in shape, not only in name (twins share one cached model by key)."""
    gen = TOYS(build_config(TOYS, None, {"image_size": 96}))
    from generators import render3d
    from generators.render3d import Camera, Placed, object_pose

    scene, _ = gen.render("train", 0, 1)  # caches the models
    r = render3d.get_renderer(96)
    cam = Camera(eye=(6.0, -6.0, 3.0))
    pose = object_pose((0.0, 0.0, 0.0), 30.0, 1.0)
    sil = {k: r.render([Placed(("toy", k, "red"), pose)], cam, [], rgb=False).full_px[0]
           for k in ("car_make_1", "car_make_2", "boat")}
    assert len(set(sil.values())) == 3
    assert all(v > 50 for v in sil.values())


def test_distractor_priors_match_brute_force():
    gen = TOYS(build_config(TOYS, "identical-cars-distractors", {}))
    space = gen.feature_space
    pool = range(3, space.n_conjunctions)
    fs = Counter(space.f_key(space.o_to_f(space.encode_o([0, 1, 2, *extra])))
                 for extra in itertools.combinations(pool, 2))
    total = sum(fs.values())
    assert total == math.comb(9, 2)
    h_o_f = sum(n / total * math.log2(n) for n in fs.values())
    p = gen.plans["test"].priors
    assert p.H_O == pytest.approx(math.log2(total)) and p.H_O_given_F == pytest.approx(h_o_f)
    assert p.n_F_codes == len(fs)
    scene, h = gen.render("test", 0, 7)
    roles = [o["role"] for o in scene.objects]
    assert roles == ["A", "B", "C", "D", "distractor", "distractor"]
    extra = [o["conj"] for o in scene.objects[4:]]
    assert len(set(extra)) == 2 and all(space.conj_names(x)[0] != "red" for x in extra)
    key = space.f_key(space.o_to_f(space.encode_o([o["conj"] for o in scene.objects])))
    assert h == pytest.approx(math.log2(fs[key]))


@pytest.mark.parametrize("sets, needle", [
    (["color=pink"], "color: unknown 'pink'"),
    (["distractors=10"], "distractors: must be 0..9"),
    (["distractor_colors=red,blue"], "distractor_colors: must be distinct and differ"),
    (["camera_height=0"], "camera_height: camera height must be > 0"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, sets, needle):
    args = ["generate", "toys", "--out", str(tmp_path / "bad"), "--n-train", "1", "--n-val", "1", "--n-test", "1"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench: error: ") and needle in err and "\n" not in err
