"""The `clevr` generator: exact priors, masks vs objects, the occlusion sweep, determinism, bad input."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.cli import main
from bench.core.dataset import Dataset
from generators.base import build_config, get_generator
from generators.engine import scene_seed
from generators.splits import fcode_key, fcode_of_conjs

CLEVR = get_generator("clevr")


def clevr(**overrides):
    return CLEVR(build_config(CLEVR, "default", overrides))


def brute_force_priors(gen, split: str) -> tuple[float, float, float]:
    """H(O), H(F), H(O|F) by enumerating every object code of the split."""
    c, space = gen.config, gen.feature_space
    support = {fcode_key(f) for f in gen.plans[split].codes}
    omega: Counter = Counter()
    for k in range(c.min_objects, c.max_objects + 1):
        for conjs in itertools.combinations(range(space.n_conjunctions), k):
            key = fcode_key(fcode_of_conjs([space.conj_values(x) for x in conjs], len(space.sizes)))
            if key in support:
                omega[key] += 1
    total = sum(omega.values())
    h_o = math.log2(total)
    h_o_f = sum(n / total * math.log2(n) for n in omega.values())
    return h_o, h_o - h_o_f, h_o_f


@pytest.mark.parametrize("overrides", [
    dict(),  # the paper's 4 colours x 3 shapes, 3..10 objects
    dict(colors=("gray", "red"), materials=("rubber", "metal"), min_objects=1, max_objects=4),  # three groups
])
def test_priors_match_brute_force(overrides):
    gen = clevr(**overrides)
    for split in ("train", "val", "test"):
        p = gen.plans[split].priors
        h_o, h_f, h_o_f = brute_force_priors(gen, split)
        assert p.H_O == pytest.approx(h_o, abs=1e-9)
        assert p.H_F == pytest.approx(h_f, abs=1e-9)
        assert p.H_O_given_F == pytest.approx(h_o_f, abs=1e-9)


def test_feature_space_has_material_and_size_groups_only_when_varied():
    assert clevr().feature_space.names == ("color", "shape")
    assert clevr().feature_space.n_conjunctions == 12
    space = clevr(materials=("rubber", "metal"), sizes=("small", "large"), max_objects=6).feature_space
    assert space.names == ("color", "shape", "material", "size") and space.n_conjunctions == 48


def test_sampler_is_uniform_over_the_split_support():
    gen = clevr(colors=("gray", "red"), shapes=("cube", "sphere"), min_objects=1, max_objects=2,
                val_fraction=0.0, test_fraction=0.0, n_val=0, n_test=0)
    support = {fcode_key(f) for f in gen.plans["train"].codes}
    space = gen.feature_space
    codes = [c for k in (1, 2) for c in itertools.combinations(range(4), k)
             if fcode_key(fcode_of_conjs([space.conj_values(x) for x in c], 2)) in support]
    rng = random.Random(0)
    n = 5000
    counts = Counter(tuple(gen.sample_conjunctions(rng, "train")[0]) for _ in range(n))
    assert set(counts) == set(codes)
    expected = n / len(codes)
    chi2 = sum((counts[c] - expected) ** 2 / expected for c in codes)
    assert chi2 < 30  # 9 degrees of freedom: p < 1e-3 only above ~27.9


def test_layout_does_not_depend_on_the_camera_height():
    low, high = clevr(camera_height=0.6, image_size=64), clevr(camera_height=3.2, image_size=64)
    seed = scene_seed(0, "test", 5)
    a, _ = low.render("test", 5, seed)
    b, _ = high.render("test", 5, seed)
    strip = lambda objs: [(o["conj"], o["position"], o["rotation"]) for o in objs]  # noqa: E731
    assert strip(a.objects) == strip(b.objects)
    assert a.extras["camera_height"] == 0.6 and b.extras["camera_height"] == 3.2
    assert a.extras["camera_position"][:2] == b.extras["camera_position"][:2]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clevr") / "sweep"
    code = main(["generate", "clevr", "--out", str(out), "--n-train", "0", "--n-val", "0", "--n-test", "16",
                 "--image-size", "128", "--camera-heights", "0.6,1.9,3.2"])
    assert code == 0
    return out


@pytest.mark.slow
def test_sweep_writes_one_dataset_per_height_with_more_occlusion_lower(sweep):
    cards = {h: Dataset(sweep / f"height-{h}").card for h in ("0.6", "1.9", "3.2")}
    mean = [cards[h]["splits"]["test"]["mean_visibility"] for h in ("0.6", "1.9", "3.2")]
    below = [cards[h]["splits"]["test"]["frac_visibility_below_half"] for h in ("0.6", "1.9", "3.2")]
    assert mean[0] < mean[1] < mean[2] <= 1.0
    assert below[0] > below[2]
    assert [cards[h]["config"]["camera_height"] for h in cards] == [0.6, 1.9, 3.2]
    # same scenes, same priors: only the viewpoint differs
    assert len({c["splits"]["test"]["H_O"] for c in cards.values()}) == 1
    codes = [Dataset(sweep / f"height-{h}").codes("test")[1] for h in cards]
    assert all(np.array_equal(codes[0], c) for c in codes[1:])


def test_info_shows_the_occlusion_statistics(sweep, capsys):
    assert main(["info", str(sweep / "height-0.6"), "--format", "csv"]) == 0
    header, *rows = [line.split(",") for line in capsys.readouterr().out.strip().splitlines()]
    row = next(dict(zip(header, r)) for r in rows if r[0] == "test")
    card = Dataset(sweep / "height-0.6").card["splits"]["test"]
    assert float(row["mean_visibility"]) == pytest.approx(card["mean_visibility"], rel=1e-3)
    assert "frac_visibility_below_half" in header and header[-1] == "fingerprint"


def test_rows_masks_match_objects(sweep):
    ds = Dataset(sweep / "height-0.6")
    space = ds.feature_space
    for row in ds.iter_scenes("test"):
        objs = row["objects"]
        counts = np.bincount(row["mask"].ravel(), minlength=len(objs) + 1)
        assert len(counts) == len(objs) + 1  # no id beyond the objects list
        for o in objs:
            assert o["visible_px"] == counts[o["id"]] and o["visible_px"] <= o["full_px"]
            assert o["visibility"] == pytest.approx(o["visible_px"] / o["full_px"])
            assert o["attributes"] == list(space.conj_names(o["conj"]))
            assert o["scale"] == 0.35 and o["material"] == "rubber" and o["size"] == "small"
            x0, y0, x1, y1 = o["bbox"]
            if o["visible_px"]:
                ys, xs = np.nonzero(row["mask"] == o["id"])
                assert x0 <= xs.min() and xs.max() < x1 and y0 <= ys.min() and ys.max() < y1
        conjs = [o["conj"] for o in objs]
        assert len(set(conjs)) == len(conjs)  # objects are distinct conjunctions
        assert row["O"] == space.encode_o(conjs).tolist()
        assert len(row["camera_pose"]) == 16 and row["camera_height"] == 0.6
        assert row["image"].shape == (128, 128, 3)


def test_determinism_across_worker_counts(tmp_path):
    args = ["generate", "clevr", "--n-train", "8", "--n-val", "4", "--n-test", "4", "--image-size", "64",
            "--set", "shard_size=4", "--seed", "3"]
    assert main([*args, "--out", str(tmp_path / "w1"), "--workers", "1"]) == 0
    assert main([*args, "--out", str(tmp_path / "w2"), "--workers", "2"]) == 0
    names = sorted(p.name for p in (tmp_path / "w1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w2").iterdir()) and len(names) == 5
    for name in names:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name
    fps = [Dataset(tmp_path / w).fingerprint(s) for w in ("w1", "w2") for s in ("train", "test")]
    assert fps[:2] == fps[2:]


def test_camera_heights_is_refused_by_a_2d_generator(tmp_path, capsys):
    assert main(["generate", "colorshape", "--out", str(tmp_path / "cs"), "--camera-heights", "1,2"]) == 2
    assert "camera_heights: unknown parameter for colorshape" in capsys.readouterr().err
    assert not (tmp_path / "cs").exists()


@pytest.mark.parametrize("sets, needle", [
    (["colors=gray,pink"], "colors: unknown 'pink'"),
    (["shapes=cube,cone"], "shapes: unknown 'cone'"),
    (["camera_height=-1"], "camera_height: camera height must be > 0"),
    (["camera_heights=0.6,-0.5"], "camera_heights: camera height must be > 0"),
    (["max_objects=10", "extent=0.3"], "max_objects: 10 objects of radius 0.35"),
    (["min_objects=10", "max_retries=1", "max_restarts=1", "min_gap=1.0", "n_val=0", "n_test=0"],
     "placement: could not place 10 objects"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, sets, needle):
    args = ["generate", "clevr", "--out", str(tmp_path / "bad"), "--image-size", "32"]
    for s in ["n_train=2", "n_val=1", "n_test=1", *sets]:
        args += ["--set", s]
    assert main(args) == 2
    # a failure while rendering comes after the progress bar: the error is still one line, the last
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench: error: ")]
    assert len(err) == 1 and needle in err[0]
