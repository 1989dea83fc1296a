"""The Python API and the plan behind it: `api.generate` writes `bench generate`'s bytes,
`EvaluationRequest` checks a request once for every caller, and `api.evaluate` takes backbone
objects beside spec strings (offline, CPU)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import torch

from bench import api
from bench.cli import main
from bench.core.errors import BenchError
from evaluators.backbones.base import Backbone
from evaluators.backbones.ground_truth import PixelsBackbone
from evaluators.backbones.weights import state_dict_hash
from evaluators.runner.request import EvaluationRequest, Model
from tests.helpers import make_dataset

SIZES = dict(n_train=24, n_val=8, n_test=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "tiny", n_train=48, n_val=16, n_test=16, image_size=64,
                        n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                        object_size=12, margin=2, val_fraction=0.25, test_fraction=0.25)


class Projected(PixelsBackbone):
    """A user's own backbone: 16-px pixel patches through a small torch module, one hidden state.
    Its `info.revision` is empty, so the API fingerprints its weights."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__("mine:projected", 16)
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(3 * 16 * 16, 8)
        self.info = dataclasses.replace(self.info, revision="", width=8)

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [self.model(inputs) for _ in layers]


def test_api_generate_writes_the_bytes_bench_generate_writes(tmp_path, capsys):
    out = api.generate("colorshape", preset="small", out=tmp_path / "api", seed=3, workers=1,
                       overrides={"shard_size": 8, "n_train": 24}, **SIZES)
    assert out == tmp_path / "api" and not capsys.readouterr().err  # quiet unless asked for progress
    args = ["generate", "colorshape", "--preset", "small", "--seed", "3", "--set", "shard_size=8", "--workers", "2",
            "--n-train", "24", "--n-val", "8", "--n-test", "8", "--out", str(tmp_path / "cli")]
    assert main(args) == 0
    assert "wrote 40 scenes to" in capsys.readouterr().err
    files = sorted(p.name for p in out.iterdir())
    assert len([f for f in files if f.endswith(".parquet")]) == 3 + 1 + 1  # 24 train rows in shards of 8
    assert files == sorted(p.name for p in (tmp_path / "cli").iterdir())
    for name in files:
        assert (out / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


@pytest.mark.parametrize("kwargs, message", [
    (dict(generator="nope"), "generator: unknown 'nope'"),
    (dict(overrides={"bogus": 1}), "bogus: unknown parameter for colorshape"),
    (dict(preset="huge"), "preset: unknown 'huge'"),
    (dict(workers=0), "workers: must be ≥ 1, got 0"),
    (dict(address="auto"), "executor: --address needs --executor ray"),
    (dict(overrides={"n_objects": "many"}), "n_objects: cannot read 'many' as int"),
    (dict(overrides={"n_train": 999}, n_train=24), "--set n_train=999 and --n-train 24 disagree"),
])
def test_api_generate_refuses_bad_input_in_one_line_before_writing(kwargs, message, tmp_path):
    with pytest.raises(BenchError) as e:
        api.generate(**{"generator": "colorshape", "out": tmp_path / "d", **kwargs})
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "d").exists()


def test_a_plan_fills_the_task_defaults_and_is_frozen(tmp_path):
    request = EvaluationRequest(["pixels", "mine=oracle:objects", "pixels"], tmp_path, probes="linear,dnn",
                                seeds=[1, 1, 0])
    assert request.models == (Model("pixels", "pixels"), Model("mine", "oracle:objects"))  # the same model once
    assert (request.layer_request, request.token_choices, request.families, request.seeds) == (
        "last", ["cls"], ["linear", "dnn"], (1, 0))
    assert request.dataset == tmp_path and request.results_dir == Path("results")
    assert EvaluationRequest("pixels", tmp_path, seeds=np.int64(3)).seeds == (3,)  # one seed, a numpy integer too
    iso = EvaluationRequest({"p": "pixels"}, str(tmp_path), task="issameobject", layers=[0, 1])
    assert (iso.layer_request, iso.token_choices, iso.families) == (
        (0, 1), ["all"], ["linear", "diag-quadratic", "quadratic"])
    assert iso.models == (Model("p", "pixels"),)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.task = "issameobject"  # type: ignore[misc]
    assert dataclasses.replace(request, task="issameobject", probes=None).families == iso.families


@pytest.mark.parametrize("kwargs, message", [
    (dict(task="segment"), "task: unknown 'segment'"),
    (dict(models=[]), "model: give at least one backbone"),
    (dict(probes=[]), "probes: give at least one probe family"),
    (dict(probes=["attention"]), "probe: 'attention' needs spatial tokens"),
    (dict(task="issameobject", tokens=["cls"]), "tokens: issameobject reads all only"),
    (dict(seeds=[]), "seeds: 1 to 1000 integers in [0, 2^32), got none"),
    (dict(seeds=[0, -1]), "seeds: 1 to 1000 integers in [0, 2^32), got 0, -1"),
    (dict(seeds=["1"]), "seeds: expected integers, got 1"),
    (dict(epochs=0), "epochs: must be ≥ 1, got 0"),
    (dict(limit=0), "limit: must be ≥ 1, got 0"),
    (dict(threads=0), "threads: must be ≥ 1, got 0"),
    (dict(control="shuffled"), "control: unknown 'shuffled'"),
    (dict(control="resampled-o", task="issameobject"), "control: resampled-o is no control of --task issameobject"),
    (dict(gpus_per_task=1.0), "executor: --address and --gpus-per-task need --executor ray"),
    (dict(models=["a=pixels", "a=oracle:objects"]), "model: two models are named a (pixels, oracle:objects)"),
    (dict(models=["mine="]), "model: 'mine=' names no spec"),
    (dict(models={"a/b": "pixels"}), "model: a display name: 'a/b' is not a valid name; a name is 1 to 64 characters"),
    (dict(models=[3]), "model: expected a spec string, a Backbone or a ModuleAdapter, got int"),
    (dict(models=[PixelsBackbone("pixels", 16)], executor="ray"), "executor: Ray workers build each backbone"),
    (dict(image_size=0), "image_size: a positive number of pixels, got 0"),
    (dict(image_size=32.0), "image_size: a positive number of pixels, got 32.0"),
    (dict(mean=(0.5, 0.5)), "mean: three values (R, G, B); got [0.5, 0.5]"),
    (dict(std=(1, 0, 1)), "std: three values (R, G, B), all > 0; got [1, 0, 1]"),
    (dict(models=[PixelsBackbone("pixels", 16)], mean=(0.5,) * 3), "pixels is a Python object with its own input"),
])
def test_a_bad_plan_is_refused_in_one_line(kwargs, message, tmp_path):
    with pytest.raises(BenchError) as e:
        EvaluationRequest(**{"models": ["pixels"], "dataset": tmp_path, **kwargs})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_backbone_without_weights_to_hash_must_state_its_fingerprint():
    class Bare(PixelsBackbone):
        def __init__(self) -> None:
            super().__init__("bare", 16)
            self.info = dataclasses.replace(self.info, revision="")

    with pytest.raises(BenchError, match="states no weights fingerprint .* set info.revision"):
        EvaluationRequest([Bare()], "d")


def test_evaluate_takes_backbone_objects_and_measures_edited_weights_again(tiny, tmp_path):
    mine = Projected()
    assert isinstance(mine, Backbone)
    fingerprint = f"sha256:{state_dict_hash(mine.model)[:12]}"
    kw = dict(probes=["linear"], epochs=1, results=tmp_path)
    df = api.evaluate({"mine": mine, "px": "pixels"}, tiny, **kw)
    rows = {r["backbone"]: r for r in df.to_dict(orient="records")}
    assert set(rows) == {"mine", "px"} and {r["status"] for r in rows.values()} == {"ok"}
    assert rows["mine"]["spec"] == "mine:projected" and rows["px"]["spec"] == "pixels"
    assert rows["mine"]["weights_fingerprint"] == fingerprint and mine.info.revision == ""  # the caller's object kept
    # a backbone object named by its own attribute, and the built-in one given as an object, read the spec's numbers
    pixels = PixelsBackbone("pixels", 16)
    pixels.display_name = "px"
    again = api.evaluate([pixels], tiny, **kw)
    assert again.to_dict(orient="records") == [rows["px"]]  # the same key: reused, not recomputed
    with torch.no_grad():
        mine.model.weight.mul_(-2.0)  # an edited model is measured again, and its rows win
    edited = api.evaluate({"mine": mine}, tiny, **kw)
    (row,) = edited.to_dict(orient="records")
    assert row["weights_fingerprint"] == f"sha256:{state_dict_hash(mine.model)[:12]}" != fingerprint
    assert row["run_id"] != rows["mine"]["run_id"] and "older weights" in edited.attrs["set_aside"]


def test_evaluate_run_serves_the_cli_command_line_skipped_rows_rows_and_path(tiny, tmp_path, capsys):
    """`bench evaluate` is `api.evaluate_run` with a command line around it: the command line goes
    into each row, the run file and its rows come back, and a second call skips what is there."""
    kw = dict(probes="linear", epochs=1, results=tmp_path / "results")
    first = api.evaluate_run(["oracle:objects", "pixels"], tiny, command="bench evaluate -m pixels", **kw)
    assert first.path is not None and first.path.parent == tmp_path / "results" and first.skipped == 0
    assert sorted(r["backbone"] for r in first.rows) == ["oracle:objects", "pixels"]
    assert {r["command"] for r in first.rows} == {"bench evaluate -m pixels"}
    again = api.evaluate_run(["pixels"], tiny, **kw)
    assert (again.path, again.rows, again.skipped) == (None, [], 1)
    frame = api.evaluate(["pixels"], tiny, **kw)  # the DataFrame view says the same in its attrs
    assert (frame.attrs["path"], frame.attrs["skipped"]) == (None, 1) and list(frame["backbone"]) == ["pixels"]
    # the CLI prints those rows, and says what it skipped
    assert main(["evaluate", "-m", "pixels", "-d", str(tiny), "--probes", "linear", "--epochs", "1",
                 "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert f"skipped 1 row(s) already in {tmp_path / 'results'}" in err and "nothing to do" in err
