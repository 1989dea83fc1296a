"""Generated ColorShape scenes: codes, pixels, masks and per-row priors agree exactly."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.core.dataset import Dataset, decode_image, decode_mask
from generators.colorshape import PALETTE, SHAPES, stencil
from generators.priors import coverage_count, omega_size


@pytest.fixture(params=["balanced_small", "uniform_small"])
def ds(request) -> Dataset:
    return Dataset(request.getfixturevalue(request.param))


def test_o_to_f_matches_f_column(ds):
    for split in ds.splits:
        f, o, _ = ds.codes(split)
        assert f.shape == (ds.num_rows(split), ds.feature_space.n_features)
        assert np.array_equal(ds.feature_space.o_to_f(o), f)


def test_objects_match_o_and_are_distinct(ds):
    for scene in ds.iter_scenes("test"):
        conjs = [o["conj"] for o in scene["objects"]]
        assert len(set(conjs)) == len(conjs)
        assert np.array_equal(ds.feature_space.encode_o(conjs), np.array(scene["O"], dtype=np.uint8))
        for obj in scene["objects"]:
            assert tuple(obj["attributes"]) == ds.feature_space.conj_names(obj["conj"])


def test_pixels_have_object_colour_inside_box_and_mask_agrees(ds):
    colours = list(PALETTE.values())
    n_shapes = len(ds.feature_space.groups[1][1])
    for scene in ds.iter_scenes("test"):
        img, mask = scene["image"], scene["mask"]
        assert img.shape[:2] == mask.shape and img.dtype == np.uint8
        assert set(np.unique(mask)) - {0} <= {o["id"] for o in scene["objects"]}
        assert (img[mask == 0] == 255).all()  # background is white
        for obj in scene["objects"]:
            x0, y0, x1, y1 = obj["bbox"]
            ys, xs = np.nonzero(mask == obj["id"])
            assert len(ys) == obj["visible_px"]
            if len(ys):
                assert xs.min() >= x0 and xs.max() < x1 and ys.min() >= y0 and ys.max() < y1
            colour = colours[obj["conj"] // n_shapes]
            assert (img[mask == obj["id"]] == colour).all()
            shape = SHAPES[obj["conj"] % n_shapes]
            assert obj["full_px"] == int(stencil(shape, x1 - x0).sum())
            assert obj["visibility"] == pytest.approx(obj["visible_px"] / obj["full_px"])


def test_non_overlapping_layout_respects_margin(balanced_small):
    ds = Dataset(balanced_small)
    margin, size = ds.card["config"]["margin"], ds.card["config"]["object_size"]
    for scene in ds.iter_scenes("train"):
        boxes = [o["bbox"] for o in scene["objects"]]
        assert all(o["visibility"] == 1.0 for o in scene["objects"])
        for (ax, ay, *_), (bx, by, *_) in [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]]:
            assert abs(ax - bx) >= size + margin or abs(ay - by) >= size + margin
        for x0, y0, x1, y1 in boxes:
            assert x0 >= margin and y0 >= margin and x1 <= 256 - margin and y1 <= 256 - margin


def test_occlusion_bookkeeping_with_overlap(uniform_small):
    ds = Dataset(uniform_small)
    seen_partial = False
    for scene in ds.iter_scenes("train"):
        for obj in scene["objects"]:
            assert obj["visible_px"] == int((scene["mask"] == obj["id"]).sum())
            assert 0 <= obj["visibility"] <= 1
            seen_partial |= obj["visibility"] < 1
    assert seen_partial  # 40 scenes of up to 10 overlapping objects on 64 px


def test_balanced_rows_follow_the_distribution(balanced_small):
    ds = Dataset(balanced_small)
    f, o, h = ds.codes("test")
    assert (o.sum(1) == 18).all()
    assert (f[:, :8].sum(1) == 6).all() and (f[:, 8:].sum(1) == 6).all()
    assert np.allclose(h, math.log2(coverage_count(18, (6, 6))))


def test_uniform_rows_store_their_own_h(uniform_small):
    ds = Dataset(uniform_small)
    f, o, h = ds.codes("val")
    assert ((o.sum(1) >= 1) & (o.sum(1) <= 10)).all()
    for row_f, row_h in zip(f, h):
        a = ds.feature_space.active_counts(row_f)
        assert row_h == pytest.approx(math.log2(omega_size(a, 1, 10)))


def test_test_split_f_codes_unseen_in_train(ds):
    train = {ds.feature_space.f_key(r) for r in ds.codes("train")[0]}
    test = {ds.feature_space.f_key(r) for r in ds.codes("test")[0]}
    assert not train & test


def test_row_roundtrips_through_pyarrow_in_hf_image_convention(balanced_small):
    ds = Dataset(balanced_small)
    table = pq.read_table(ds.files("test")[0])
    row = table.slice(0, 1).to_pylist()[0]
    assert set(row["image"]) == {"bytes", "path"} and row["image"]["path"] is None
    assert row["image"]["bytes"][:8] == b"\x89PNG\r\n\x1a\n"
    assert decode_image(row["image"]).shape == (256, 256, 3)
    assert decode_mask(row["mask"]).dtype == np.uint8
    assert str(table.schema.field("F").type) == "list<element: uint8>"
    assert table.schema.field("seed").type == "int64"
    assert {"scene_id", "seed", "image", "mask", "F", "O", "H_O_given_F", "objects", "content_hash"} <= set(table.column_names)
    first = next(ds.iter_batches("test", batch_size=5))
    assert first.num_rows == 5
