"""The segmentation task (evaluators/tasks/segmentation): its metrics on hand-made label maps, its heads on
tokens whose answer is known (one-hot of the patch's class, of its instance, noise), and `bench evaluate
--task segmentation` end to end, its rows in the results schema and on the leaderboard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench.core.dataset import Dataset
from bench.core.results import RESULT_SCHEMA, make_table, provenance, read_results, write_run
from evaluators.tasks.segmentation.heads import HeadConfig
from evaluators.tasks.segmentation.labels import class_names, split_labels
from evaluators.tasks.segmentation.metrics import (adjusted_rand_index, hungarian_iou, instance_scores,
                                                   semantic_scores)
from evaluators.tasks.segmentation.run import evaluate_activations
from tests.helpers import make_dataset

GRID = (8, 8)  # 16 px patches of the 128 px scenes


# ---------------------------------------------------------------- metrics on hand-made maps

def test_adjusted_rand_index_hand_values():
    """Values sklearn.metrics.adjusted_rand_score gives (4/7 and 8/33), and its special cases."""
    assert adjusted_rand_index(np.array([0, 0, 1, 1]), np.array([0, 0, 1, 2])) == pytest.approx(4 / 7)
    assert adjusted_rand_index(np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 1, 1, 2, 2])) == pytest.approx(8 / 33)
    assert adjusted_rand_index(np.array([3, 3, 5, 5]), np.array([1, 1, 0, 0])) == 1.0  # names do not matter
    assert adjusted_rand_index(np.array([1, 1, 1]), np.array([0, 0, 0])) == 1.0  # one cluster each
    assert adjusted_rand_index(np.array([1, 1, 1, 1]), np.array([0, 0, 1, 1])) == 0.0
    assert adjusted_rand_index(np.array([7]), np.array([2])) == 1.0


def test_adjusted_rand_index_matches_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")  # the `bench` extra; no runtime dependency
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        a, b = rng.integers(0, rng.integers(1, 6), n), rng.integers(0, rng.integers(1, 6), n)
        assert adjusted_rand_index(a, b) == pytest.approx(sklearn_metrics.adjusted_rand_score(a, b), abs=1e-12)


def test_hungarian_iou_hand_values():
    true = np.array([0, 0, 1, 1, 2, 2])
    # background <-> 5 (IoU 1), instance 1 <-> 3 (2/3), instance 2 <-> 7 (1/2): mean over instances 7/12
    assert hungarian_iou(np.array([5, 5, 3, 3, 3, 7]), true) == pytest.approx(7 / 12)
    assert hungarian_iou(np.array([4, 4, 9, 9, 1, 1]), true) == 1.0  # a permutation of the slots
    assert hungarian_iou(np.zeros(6, int), true) == 0.0  # one segment: background takes it
    assert np.isnan(hungarian_iou(np.array([1, 2]), np.array([0, 0])))  # no object


def test_semantic_miou_over_classes_present_in_test():
    true, pred = np.array([[0, 0, 1, 2]]), np.array([[0, 1, 1, 3]])
    # class 0: 1/2, class 1: 1/2, class 2: 0/1; class 3 is absent from test and left out of the mean
    got = semantic_scores(pred, true, 4, n_boot=200)
    assert got["semantic_miou"] == pytest.approx(1 / 3)
    assert got["semantic_miou_lo"] == got["semantic_miou_hi"] == pytest.approx(1 / 3)  # one image
    two = semantic_scores(np.array([[0, 1], [0, 0]]), np.array([[0, 1], [0, 1]]), 2, n_boot=500)
    assert two["semantic_miou"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert two["semantic_miou_lo"] < two["semantic_miou"] < two["semantic_miou_hi"]


def test_instance_scores_average_images_with_objects():
    true = np.array([[0, 0, 1, 1], [0, 0, 0, 0], [0, 1, 1, 2]])
    pred = np.array([[2, 2, 0, 0], [1, 1, 1, 1], [0, 3, 3, 3]])
    got = instance_scores(pred, true, n_boot=200)
    # image 1 perfect; image 2 has no object (left out); image 3: IoU 2/3 and 0, ARI 0 over [1, 1, 2] vs [3, 3, 3]
    assert got["instance_miou"] == pytest.approx((1 + 1 / 3) / 2)
    assert got["instance_ari"] == pytest.approx(0.5)
    assert got["instance_ari_lo"] <= 0.5 <= got["instance_ari_hi"]


# ---------------------------------------------------------------- heads on tokens with a known answer

class FakeInfo:
    spec, family, revision, n_layers = "fake:segments", "fake", "r0", 3


class FakeActivations:
    """The extraction contract's shape: `.get(layer, "all")` -> (N, T, D) row-major over `.grid`."""

    def __init__(self, per_layer: dict[int, np.ndarray]) -> None:
        self.info, self.layers, self.grid, self.per_layer = FakeInfo(), sorted(per_layer), GRID, per_layer

    def get(self, layer: int, tokens: str) -> np.ndarray:
        assert tokens == "all"
        return self.per_layer[layer]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """ColorShape with 32 px objects on 128 px, each spanning several 16 px patches; 3 colours x 3 shapes,
    so every class of test is drawn in training (the head cannot name a class it never met)."""
    return make_dataset(tmp_path_factory.mktemp("data") / "seg", n_train=24, n_val=8, n_test=8, image_size=128,
                        margin=2, n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                        object_size=32)


def one_hot(labels: np.ndarray, width: int) -> np.ndarray:
    return np.eye(width, dtype=np.float16)[labels]


def test_heads_read_class_and_instance_tokens_and_not_noise(scenes):
    """Layer 1 is the one-hot of each patch's class: semantic mIoU 1. Layer 2 the one-hot of its instance
    id: instance mIoU and ARI 1. Layer 0 is noise: semantic mIoU at most the all-background floor."""
    ds = Dataset(scenes)
    n_classes = len(class_names(ds))
    rng = np.random.default_rng(0)
    acts, floor, seen = {}, None, {}
    for split in ("train", "val", "test"):
        instances, classes = split_labels(ds, split, GRID)
        seen[split] = set(np.unique(classes))
        noise = rng.normal(size=(*classes.shape, 8)).astype(np.float16)
        acts[split] = FakeActivations({0: noise, 1: one_hot(classes, n_classes), 2: one_hot(instances, 16)})
        if split == "test":
            floor = semantic_scores(np.zeros_like(classes), classes, n_classes, n_boot=1)["semantic_miou"]
    assert seen["test"] <= seen["train"] and len(seen["test"]) > 4
    rows = [r for head, layers in (("semantic", (0, 1)), ("instance", (0, 2)))
            for r in evaluate_activations({s: FakeActivations({k: a.per_layer[k] for k in layers})
                                           for s, a in acts.items()},
                                          ds, heads=(head,), config=HeadConfig(epochs=30), progress=False, n_boot=200)]
    make_table(rows)  # every column is in the results schema
    by = {(r["layer"], r["probe"]): r for r in rows}
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    assert by[(1, "semantic")]["semantic_miou"] == 1.0
    assert by[(1, "semantic")]["val_semantic_miou"] == 1.0
    assert by[(2, "instance")]["instance_miou"] >= 0.99 and by[(2, "instance")]["instance_ari"] >= 0.99
    assert by[(0, "semantic")]["semantic_miou"] <= floor + 0.02
    assert by[(0, "instance")]["instance_ari"] <= 0.2
    r = by[(1, "semantic")]
    assert (r["task"], r["tokens"], r["probe"], r["n_test"]) == ("segmentation", "all", "semantic", 8)
    assert json.loads(r["config"])["classes"] == n_classes == 3 * 3 + 1


def test_heads_are_seeded_and_deterministic(scenes):
    ds = Dataset(scenes)
    rng = np.random.default_rng(1)
    acts = {}
    for split in ("train", "val", "test"):
        _, classes = split_labels(ds, split, GRID)
        acts[split] = FakeActivations({0: rng.normal(size=(*classes.shape, 6)).astype(np.float16)})

    def run(seed: int) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_time_s"}
                for r in evaluate_activations(acts, ds, seeds=(seed,), config=HeadConfig(epochs=3), progress=False,
                                              n_boot=50)]

    assert run(0) == run(0)
    assert run(0) != run(1)


# ---------------------------------------------------------------- end to end

def test_bench_evaluate_segmentation_pixels_end_to_end(scenes, tmp_path, capsys):
    """`bench evaluate --task segmentation --model pixels` offline: rows with intervals in the results
    schema, a re-run owes nothing, the leaderboard shows the task."""
    from bench.cli import main

    results = tmp_path / "results"
    args = ["evaluate", "--task", "segmentation", "--dataset", str(scenes), "--model", "pixels", "--epochs", "2",
            "--device", "cpu", "--results", str(results), "--format", "json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {r["probe"] for r in summary} == {"semantic", "instance"}
    rows = read_results(results).to_pylist()
    assert len(rows) == 2 and all(r["status"] == "ok" and r["task"] == "segmentation" for r in rows)
    sem = next(r for r in rows if r["probe"] == "semantic")
    ins = next(r for r in rows if r["probe"] == "instance")
    assert sem["semantic_miou_lo"] <= sem["semantic_miou"] <= sem["semantic_miou_hi"] and ins["semantic_miou"] is None
    for m in ("instance_miou", "instance_ari"):
        assert ins[f"{m}_lo"] <= ins[m] <= ins[f"{m}_hi"]
    assert sem["layer"] == 0 and sem["tokens"] == "all" and sem["probe_fingerprint"] and sem["run_id"]

    assert main(args) == 0  # every key present: nothing runs
    assert "nothing to do" in capsys.readouterr().err
    for metric in ("semantic_miou", "instance_miou"):
        assert main(["leaderboard", str(results), "--task", "segmentation", "--metric", metric, "--format",
                     "json"]) == 0
        board = json.loads(capsys.readouterr().out)
        assert board and all(line["backbone"] == "pixels" for line in board)


def test_results_written_before_the_segmentation_columns_read_beside_new_ones(tmp_path):
    """A run file of this schema version without the new nullable metric columns reads with them null."""
    row = {**provenance("r1", "cpu"), "backbone": "pixels", "spec": "pixels", "dataset": "d",
           "dataset_fingerprint": "f" * 16, "split": "test", "layer": 0, "n_layers": 0, "tokens": "all",
           "probe": "linear", "seed": 0, "status": "ok", "weights_fingerprint": "w", "probe_fingerprint": "p",
           "task": "issameobject", "accuracy": 0.7}
    old = make_table([row])
    kept = [f for f in RESULT_SCHEMA if "miou" not in f.name and "ari" not in f.name]
    old = pa.Table.from_arrays([old.column(f.name) for f in kept], schema=pa.schema(kept, RESULT_SCHEMA.metadata))
    import pyarrow.parquet as pq

    pq.write_table(old, tmp_path / "old.parquet")
    write_run([{**row, "run_id": "r2", "task": "segmentation", "probe": "semantic", "semantic_miou": 0.5}],
              tmp_path, "r2")
    got = {r["task"]: r for r in read_results(tmp_path).to_pylist()}
    assert got["issameobject"]["accuracy"] == 0.7 and got["issameobject"]["semantic_miou"] is None
    assert got["segmentation"]["semantic_miou"] == 0.5


def test_compare_pairs_segmentation_rows_on_their_test_images(scenes, tmp_path, capsys):
    """Rows carry per-image values: instance scores per image holding an object, the semantic class
    counts per test image. `bench compare` of a backbone with its twin gives 0 with interval [0, 0];
    of pixels with oracle:patches the difference of the rows' values (semantic mIoU exactly, recomputed
    from the counts) inside its interval; rows written before the per-image columns: one line, exit 2."""
    from bench.cli import main
    from leaderboards.compare import compare_backbones
    from leaderboards.store import load_results

    results = tmp_path / "results"
    assert main(["evaluate", "--task", "segmentation", "--dataset", str(scenes), "--model", "pixels", "--model",
                 "twin=pixels", "--model", "oracle:patches", "--epochs", "2", "--device", "cpu", "--results",
                 str(results)]) == 0
    capsys.readouterr()
    rows = load_results(results)
    ds = Dataset(scenes)
    instances, _ = split_labels(ds, "test", GRID)
    with_object = int(sum((i != 0).any() for i in instances))
    by = {(r["backbone"], r["probe"]): r for r in rows}
    for backbone in ("pixels", "oracle:patches"):
        sem, ins = by[(backbone, "semantic")], by[(backbone, "instance")]
        assert len(ins["scene_instance_miou"]) == len(ins["scene_instance_ari"]) == with_object
        assert np.mean(ins["scene_instance_miou"]) == pytest.approx(ins["instance_miou"], abs=1e-6)
        n_classes = len(class_names(ds))
        assert sem["n_classes"] == n_classes and len(sem["scene_semantic_union"]) == 8 * n_classes
    records = {r["metric"]: r for r in compare_backbones(rows, "pixels", "twin")}
    assert set(records) == {"semantic_miou", "instance_miou", "instance_ari"}
    assert all((r["difference"], r["lo"], r["hi"]) == (0, 0, 0) for r in records.values())
    records = {r["metric"]: r for r in compare_backbones(rows, "oracle:patches", "pixels")}
    for metric, r in records.items():
        a, b = by[("oracle:patches", metric.split("_")[0])], by[("pixels", metric.split("_")[0])]
        assert r["difference"] == pytest.approx(a[metric] - b[metric], abs=1e-6)
        assert r["lo"] <= r["difference"] <= r["hi"]
    assert records["semantic_miou"]["difference"] == by[("oracle:patches", "semantic")]["semantic_miou"] - by[
        ("pixels", "semantic")]["semantic_miou"]
    old = read_results(results)
    old = old.drop_columns([c for c in old.column_names if c.startswith("scene_")])
    import pyarrow.parquet as pq

    for f in results.glob("*.parquet"):
        f.unlink()
    pq.write_table(old, results / "old.parquet")
    assert main(["compare", "oracle:patches", "pixels", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench: error: ") and len(err.strip().splitlines()) == 1 and "same test scenes" in err
