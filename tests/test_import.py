"""`bench import ade20k|vg|clevr`: tiny copies of each source in its exact on-disk layout,
written here, imported, shown, evaluated and ranked offline; malformed copies stop with one
line and leave nothing behind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.results import read_results

CLEVR_COLORS = {"gray": (87, 87, 87), "red": (173, 35, 35), "blue": (42, 75, 215), "green": (29, 105, 20),
                "brown": (129, 74, 25), "purple": (129, 38, 192), "cyan": (41, 208, 208), "yellow": (255, 238, 51)}
CLEVR_W, CLEVR_H = 48, 32


# -- source fixtures, in each release's layout --------------------------------------------------------


def write_clevr(root: Path, n_train: int = 48, n_val: int = 16, seed: int = 0) -> Path:
    """CLEVR_v1.0/scenes/CLEVR_<split>_scenes.json + images/<split>/CLEVR_<split>_NNNNNN.png,
    each object drawn as a disc of its colour at its pixel_coords."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        scenes = []
        for i in range(n):
            name = f"CLEVR_{split}_{i:06d}.png"
            image = np.full((CLEVR_H, CLEVR_W, 3), 128, np.uint8)
            objects = []
            for _ in range(int(rng.integers(2, 4))):
                obj = {"color": str(rng.choice(list(CLEVR_COLORS))), "size": str(rng.choice(["large", "small"])),
                       "material": str(rng.choice(["rubber", "metal"])),
                       "shape": str(rng.choice(["cube", "sphere", "cylinder"])),
                       "3d_coords": [0.0, 0.0, 0.35], "rotation": 0.0,
                       "pixel_coords": [int(rng.integers(6, CLEVR_W - 6)), int(rng.integers(6, CLEVR_H - 6)),
                                        float(rng.uniform(8, 12))]}
                yy, xx = np.mgrid[0:CLEVR_H, 0:CLEVR_W]
                x, y, _ = obj["pixel_coords"]
                image[(xx - x) ** 2 + (yy - y) ** 2 <= 9] = CLEVR_COLORS[obj["color"]]
                objects.append(obj)
            Image.fromarray(image).save(root / "images" / split / name)
            scenes.append({"split": split, "image_index": i, "image_filename": name, "objects": objects,
                           "relationships": {}, "directions": {}})
        info = {"split": split, "license": "Creative Commons Attribution (CC BY 4.0)", "version": "1.0",
                "date": "2/14/2017"}
        (root / "scenes").mkdir(exist_ok=True)
        (root / "scenes" / f"CLEVR_{split}_scenes.json").write_text(json.dumps({"info": info, "scenes": scenes}))
    return root


VG_NAMES = ("car", "cat", "dog", "tree", "ball")
VG_RGB = {"red": (200, 30, 30), "blue": (30, 60, 210), "green": (30, 170, 40), "white": (245, 245, 245)}
VG_COLORS = tuple(VG_RGB)


def write_vg(root: Path, n: int = 120, seed: int = 1, objects: tuple[int, int] = (2, 4)) -> Path:
    """VG/image_data.json, objects.json, attributes.json, VG_100K/<id>.jpg and VG_100K_2/<id>.jpg.

    Each image holds `objects` (inclusive range) boxes: most coloured (and "wooden", drawn in
    their colour on a dark noise background), some "big", some with no 'attributes' field."""
    rng = np.random.default_rng(seed)
    for d in ("VG_100K", "VG_100K_2"):
        (root / d).mkdir(parents=True)
    image_data, records, attributes = [], [], []
    oid = 1000
    for iid in range(1, n + 1):
        folder = "VG_100K" if iid % 2 else "VG_100K_2"
        w, h = 40, 30
        image = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
        image_data.append({"image_id": iid, "url": f"https://cs.stanford.edu/people/rak248/{folder}/{iid}.jpg",
                           "width": w, "height": h, "coco_id": None, "flickr_id": None})
        objs, attrs = [], []
        for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
            oid += 1
            x, y = int(rng.integers(0, 30)), int(rng.integers(0, 20))
            box = {"object_id": oid, "x": x, "y": y, "w": int(rng.integers(4, 12)), "h": int(rng.integers(4, 12)),
                   "names": [str(rng.choice(VG_NAMES))], "synsets": []}
            objs.append(box)
            kind = rng.choice(3, p=[0.15, 0.7, 0.15])
            record = dict(box)
            if kind == 1:
                color = str(rng.choice(VG_COLORS))
                record["attributes"] = [color, "wooden"]
                image[y:y + box["h"], x:x + box["w"]] = VG_RGB[color]
            elif kind == 2:
                record["attributes"] = ["big"]
            attrs.append(record)  # kind 0: no 'attributes' field, as in the release
        Image.fromarray(image).save(root / folder / f"{iid}.jpg", quality=95)
        records.append({"image_id": iid, "objects": objs})
        attributes.append({"image_id": iid, "attributes": attrs})
    for name, data in (("image_data", image_data), ("objects", records), ("attributes", attributes)):
        (root / f"{name}.json").write_text(json.dumps(data))
    return root


ADE_CLASSES = ("wall", "floor, flooring", "car, auto, automobile, machine, motorcar", "tree", "sky")


def write_ade20k(root: Path, n_train: int = 16, n_val: int = 8, seed: int = 2) -> Path:
    """ADE20K_2021_17_01/images/ADE/<split>/<scene>/ADE_*.jpg with its .json, its _seg.png
    (class (R/10)*256+G = name_ndx, instance in B = 10 (k+1): later objects in front, whatever
    their depth_ordering_rank) and ADE_*/instance_NNN_ADE_*.png amodal masks (0/255) per
    object; a part object (part_level 1, `hasparts` a bare id as in the release) beside them."""
    rng = np.random.default_rng(seed)
    root = root / "ADE20K_2021_17_01"
    for split, prefix, n in (("training", "train", n_train), ("validation", "val", n_val)):
        folder = root / "images" / "ADE" / split / "urban" / "street"
        folder.mkdir(parents=True)
        for i in range(n):
            stem = f"ADE_{prefix}_{i + 1:08d}"
            (folder / stem).mkdir()
            w, h = 96, 64
            image = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
            seg = np.zeros((h, w, 3), np.uint8)
            objects = []
            n_obj = int(rng.integers(2, 4))
            for k, c in enumerate(rng.choice(len(ADE_CLASSES), n_obj, replace=False)):
                m = np.zeros((h, w), np.uint8)
                x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 24))
                m[y0:y0 + 24, x0:x0 + 40] = 255
                image[m > 0] = rng.integers(60, 255, 3, dtype=np.uint8)
                seg[m > 0] = (0, 100 + c, 10 * (k + 1))
                mask_name = f"{stem}/instance_{k:03d}_{stem}.png"
                Image.fromarray(m).save(folder / mask_name)
                objects.append({"id": k, "name": ADE_CLASSES[c], "name_ndx": 100 + int(c), "hypernym": [],
                                "raw_name": "x", "attributes": [], "depth_ordering_rank": k + 1, "occluded": "no",
                                "crop": "0", "parts": {"hasparts": [], "ispartof": [], "part_level": 0},
                                "instance_mask": mask_name, "polygon": {"x": [], "y": []}})
            objects[0]["parts"]["hasparts"] = n_obj
            Image.fromarray(seg).save(folder / f"{stem}_seg.png")
            objects.append({"id": n_obj, "name": "window", "name_ndx": 1, "hypernym": [], "raw_name": "window",
                            "attributes": [], "depth_ordering_rank": n_obj + 1, "occluded": "no", "crop": "0",
                            "parts": {"hasparts": [], "ispartof": 0, "part_level": 1},
                            "instance_mask": f"{stem}/instance_{n_obj:03d}_{stem}.png", "polygon": {"x": [], "y": []}})
            Image.fromarray(np.zeros((h, w), np.uint8)).save(folder / objects[-1]["instance_mask"])
            Image.fromarray(image).save(folder / f"{stem}.jpg", quality=95)
            ann = {"filename": f"{stem}.jpg", "folder": f"ADE20K_2021_17_01/images/ADE/{split}/urban/street",
                   "imsize": [h, w, 3], "source": {}, "scene": ["outdoor", "urban", "street"], "object": objects}
            (folder / f"{stem}.json").write_text(json.dumps({"annotation": ann}))
    return root


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _oracle_rows(dataset: Path, results: Path, capsys) -> tuple[dict, dict]:
    """Binding rows of oracle:objects and oracle:features (linear) on an imported dataset; all
    must be `prior: empirical` and ok."""
    _ok(["evaluate", "--dataset", str(dataset), "--model", "oracle:objects", "--model", "oracle:features",
         "--probes", "linear", "--epochs", "30", "--device", "cpu", "--results", str(results)], capsys)
    rows = {r["backbone"]: r for r in read_results(results).to_pylist()}
    assert all(r["prior"] == "empirical" and r["status"] == "ok" for r in rows.values())
    return rows["oracle:objects"], rows["oracle:features"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("sources")
    return {"clevr": write_clevr(base / "CLEVR_v1.0"), "vg": write_vg(base / "VG"), "ade20k": write_ade20k(base)}


def _ok(args: list[str], capsys) -> str:
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _fails(args: list[str], capsys) -> str:
    """Exit 2 and one error line (after any progress lines the import had drawn), no traceback."""
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("bench: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and not any("Traceback" in line for line in lines), lines
    return errors[0]


# -- end to end -------------------------------------------------------------------------------------


def test_clevr_import_info_evaluate_leaderboard(sources, tmp_path, capsys):
    """CLEVR: F-disjoint splits recording the source splits, the exact generator-rule prior in the
    card, and binding measured against the blind reference probe: oracle:objects (carries O)
    reads B* > 0 where oracle:features (F only) reads ~0, every row `prior: empirical`."""
    out = tmp_path / "clevr"
    _ok(["import", "clevr", "--src", str(sources["clevr"]), "--out", str(out), "--split-seed", "3",
         "--image-size", "32"], capsys)
    ds = Dataset(out)
    card = ds.card
    assert card["priors"] == "empirical" and card["generator"]["name"] == "import:clevr"
    assert card["provenance"]["source"] == "CLEVR" and "scenes/CLEVR_val_scenes.json" in card["provenance"]["files_read"]
    assert sum(card["splits"][s]["n"] for s in ds.splits) == 64
    assert sum(sum(card["splits"][s]["source_splits"].values()) for s in ds.splits) == 64
    keys = {s: {ds.feature_space.f_key(f) for f in ds.codes(s)[0]} for s in ds.splits}
    assert not (keys["train"] & keys["test"]) and not (keys["train"] & keys["val"]) and not (keys["val"] & keys["test"])
    rules = card["clevr_rules"]
    assert rules["H_O"] == pytest.approx(rules["H_F"] + rules["H_O_given_F"]) and 20 < rules["H_O_given_F"] < 30
    for s in ds.splits:  # plug-in priors of the split's own codes
        f = ds.codes(s)[0]
        _, counts = np.unique(f, axis=0, return_counts=True)
        p = counts / counts.sum()
        assert card["splits"][s]["H_F"] == pytest.approx(float(-(p * np.log2(p)).sum()))
    row = next(ds.iter_scenes("test"))
    assert row["mask"].shape == row["image"].shape[:2] == (32, 32)  # squared from 48 x 32
    assert set(np.unique(row["mask"])) - {0} <= {o["id"] for o in row["objects"]}
    info = _ok(["info", str(out), "--format", "json"], capsys)
    assert json.loads(info)["provenance"]["mask"].startswith("approximate")
    assert all(0 < card["splits"][s]["H_O_given_F_rules"] < rules["H_O_given_F"] for s in ds.splits)
    assert "H_O_given_F_rules" in _ok(["info", str(out), "--format", "csv"], capsys)

    results = tmp_path / "results"
    obj, feat = _oracle_rows(out, results, capsys)
    assert obj["B_star_lo"] > 1.0
    assert feat["B_star"] == pytest.approx(0.0, abs=1e-9)  # the reference reads F, as oracle:features' probe does
    assert obj["H_F"] == pytest.approx(card["splits"]["test"]["H_F"])

    board = _ok(["leaderboard", str(results), "--format", "markdown"], capsys)
    assert "†" in board and "empirical" in board
    err = _fails(["evaluate", "--dataset", str(out), "--model", "pixels", "--unanchored", "--results",
                  str(tmp_path / "none")], capsys)
    assert "prior: empirical" in err and "drop --unanchored" in err
    # IsSameObject reads the (approximate, disc) masks as well
    _ok(["evaluate", "--task", "issameobject", "--dataset", str(out), "--model", "pixels:8", "--probes",
         "majority,cosine", "--device", "cpu", "--results", str(results)], capsys)
    iso = [r for r in read_results(results).to_pylist() if r["task"] == "issameobject"]
    assert {r["probe"] for r in iso} == {"majority", "cosine"} and all(r["status"] == "ok" for r in iso)


def test_vg_import_info_evaluate_leaderboard(sources, tmp_path, capsys):
    """VG:Color with the default split fractions: every split varies, binding is measured against
    the blind reference (oracle:objects, which carries O, reads B* > 0 well above oracle:features,
    which carries F only), and IsSameObject applies: its patch labels come from the masks,
    which here are the objects' boxes (approximate, and the card says so)."""
    out = tmp_path / "vg"
    _ok(["import", "vg", "--src", str(sources["vg"]), "--out", str(out), "--image-size", "32"], capsys)
    ds = Dataset(out)
    card = ds.card
    assert card["priors"] == "empirical" and card["generator"]["name"] == "import:vg-color"
    assert all(card["splits"][s]["n_F_codes"] >= 5 and card["splits"][s]["H_O"] > 2 for s in ds.splits)
    keys = {s: {ds.feature_space.f_key(f) for f in ds.codes(s)[0]} for s in ds.splits}
    assert not (keys["train"] & keys["test"]) and not (keys["train"] & keys["val"]) and not (keys["val"] & keys["test"])
    info = json.loads(_ok(["info", str(out), "--format", "json"], capsys))
    assert info["provenance"]["source"] == "Visual Genome" and info["provenance"]["mask"].startswith("boxes")

    results = tmp_path / "results"
    obj, feat = _oracle_rows(out, results, capsys)
    ref = obj["H_O_given_F"]  # empirical rows: the blind reference probe's test code length
    assert obj["B_star"] == pytest.approx(ref - obj["L_O_given_F"]) and obj["L_O_given_F"] < 0.3 * ref
    assert obj["B_star_lo"] > 1.0
    # oracle:features' Z is F itself, which is what the reference reads: the linear probes coincide
    assert feat["B_star"] == pytest.approx(0.0, abs=1e-9) and feat["B_star_hi"] == pytest.approx(0.0, abs=1e-9)
    assert obj["H_F"] == pytest.approx(card["splits"]["test"]["H_F"])
    board = _ok(["leaderboard", str(results), "--format", "markdown"], capsys)
    assert "oracle:objects" in board and "†" in board and "empirical" in board

    _ok(["evaluate", "--task", "issameobject", "--dataset", str(out), "--model", "pixels:8", "--probes",
         "majority,cosine", "--device", "cpu", "--results", str(results)], capsys)
    iso = [r for r in read_results(results).to_pylist() if r["task"] == "issameobject"]
    assert {r["probe"] for r in iso} == {"majority", "cosine"}
    assert all(r["status"] == "ok" and r["n_test"] > 0 for r in iso)
    by_probe = {r["probe"]: r for r in iso}  # boxes are drawn in their colour: same-box patches look alike
    assert by_probe["majority"]["auroc"] == 0.5 and by_probe["cosine"]["auroc"] > 0.6
    board = _ok(["leaderboard", str(results), "--task", "issameobject"], capsys)
    assert "IsSameObject accuracy" in board and "pixels:8" in board


def test_imported_split_without_object_entropy_says_to_import_more(tmp_path, capsys):
    """One object per image and few F codes: a split whose scenes all hold the same object has
    H(O) = 0, and the refusal says what to change in the import (not to generate a dataset)."""
    src = write_vg(tmp_path / "VG", n=60, objects=(1, 1))
    out = tmp_path / "vg"
    _ok(["import", "vg", "--src", str(src), "--out", str(out), "--top-n", "3", "--image-size", "16"], capsys)
    assert min(Dataset(out).card["splits"][s]["H_O"] for s in ("train", "val", "test")) == 0
    err = _fails(["evaluate", "--dataset", str(out), "--model", "oracle:objects", "--results",
                  str(tmp_path / "results")], capsys)
    assert "H(O) = 0" in err and "--max-scenes" in err and "generate" not in err


def test_vg_color_and_topattr_codings(sources, tmp_path, capsys):
    """VG: colour x name (or top attribute x name) over the top-N, boxes as masks, images from
    both VG_100K folders; objects outside the vocabulary are left out."""
    out = tmp_path / "vg"
    _ok(["import", "vg", "--src", str(sources["vg"]), "--out", str(out), "--top-n", "3", "--image-size", "32"],
        capsys)
    ds = Dataset(out)
    groups = dict((g["name"], g["values"]) for g in ds.card["feature_space"]["groups"])
    assert set(groups) == {"color", "name"} and len(groups["color"]) == 3 and set(groups["color"]) <= set(VG_COLORS)
    assert ds.card["provenance"]["mask"].startswith("boxes")
    rows = [r for s in ds.splits for r in ds.iter_scenes(s)]
    assert all(r["objects"] for r in rows) and {r["source_split"] for r in rows} == {"all"}
    for r in rows:
        for o in r["objects"]:
            assert o["attributes"][0] in groups["color"] and o["attributes"][1] in groups["name"]
            x0, y0, x1, y1 = o["bbox"]  # the box, scaled from 40 x 30 to 32 x 32
            assert 0 <= x0 < x1 <= 32 and 0 <= y0 < y1 <= 32
            assert abs(o["full_px"] - (x1 - x0) * (y1 - y0)) <= x1 - x0 + y1 - y0 and o["full_px"] >= o["visible_px"]
    assert {r["image"].shape for r in rows} == {(32, 32, 3)}
    again = tmp_path / "vg-again"  # same source and split seed: the same rows, byte for byte
    _ok(["import", "vg", "--src", str(sources["vg"]), "--out", str(again), "--top-n", "3", "--image-size", "32"],
        capsys)
    assert {s: Dataset(again).fingerprint(s) for s in ds.splits} == {s: ds.fingerprint(s) for s in ds.splits}

    top = tmp_path / "vg-top"
    _ok(["import", "vg", "--src", str(sources["vg"]), "--out", str(top), "--coding", "vg-topattr", "--top-n", "3",
         "--image-size", "32"], capsys)
    values = Dataset(top).card["feature_space"]["groups"][0]
    assert values["name"] == "attribute" and set(values["values"]) <= {"wooden", "big", *VG_COLORS}
    assert "wooden" in values["values"]  # every coloured object is also wooden: the most frequent attribute


def test_ade20k_issameobject_and_no_binding(sources, tmp_path, capsys):
    """ADE20K: instance masks from the per-instance PNGs, parts listed by name; IsSameObject runs
    at once on the masks, and binding is refused (one group: O = F)."""
    out = tmp_path / "ade"
    _ok(["import", "ade20k", "--src", str(sources["ade20k"]), "--out", str(out), "--top-n", "3",
         "--image-size", "96", "--val-fraction", "0.25", "--test-fraction", "0.25"], capsys)
    ds = Dataset(out)
    assert ds.card["provenance"]["version"] == "2021_17_01"
    licence = ds.card["provenance"]["licence"]  # cites the Terms of Use, asserts no licence of its own
    assert "Terms of Use" in licence and "groups.csail.mit.edu/vision/datasets/ADE20K" in licence
    assert "BSD" not in licence
    values = ds.card["feature_space"]["groups"][0]["values"]
    assert len(values) == 4 and values[-1] == "other"
    rows = [r for s in ds.splits for r in ds.iter_scenes(s)]
    assert {r["source_split"] for r in rows} == {"training", "validation"}
    root = sources["ade20k"] / "images" / "ADE"
    for r in rows:
        assert r["mask"].shape == (96, 96) and len(r["objects"]) in (2, 3)  # the part is not an instance
        assert r["objects"][0]["parts"] == ["window"]
        # the visible instances are the seg's, not the depth ranks': object k+1 where B = 10 (k+1)
        seg = np.asarray(Image.open(root / r["source_key"].replace(".json", "_seg.png")))[..., 2] // 10
        assert np.array_equal(r["mask"], np.asarray(Image.fromarray(seg).resize((96, 96), Image.Resampling.NEAREST)))
        # amodal 24 x 40 px, rows scaled 1.5x (never below what resampling left visible)
        assert all(o["full_px"] == max(36 * 40, o["visible_px"]) for o in r["objects"])
        assert r["objects"][-1]["visibility"] > 0.95  # the last one drawn is in front (up to resampling)

    results = tmp_path / "results"
    _ok(["evaluate", "--task", "issameobject", "--dataset", str(out), "--model", "pixels:8",
         "--probes", "diag-quadratic,majority", "--epochs", "3", "--device", "cpu", "--results", str(results)],
        capsys)
    rows = read_results(results).to_pylist()
    assert {r["probe"] for r in rows} == {"diag-quadratic", "majority"}
    assert all(r["status"] == "ok" and r["n_test"] > 0 for r in rows)
    _ok(["leaderboard", str(results), "--task", "issameobject"], capsys)
    err = _fails(["evaluate", "--dataset", str(out), "--model", "oracle:objects", "--results", str(results)], capsys)
    assert "O = F" in err and "issameobject" in err


# -- malformed sources ----------------------------------------------------------------------------


def _corrupt_clevr_json(root: Path) -> None:
    (root / "scenes" / "CLEVR_train_scenes.json").write_text(json.dumps({"info": {}, "scenes": {"a": 1}}))


def _missing_clevr_image(root: Path) -> None:
    (root / "images" / "val" / "CLEVR_val_000003.png").unlink()


def _broken_vg_image(root: Path) -> None:
    for path in (root / "VG_100K_2").glob("*.jpg"):
        path.write_bytes(b"not a jpeg")


def _missing_vg_file(root: Path) -> None:
    (root / "attributes.json").unlink()


def _vg_box_outside(root: Path) -> None:
    """Every object of image 3 moved wholly off its 40 x 30 image (it was accepted: an object in O
    with no pixel to see)."""
    records = json.loads((root / "objects.json").read_text())
    for obj in records[2]["objects"]:
        obj["x"] = 400
    (root / "objects.json").write_text(json.dumps(records))


def _ade_mask_size(root: Path) -> None:
    path = next((root / "images" / "ADE" / "validation").rglob("instance_001_*.png"))
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(path)


def _ade_missing_seg(root: Path) -> None:
    next((root / "images" / "ADE" / "training").rglob("ADE_train_00000003_seg.png")).unlink()


def _ade_bad_json(root: Path) -> None:
    path = next((root / "images" / "ADE" / "training").rglob("ADE_train_00000002.json"))
    path.write_text(json.dumps({"annotation": {"filename": "x.jpg"}}))


@pytest.mark.parametrize("source, breaker, expect", [
    ("clevr", _corrupt_clevr_json, "no 'scenes' list"),
    ("clevr", _missing_clevr_image, "missing"),
    ("vg", _broken_vg_image, "not a readable image"),
    ("vg", _missing_vg_file, "missing"),
    ("vg", _vg_box_outside, "objects.json: image 3: object 10"),
    ("ade20k", _ade_mask_size, "mask is 10x10 but its image is 96x64"),
    ("ade20k", _ade_bad_json, "annotation lacks 'object'"),
    ("ade20k", _ade_missing_seg, "ADE_train_00000003_seg.png"),
])
def test_malformed_source_exits_2_with_one_line_and_writes_nothing(source, breaker, expect, tmp_path, capsys):
    base = tmp_path / "src"
    root = {"clevr": lambda: write_clevr(base / "CLEVR_v1.0", 12, 4), "vg": lambda: write_vg(base / "VG", 40),
            "ade20k": lambda: write_ade20k(base, 4, 4)}[source]()
    breaker(root)
    out = tmp_path / "out" / "ds"
    (tmp_path / "out").mkdir()
    err = _fails(["import", source, "--src", str(root), "--out", str(out), "--val-fraction", "0.2",
                  "--test-fraction", "0.2", "--image-size", "32"], capsys)
    assert expect in err and "expected layout" in err
    assert list((tmp_path / "out").iterdir()) == []  # no dataset, no temp dir


def test_missing_root_and_existing_output(tmp_path, capsys):
    err = _fails(["import", "clevr", "--src", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")], capsys)
    assert "CLEVR_train_scenes.json" in err and "expected layout" in err
    (tmp_path / "empty").mkdir()
    err = _fails(["import", "ade20k", "--src", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert "images/ADE" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    src = write_clevr(tmp_path / "c", 12, 4)
    err = _fails(["import", "clevr", "--src", str(src), "--out", str(tmp_path / "full")], capsys)
    assert "--overwrite" in err
    err = _fails(["import", "clevr", "--src", str(src), "--out", str(tmp_path / "few"), "--max-scenes", "3"], capsys)
    assert "3 distinct F codes among 3 scenes are too few" in err and not (tmp_path / "few").exists()


def test_clevr_rules_analytic_prior():
    """Under CLEVR's sampling rules P(F = f) sums to 1 over every F code, and H(O|F) = H(O) − H(F)."""
    from generators.importers.clevr_v1 import GROUPS, clevr_rules, rules_given_f

    sizes = [len(v) for _, v in GROUPS]
    total = sum(math.prod(math.comb(s, a) for s, a in zip(sizes, act)) * rules_given_f(act)[0]
                for act in np.ndindex(*[s + 1 for s in sizes]) if min(act) > 0)
    assert total == pytest.approx(1.0, abs=1e-12)
    r = clevr_rules()
    assert r["H_O_given_F"] == pytest.approx(r["H_O"] - r["H_F"])
    # one object of one kind: F = f fixes O exactly
    assert rules_given_f((1, 1, 1, 1))[1] == 0.0


def test_empirical_rows_are_marked_and_never_ranked_beside_exact_ones():
    """A `prior: empirical` cell is marked † with its own note and ranks only among its kind,
    below the exact-prior rows; a board without unanchored rows keeps the unanchored note out."""
    from bench.commands.common import Format
    from leaderboards.board import build_leaderboard
    from leaderboards.render import render_leaderboard
    from tests.test_leaderboard import result_row

    rows = [result_row("A", "linear", 0.30), result_row("E", "linear", 0.90, prior="empirical"),
            result_row("F", "linear", 0.50, prior="empirical")]
    board = build_leaderboard(rows)
    assert [(r.backbone, r.rank) for r in board.rows] == [("A", 1), ("E", 1), ("F", 2)]
    md = render_leaderboard(board, Format.markdown)
    assert "| 1 | E | 90.0 ± 2.0 † |" in md and "† prior: empirical (imported real images" in md
    assert "unanchored (prior: none)" not in md
    rows.append({**result_row("G", "linear", -0.5, prior="empirical"), "B_star_hi": -0.1})  # worse than reference
    assert "H(O|F) is the blind reference probe's L^ref_O|F" in render_leaderboard(build_leaderboard(rows),
                                                                                     Format.markdown)
