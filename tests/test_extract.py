"""Extraction: documented tokens of the oracle and pixels backbones (exact values, computed
independently from the dataset), views of a real model, layer parsing and resolution policy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_backbones import tiny_checkpoint

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from evaluators.backbones import resolve_backbone
from evaluators.cache.extract import dataset_side, extract_activations, parse_layers


@pytest.fixture(scope="module")
def balanced(balanced_small) -> Dataset:
    return Dataset(balanced_small)


@pytest.fixture(scope="module")
def uniform(uniform_small) -> Dataset:
    return Dataset(uniform_small)


@pytest.fixture(scope="module")
def dino_reg(tmp_path_factory):
    return tiny_checkpoint("dinov2-reg", tmp_path_factory.mktemp("ckpt") / "dino-reg")[1]


def rows(ds: Dataset, split: str = "test") -> list[dict]:
    return list(ds.iter_scenes(split))


def extract(spec, ds, tmp_path, **kw):
    return extract_activations(spec, ds, "test", cache_dir=tmp_path, progress=False, **kw)


def test_oracle_objects_and_features_are_the_codes(balanced, tmp_path):
    f, o, _ = balanced.codes("test")
    acts = extract("oracle:objects", balanced, tmp_path, token_choices=("cls", "mean"))
    assert (acts.layers, acts.grid, acts.info.n_layers, acts.info.width) == ([0], None, 0, 64)
    np.testing.assert_array_equal(acts.get(0, "cls"), o)
    np.testing.assert_array_equal(acts.get(0, "mean"), o)
    feats = extract("oracle:features", balanced, tmp_path)
    np.testing.assert_array_equal(feats.get(0, "cls"), f)
    with pytest.raises(BenchError, match="no spatial tokens"):
        extract("oracle:objects", balanced, tmp_path, token_choices=("all",))


def test_oracle_mix_carries_objects_for_a_seeded_fraction(balanced, tmp_path):
    f, o, _ = balanced.codes("test")
    ids = [r["scene_id"] for r in balanced.table("test", ["scene_id"]).to_pylist()]
    z = extract("oracle:mix-0.5", balanced, tmp_path).get(0, "cls")
    m = np.array([derive_seed("oracle:mix", 0, s) / 2.0**63 < 0.5 for s in ids], dtype=np.float32)
    assert 0 < m.sum() < len(ids)
    np.testing.assert_array_equal(z, np.concatenate([o * m[:, None], f, m[:, None]], axis=1))
    assert extract("oracle:mix-0", balanced, tmp_path).get(0, "cls")[:, -1].sum() == 0
    one = extract("oracle:mix-1", balanced, tmp_path).get(0, "cls")
    np.testing.assert_array_equal(one[:, :64], o)


@pytest.mark.parametrize("name", ["balanced", "uniform"])  # 256 px paper layout; 64 px with overlapping objects
def test_oracle_patches_are_the_one_hots_of_the_dominant_object_and_a_background_flag(name, request, tmp_path):
    ds = request.getfixturevalue(name)
    space = ds.feature_space
    acts = extract("oracle:patches", ds, tmp_path, token_choices=("cls", "all"))
    side = dataset_side(ds, "test")
    g = side // 16
    assert acts.grid == (g, g) and acts.info.width == space.n_features + 1
    tokens = acts.get(0, "all")
    flags = 0
    for i, row in enumerate(rows(ds)):
        conj = {o["id"]: o["conj"] for o in row["objects"]}
        for t in range(g * g):
            r, c = divmod(t, g)
            block = row["mask"][16 * r:16 * r + 16, 16 * c:16 * c + 16]
            counts = {k: int((block == k).sum()) for k in np.unique(block)}
            objects = {k: n for k, n in counts.items() if k != 0}
            expected = np.zeros(space.n_features + 1, dtype=np.float32)
            if objects:
                best = max(sorted(objects), key=lambda k: objects[k])  # most pixels; ties -> lowest id
                for off, v in zip(space.offsets, space.conj_values(conj[best])):
                    expected[off + v] = 1
            # the IsSameObject label of the patch is background: it covers the largest share
            expected[-1] = float(counts.get(0, 0) >= max(objects.values(), default=0))
            flags += bool(objects) and expected[-1] == 1  # border patches: object one-hots and the flag
            np.testing.assert_array_equal(tokens[i, t], expected)
    np.testing.assert_allclose(acts.get(0, "cls"), tokens.astype(np.float32).mean(axis=1), atol=1e-3)
    assert tokens.sum() > 0 and flags > 0


def test_pixels_tokens_are_raw_patches(uniform, tmp_path):
    acts = extract("pixels:8", uniform, tmp_path, token_choices=("cls+mean", "all"))
    assert acts.grid == (8, 8) and acts.info.width == 192
    tokens = acts.get(0, "all")
    for i, row in enumerate(rows(uniform)):
        img = row["image"].astype(np.float32) / 255
        for t in (0, 9, 63):
            r, c = divmod(t, 8)
            np.testing.assert_allclose(tokens[i, t], img[8 * r:8 * r + 8, 8 * c:8 * c + 8].ravel(), atol=1e-3)
    both = acts.get(0, "cls+mean")
    np.testing.assert_allclose(both[:, :192], tokens.astype(np.float32).mean(axis=1), atol=1e-3)
    np.testing.assert_array_equal(acts.get(0, "cls"), both[:, :192])  # cls and mean are slices of cls+mean


def test_model_views_use_spatial_tokens_only(uniform, dino_reg, tmp_path):
    """cls = token 0; mean and all = patch tokens after the 4 registers, in row-major grid order."""
    acts = extract(str(dino_reg), uniform, tmp_path, token_choices=("cls", "mean", "all", "cls+mean"), batch_size=7)
    assert (acts.layers, acts.grid, acts.n) == ([0, 1, 2], (4, 4), 20)
    bb = resolve_backbone(str(dino_reg))
    images = [{"bytes": r["image"]["bytes"], "path": None}
              for r in uniform.table("test", ["image"]).to_pylist()]
    hs = bb.hidden_states(bb.prepare({"image": images}, 32), [0, 1, 2])
    for layer, h in enumerate(hs):
        spatial = h[:, 5:]
        for tokens, ref in (("cls", h[:, 0]), ("mean", spatial.mean(1)), ("all", spatial)):
            got = acts.get(layer, tokens)
            assert isinstance(got, np.memmap) and got.dtype == np.float16
            np.testing.assert_allclose(got, ref.numpy(), atol=2e-3, rtol=2e-3)
        np.testing.assert_allclose(acts.get(layer, "cls+mean"), torch.cat([h[:, 0], spatial.mean(1)], 1), atol=2e-3,
                                   rtol=2e-3)
    assert not np.allclose(acts.get(2, "mean"), h[:, 1:].mean(1).numpy(), atol=2e-3)  # registers would change it


def test_bf16_autocast_is_close_to_fp32(uniform, dino_reg, tmp_path):
    a = extract(str(dino_reg), uniform, tmp_path, layers="last").get(2, "cls").astype(np.float32)
    b = extract(str(dino_reg), uniform, tmp_path, layers="last", dtype="bf16").get(2, "cls").astype(np.float32)
    assert not np.array_equal(a, b)
    np.testing.assert_allclose(a, b, atol=0.1, rtol=0.05)


def test_resolution_policy(uniform, balanced, dino_reg, tmp_path):
    bb = resolve_backbone(str(dino_reg))  # patch 8, native 32
    assert bb.input_side(64) == 32 and bb.input_side(64, image_size=48) == 48
    assert bb.input_side(64, "match-grid") == 32  # the dataset's 16-px grid: 4 x 4 patches
    assert bb.input_side(256, "match-grid") == 128
    with pytest.raises(BenchError, match="multiple"):
        bb.input_side(64, image_size=50)
    with pytest.raises(BenchError, match="resolution"):
        bb.input_side(64, "bogus")
    acts = extract(str(dino_reg), uniform, tmp_path, resolution="match-grid", image_size=128, layers="last")
    assert acts.grid == (8, 8)
    assert extract("pixels", balanced, tmp_path, layers="all").grid == (16, 16)


def test_parse_layers():
    assert parse_layers("all", 12) == list(range(13))
    assert parse_layers("last", 12) == [12] and parse_layers("mid", 12) == [6]
    assert parse_layers("0.5,0.25", 24) == [6, 12] and parse_layers("-1", 12) == [12]
    assert parse_layers([0, 3, 3], 12) == [0, 3] and parse_layers("all", 0) == [0]
    for bad in ("13", "x", "1.5", []):
        with pytest.raises(BenchError):
            parse_layers(bad, 12)


def test_bad_arguments_are_bench_errors(uniform, tmp_path):
    for kw in ({"token_choices": ("cls", "patch")}, {"dtype": "int8"}, {"device": "tpu"}, {"batch_size": 0}):
        with pytest.raises(BenchError):
            extract("oracle:objects", uniform, tmp_path, **kw)
    acts = extract("oracle:objects", uniform, tmp_path)
    with pytest.raises(BenchError, match="not extracted"):
        acts.get(0, "mean")
    with pytest.raises(BenchError, match="layer"):
        acts.get(1, "cls")


def test_bench_extract_cli(uniform_small, tmp_path, capsys):
    from bench.cli import main

    args = ["extract", "--model", "oracle:features", "--dataset", str(uniform_small), "--cache-dir", str(tmp_path)]
    assert main([*args, "--split", "test", "--split", "val", "--tokens", "cls,mean"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["test", "val"] and "20 rows" in out[0]
    assert main([*args, "--tokens", "patch"]) == 2
    assert "patch" in capsys.readouterr().err
    two = [*args[:-1], str(tmp_path / "two")]  # a cache of its own: the entries above would serve both
    assert main([*two, "--split", "test", "--tokens", "cls", "--also", "last:cls,mean"]) == 0  # one pass, two entries
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "tokens cls ->" in out[0] and "tokens cls,mean ->" in out[1], out
    for bad in ("last", "last:", ":all"):
        assert main([*args, "--also", bad]) == 2
        err = capsys.readouterr().err
        assert err.strip().count("\n") == 0 and "is not LAYERS:TOKENS" in err, err
