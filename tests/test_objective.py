"""The objective under ablation (issue 58, item 4): the zoo publishes its heads, and the `objective` task
measures a zoo model's own training loss on val through the backbone's own forward pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.cli import main
from bench.core.dataset import Dataset, decode_image
from evaluators.backbones import resolve_backbone
from evaluators.backbones.base import Backbone
from evaluators.tasks.objective.loss import ratio_interval, scene_losses
from evaluators.zoo import RECIPES, training
from evaluators.zoo.heads import HEAD_CARD, HEAD_DIR, load_head
from tests.helpers import make_dataset
from tests.test_zoo import use_tiny_zoo

TRAINED = ("masked", "conjunctions", "features")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Tiny zoo models of the three trained objectives (`use_tiny_zoo`), trained once for the module."""
    with pytest.MonkeyPatch.context() as mp:
        root = use_tiny_zoo(tmp_path_factory.mktemp("objective-zoo"), mp)
        folders = {name: training.train_recipe(RECIPES[name], root) for name in TRAINED}
        yield root, folders


@pytest.fixture(scope="module")
def zoo_scenes(tmp_path_factory) -> Path:
    """The zoo's kind of scenes (the `zoo` preset at 64 px, 24-px objects), all val scenes in one loss batch."""
    return make_dataset(tmp_path_factory.mktemp("objective-data") / "scenes", preset="zoo", n_train=8, n_val=24,
                        n_test=8, shard_size=16, image_size=64, object_size=24)


def loss(backbone: Backbone, ds: Dataset) -> float:
    sums, counts = scene_losses(backbone, ds, "val")
    return float(sums.sum() / counts.sum())


@pytest.mark.parametrize("name", TRAINED)
def test_the_task_loss_is_trainings_loss_on_the_same_batch(zoo, zoo_scenes, name):
    """On the same val scenes (one batch) with the same mask draws, the task's loss is what training's
    own loss function computes with the published head and the ViT."""
    _, folders = zoo
    ds = Dataset(zoo_scenes)
    backbone = resolve_backbone(f"zoo:{name}")
    head = load_head(folders[name], f"zoo:{name}")
    f, o, _ = ds.codes("val")
    x = torch.from_numpy(np.stack([decode_image(im) for im in ds.table("val", ["image"])["image"].to_pylist()]))
    batch = {"x": x.permute(0, 3, 1, 2).contiguous(), "F": torch.from_numpy(f).float(), "O": torch.from_numpy(o).float()}
    with torch.no_grad():
        expected = float(training._loss(RECIPES[name], backbone.model, head.module, batch,
                                        torch.Generator().manual_seed(head.mask_seed)))
    assert loss(backbone, ds) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", TRAINED)
def test_a_fresh_model_publishes_a_head_that_gives_its_training_val_loss(zoo, name):
    """Training writes head/ beside the ViT (not among the ViT's weight files, so its fingerprint stays);
    run on the recipe's own val scenes, the task's loss is the card's final_val_loss."""
    root, folders = zoo
    folder = folders[name]
    meta = json.loads((folder / HEAD_DIR / HEAD_CARD).read_text())
    assert meta["objective"] == name and meta["reads"] == ("patch tokens" if name == "masked" else "CLS")
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    card = json.loads((folder / training.CARD_NAME).read_text())
    (scenes,) = (root / "data").glob("colorshape-zoo-*")
    assert loss(resolve_backbone(str(folder)), Dataset(scenes)) == pytest.approx(card["final_val_loss"], rel=1e-5)


def test_the_untrained_control_publishes_no_head(zoo):
    root, _ = zoo
    folder = training.train_recipe(RECIPES["untrained"], root)
    assert not (folder / HEAD_DIR).exists()


class Wrapped(Backbone):
    """A backbone around a zoo model (as an intervened one is: `base`), whose forward pass writes
    `value` into block 0's patch tokens in place (None: it changes nothing)."""

    def __init__(self, base: Backbone, value: float | None) -> None:
        self.base, self.value, self.info, self.columns = base, value, base.info, base.columns

    def identity(self) -> dict:
        return {**self.base.identity(), "wrapped": self.value}

    def prepare(self, rows: dict, side: int):
        return self.base.prepare(rows, side)

    def to(self, device, dtype):
        self.base.to(device, dtype)
        return super().to(device, dtype)

    def hidden_states(self, inputs, layers):
        def write(module, args, output):
            (output[0] if isinstance(output, tuple) else output)[:, 1:] = self.value

        handle = self.base.blocks()[0].register_forward_hook(write) if self.value is not None else None
        try:
            return self.base.hidden_states(inputs, layers)
        finally:
            if handle is not None:
                handle.remove()


@pytest.mark.parametrize("name", ["masked", "conjunctions"])
def test_a_wrapping_backbone_is_measured_on_its_own_forward_pass(zoo, zoo_scenes, name):
    """The head of the wrapped zoo model runs on the wrapper's forward: a no-op wrapper gives the model's
    loss exactly, one that overwrites block 0's patch tokens a higher one."""
    ds, base = Dataset(zoo_scenes), resolve_backbone(f"zoo:{name}")
    plain = loss(base, ds)
    assert loss(Wrapped(base, None), ds) == plain
    assert loss(Wrapped(base, 0.0), ds) > plain + 1e-3


def test_the_interval_is_a_bootstrap_over_scenes():
    """Each drawn scene brings its sum and count: the point is the ratio, the interval brackets it and
    narrows with more scenes."""
    rng = np.random.default_rng(0)
    sums, counts = rng.uniform(0, 2, 400), rng.integers(1, 9, 400).astype(float)
    point, lo, hi = ratio_interval(sums, counts, seed=0)
    assert point == pytest.approx(sums.sum() / counts.sum()) and lo < point < hi
    _, lo4, hi4 = ratio_interval(np.tile(sums, 4), np.tile(counts, 4), seed=0)
    assert hi4 - lo4 < (hi - lo) * 0.7


def test_bench_evaluate_task_objective_end_to_end(zoo, zoo_scenes, tmp_path, capsys):
    """`bench evaluate --task objective`: one row per backbone at its last layer, on val, its loss the
    task's with a bootstrap interval around it, shown as is; a re-run skips."""
    from leaderboards.store import load_results

    results = tmp_path / "results"
    args = ["evaluate", "--task", "objective", "--model", "zoo:masked", "--model", "zoo:conjunctions",
            "--dataset", str(zoo_scenes), "--results", str(results)]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = {r["backbone"]: r for r in load_results(results)}
    assert set(rows) == {"zoo:masked", "zoo:conjunctions"}
    ds = Dataset(zoo_scenes)
    for spec, row in rows.items():
        assert (row["task"], row["split"], row["layer"], row["probe"], row["status"]) == ("objective", "val", 2,
                                                                                       "head", "ok")
        assert row["objective_loss"] == pytest.approx(loss(resolve_backbone(spec), ds), rel=1e-9)
        assert row["objective_loss_lo"] < row["objective_loss"] < row["objective_loss_hi"]
        assert f"{row['objective_loss']:.3f} ± " in out  # as is, not as a percentage
    assert main(args) == 0
    assert "nothing to do" in capsys.readouterr().err


def test_compare_pairs_objective_rows_on_their_val_scenes(zoo, zoo_scenes, tmp_path, capsys):
    """Rows carry each val scene's loss and the elements it averages (Σ loss·count / Σ count is the row's
    loss). `bench compare` of a model with its twin gives 0 with interval [0, 0]; of two zoo models the
    difference of their rows' losses inside its interval; rows without the per-scene columns are refused."""
    from bench.core.errors import BenchError
    from leaderboards.compare import compare_backbones
    from leaderboards.store import load_results

    results = tmp_path / "results"
    assert main(["evaluate", "--task", "objective", "--model", "zoo:masked", "--model", "twin=zoo:masked", "--model",
                 "zoo:conjunctions", "--model", "zoo:features", "--dataset", str(zoo_scenes), "--results",
                 str(results)]) == 0
    capsys.readouterr()
    rows = load_results(results)
    by = {r["backbone"]: r for r in rows}
    for row in rows:
        loss_, count = row["scene_objective_loss"], row["scene_objective_count"]
        assert len(loss_) == len(count) == Dataset(zoo_scenes).num_rows("val")
        assert (loss_ * count).sum() / count.sum() == pytest.approx(row["objective_loss"], rel=1e-6)
    assert len(set(by["zoo:masked"]["scene_objective_count"])) > 1  # a ratio of sums, not a mean over scenes
    (same,) = compare_backbones(rows, "zoo:masked", "twin")
    assert (same["metric"], same["difference"], same["lo"], same["hi"]) == ("objective_loss", 0, 0, 0)
    (r,) = compare_backbones(rows, "zoo:conjunctions", "zoo:features")
    assert r["difference"] == pytest.approx(by["zoo:conjunctions"]["objective_loss"] -
                                            by["zoo:features"]["objective_loss"], rel=1e-6)
    assert r["lo"] <= r["difference"] <= r["hi"]
    old = [{k: v for k, v in row.items() if not k.startswith("scene_")} for row in rows]
    with pytest.raises(BenchError, match=r"\(objective\) were not measured on the same test scenes"):
        compare_backbones(old, "zoo:conjunctions", "zoo:features")
