"""A study runs each backbone through its model once for every block that reads it: the first
evaluation of a backbone fills the later blocks' layers and tokens from the same forward pass
(`EvaluationRequest.also`), unless those blocks owe it no rows; the rows are those of blocks run
one by one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.cli import main
from bench.core.errors import BenchError
from bench.core.results import read_results
from evaluators.backbones.hf import HFBackbone
from evaluators.runner.request import EvaluationRequest

#: Every layer's class token under linear, then every token of the last layer under attention.
STUDY = """
threads = 1
[datasets.d]
path = "{data}"
{blocks}
"""
POOLED = """
[[evaluate]]
backbones = ["vit=./vit"]
layers = "all"
tokens = "cls"
probes = ["linear"]
epochs = 1
"""
TOKENS = """
[[evaluate]]
backbones = ["vit=./vit"]
tokens = "all"
probes = ["attention"]
epochs = 1
"""
FORWARD = HFBackbone.hidden_states
#: Columns that name the run, not the measurement.
RUN_COLUMNS = ("run_id", "created_at", "wall_time_s", "command", "host", "device", "package_versions")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from tests.helpers import TINY_SCENES, make_dataset
    from tests.test_backbones import tiny_checkpoint

    root = tmp_path_factory.mktemp("study")
    tiny_checkpoint("dinov2", root / "vit")
    make_dataset(root / "data", n_train=24, n_val=8, n_test=8, **TINY_SCENES)
    return root


def _run(folder: Path, name: str, blocks: str, out: Path, monkeypatch) -> list[list[int]]:
    """`bench run` of study `name` of `blocks` into `out`; the layers every forward pass of the ViT returned."""
    passes: list[list[int]] = []
    monkeypatch.setattr(HFBackbone, "hidden_states", lambda self, x, layers: passes.append(list(layers)) or
                        FORWARD(self, x, layers))
    study = folder / f"{name}.toml"
    study.write_text(STUDY.format(data=folder / "data", blocks=blocks))
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(out / "cache"))
    assert main(["run", str(study), "--out", str(out)]) == 0
    return passes


def _rows(*outs: Path) -> dict[tuple, dict]:
    return {(r["layer"], r["tokens"], r["probe"]): {k: v for k, v in r.items() if k not in RUN_COLUMNS}
            for out in outs for r in read_results(out / "results").to_pylist()}


def test_a_backbone_read_by_two_blocks_runs_through_its_model_once(folder, tmp_path, monkeypatch, one_torch_thread):
    together = _run(folder, "both", POOLED + TOKENS, tmp_path / "both", monkeypatch)
    # hidden states 0-2 of the tiny ViT: one pass over each split for both blocks, every pass returning all
    assert together and all(layers == [0, 1, 2] for layers in together)
    alone = _run(folder, "pooled", POOLED, tmp_path / "pooled", monkeypatch)
    alone += _run(folder, "tokens", TOKENS, tmp_path / "tokens", monkeypatch)
    assert len(alone) == 2 * len(together)  # block by block: a pass each
    assert _rows(tmp_path / "both") == _rows(tmp_path / "pooled", tmp_path / "tokens")
    assert len(_rows(tmp_path / "both")) == 4  # linear at hidden states 0-2 (cls), attention at 2 (all)


def test_a_later_block_that_owes_nothing_adds_nothing_to_the_pass(folder, tmp_path, monkeypatch, one_torch_thread):
    out = tmp_path / "grow"
    first = _run(folder, "grow", TOKENS, out, monkeypatch)
    assert first and all(layers == [2] for layers in first)
    then = _run(folder, "grow", POOLED + TOKENS, out, monkeypatch)  # attention's rows are held: its tokens stay
    assert then and all(layers == [0, 1, 2] for layers in then) and len(then) == len(first)
    entries = list((out / "cache" / "activations").glob("*/*"))
    assert len(entries) == 2 * 3  # two selections (hidden state 2 all; 0-2 cls) x three splits


@pytest.mark.parametrize("change,message", [
    (dict(task="issameobject", probes="linear", tokens="all"), "also: the issameobject task's runner extracts its own"),
    (dict(executor="ray"), "also: other selections are filled in this process"),
    (dict(also=(("other", "last", ("all",)),)), "also: other is no model of this request (vit)"),
])
def test_a_request_whose_also_cannot_be_filled_is_refused_in_one_line(folder, change, message):
    options = dict(models=["vit=" + str(folder / "vit")], dataset=folder / "data", also=(("vit", "last", ("all",)),))
    with pytest.raises(BenchError, match=f"^{re.escape(message)}"):
        EvaluationRequest(**{**options, **change})
