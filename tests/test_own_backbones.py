"""Model sources users have: a timm architecture + state-dict file, a `save_pretrained`
folder without a preprocessor config, and `py:<file>:<function>` returning a module
with its adapter. Every model is tiny and built here (no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from bench.cli import main
from bench.core.errors import BenchError
from evaluators.backbones import resolve_backbone
from evaluators.backbones.presets import IMAGENET_MEAN
from evaluators.backbones.timm_models import TimmBackbone
from evaluators.backbones.weights import file_hash
from tests.toy_backbones import toy_module

timm = pytest.importorskip("timm")
ARCH = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(ARCH, pretrained=False, num_classes=0, dynamic_img_size=True).eval()


def _save(state: dict, path: Path) -> Path:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize("name,wrap", [
    ("bare.pth", lambda sd: sd),
    ("nested.pt", lambda sd: {"state_dict": sd, "epoch": 3}),
    ("ddp.pth", lambda sd: {"model": {f"module.{k}": v for k, v in sd.items()}}),
    ("weights.safetensors", lambda sd: sd),
    ("ddp.safetensors", lambda sd: {f"module.{k}": v for k, v in sd.items()}),
])
def test_timm_state_dict_file_gives_the_saved_models_tokens(vit, tmp_path, name, wrap):
    path = _save(wrap(vit.state_dict()), tmp_path / name)
    bb = resolve_backbone(f"timm:{ARCH}@{path}")
    x = torch.randn(2, 3, 32, 32)
    got = bb.hidden_states(x, [0, 1, 12])
    want = TimmBackbone("saved", vit, ARCH, None).hidden_states(x, [0, 1, 12])
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[2], want[1])  # the comparison can tell hidden states apart
    assert (bb.info.n_layers, bb.info.width, bb.info.n_prefix) == (12, 192, 1)
    assert bb.info.revision == f"sha256:{file_hash(path)[:12]}"


def test_timm_file_with_the_wrong_architecture_is_one_line(vit, tmp_path, capsys):
    small = timm.create_model(ARCH, pretrained=False, num_classes=0, depth=2)
    path = _save(small.state_dict(), tmp_path / "depth2.pth")
    with pytest.raises(BenchError, match=r"0 missing|missing and 0 unexpected") as e:
        resolve_backbone(f"timm:{ARCH}@{path}")
    assert "120 missing and 0 unexpected" in str(e.value)  # 10 absent blocks x 12 tensors
    assert main(["models", f"timm:{ARCH}@{path}"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["models", f"timm:{ARCH}@{tmp_path / 'absent.pth'}"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_models_reports_a_timm_file(vit, tmp_path, capsys):
    path = _save(vit.state_dict(), tmp_path / "w.safetensors")
    assert main(["models", f"timm:{ARCH}@{path}", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["source"], row["n_layers"], row["width"], row["n_prefix"]) == ("timm-file", 12, 192, 1)
    assert row["revision"] == f"sha256:{file_hash(path)[:12]}"


def _tiny_vit_folder(path: Path, **config) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(1)
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=48,
                                 patch_size=8, intermediate_size=64, **config)
    model = transformers.ViTModel(cfg, add_pooling_layer=False).eval()
    model.save_pretrained(path)
    return model, path


def test_save_pretrained_folder_without_preprocessor_config(tmp_path, capsys):
    model, path = _tiny_vit_folder(tmp_path / "mine")
    capsys.readouterr()  # save_pretrained's own progress bar
    assert not (path / "preprocessor_config.json").exists()
    bb = resolve_backbone(str(path))
    err = capsys.readouterr().err
    assert "no preprocessor_config.json" in err and "48 px" in err and len(err.strip().splitlines()) == 1
    assert bb.info.input_size == 48 and bb.preprocess.mean == IMAGENET_MEAN
    x = torch.randn(1, 3, 48, 48)
    with torch.inference_mode():
        want = model(pixel_values=x, output_hidden_states=True).hidden_states[2]
    assert torch.equal(bb.hidden_states(x, [2])[0], want)
    assert main(["models", str(path), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["source"], row["n_layers"], row["width"], row["input_size"]) == ("hf-folder", 2, 32, 48)


def test_folder_config_can_name_its_normalisation(tmp_path, capsys):
    _, path = _tiny_vit_folder(tmp_path / "clipnorm", image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.25, 0.25])
    bb = resolve_backbone(str(path))
    assert (bb.preprocess.mean, bb.preprocess.std) == ((0.5,) * 3, (0.25,) * 3)


PY_MODEL = toy_module("torch.nn.TransformerEncoderLayer(24, 2, 48, batch_first=True) for _ in range(3)") + """
def bare():
    return Toy()


def number():
    return 3
"""


def test_py_file_module_with_adapter(tmp_path, capsys):
    (tmp_path / "toy.py").write_text(PY_MODEL)
    spec = f"py:{tmp_path / 'toy.py'}:make"
    bb = resolve_backbone(spec)
    assert (bb.info.n_layers, bb.info.width, bb.info.n_prefix, bb.info.patch_size) == (3, 24, 1, 8)
    model = bb.model
    x = torch.randn(2, 3, 32, 32)
    h0, h2, h3 = bb.hidden_states(x, [0, 2, 3])
    with torch.inference_mode():
        t = torch.cat([model.cls.expand(2, -1, -1), model.embed(x).flatten(2).transpose(1, 2)], 1)
        assert torch.equal(h0, t)
        t = model.blocks[1](model.blocks[0](t))
        assert torch.allclose(h2, t, atol=1e-6)
        assert torch.allclose(h3, model.blocks[2](t), atol=1e-6)
    assert bb.grid(32) == (4, 4) and h3.shape == (2, 17, 24)
    assert main(["models", spec, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["source"], row["n_layers"], row["width"]) == ("py-file", 3, 24)
    assert row["revision"] == bb.info.revision  # the function runs seeded: the same init, the same fingerprint


@pytest.mark.parametrize("target,message", [
    ("absent.py:make", "no such Python file"),
    ("toy.py:nothing", "defines no function 'nothing'"),
    ("toy.py:bare", "returned Toy; expected a ModuleAdapter or a Backbone (wrap it"),
    ("toy.py:number", "returned int"),
    ("toy.py", "expected py:<file.py>:<function>"),
])
def test_py_file_refusals_are_one_line(tmp_path, capsys, target, message):
    (tmp_path / "toy.py").write_text(PY_MODEL)
    assert main(["models", f"py:{tmp_path}/{target}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_adapter_with_wrong_token_count_is_refused(tmp_path):
    (tmp_path / "toy.py").write_text(PY_MODEL.replace("prefix_tokens=1)", "prefix_tokens=2)"))
    with pytest.raises(BenchError, match=r"expected 1 x 18 x D"):
        resolve_backbone(f"py:{tmp_path / 'toy.py'}:make")


def test_preprocessing_overrides(tmp_path, capsys):
    _, path = _tiny_vit_folder(tmp_path / "mine")
    bb = resolve_backbone(str(path), image_size=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert bb.info.input_size == 32 and bb.input_side(64) == 32
    assert bb.preprocess.mean == (0.5,) * 3 and bb.identity() != resolve_backbone(str(path)).identity()
    row = bb.prepare({"image": [_png(0)]}, 32)
    assert torch.allclose(row, torch.full_like(row, -1.0))  # black pixels: (0 - 0.5) / 0.5
    assert main(["models", str(path), "--image-size", "36", "--format", "json"]) == 2  # not a multiple of 8
    assert "patch size 8" in capsys.readouterr().err
    assert main(["models", str(path), "--image-size", "64", "--std", "1,1", "--format", "json"]) == 2
    assert "three values" in capsys.readouterr().err
    assert main(["models", str(path), "--image-size", "64", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["input_size"] == 64
    assert main(["models", "pixels", "--mean", "0,0,0"]) == 2


def _png(value: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (value,) * 3).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """40 small scenes, enough to train a probe for 2 epochs."""
    from tests.helpers import make_dataset

    return make_dataset(tmp_path_factory.mktemp("data") / "tiny", n_train=24, n_val=8, n_test=8, image_size=64,
                        n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                        object_size=12, margin=2, val_fraction=0.25, test_fraction=0.25)


def test_evaluate_takes_the_input_settings_of_a_folder_without_preprocessor_config(scenes, tmp_path, capsys,
                                                                                     monkeypatch):
    """`bench evaluate --image-size/--mean/--std` and `api.evaluate(image_size=, mean=, std=)`
    reach the backbone through the request; the choice is said once; a changed one is measured again."""
    import pandas as pd

    from bench import api
    from evaluators.runner.request import EvaluationRequest

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    _, path = _tiny_vit_folder(tmp_path / "mine")
    data = scenes
    capsys.readouterr()
    results = tmp_path / "results"
    args = ["evaluate", "-m", f"mine={path}", "--dataset", str(data), "--probes", "linear", "--epochs", "2",
            "--results", str(results), "--format", "json", "--image-size", "32", "--std", "0.5,0.5,0.5"]
    assert main([*args, "--mean", "0.5,0.5,0.5"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "preprocessor_config.json" in line]
    assert said == [f"model: {path} has no preprocessor_config.json; using image size 32 px (--image-size), mean "
                    "[0.5, 0.5, 0.5] (--mean), std [0.5, 0.5, 0.5] (--std), bicubic resize"]
    assert main([*args, "--mean", "0.5,0.5,0.5"]) == 0 and "nothing to do" in capsys.readouterr().err
    assert main([*args, "--mean", "0.2,0.3,0.4"]) == 0  # another normalisation: measured again, and it wins
    capsys.readouterr()
    rows = pd.read_parquet(results).sort_values("created_at")
    assert len(rows) == 2 and rows["probe_fingerprint"].nunique() == 2 and rows["weights_fingerprint"].nunique() == 1
    shown = api.load_results(results)
    assert list(shown["run_id"]) == [rows["run_id"].iloc[1]] and "older probe" in shown.attrs["set_aside"]

    request = EvaluationRequest(str(path), data, image_size=32, mean=[0.2, 0.3, 0.4], std=(0.5, 0.5, 0.5))
    bb = request.models[0].resolve(**request.preprocessing)
    assert (bb.info.input_size, bb.preprocess.mean, bb.preprocess.std) == (32, (0.2, 0.3, 0.4), (0.5,) * 3)
    own = EvaluationRequest(str(path), data).models[0].resolve()  # config.json's side, ImageNet's statistics
    black = {"image": [_png(0)]}
    assert torch.allclose(bb.prepare(black, 32)[0, :, 0, 0], torch.tensor([-0.4, -0.6, -0.8]))
    assert own.info.input_size == 48 and not torch.allclose(own.prepare(black, 32), bb.prepare(black, 32))
    again = api.evaluate({"mine": str(path)}, data, probes="linear", epochs=2, results=results, image_size=32,
                         mean=(0.2, 0.3, 0.4), std=(0.5, 0.5, 0.5))
    assert list(again["run_id"]) == [rows["run_id"].iloc[1]]  # the API's request is the CLI's: nothing re-run
    with pytest.raises(BenchError, match=r"mean: three values"):
        api.evaluate(str(path), data, mean=(0.5, 0.5))


@pytest.mark.parametrize("extra,message", [
    (["--mean", "0.5,0.5"], "mean: three values (R, G, B); got [0.5, 0.5]"),
    (["--std", "0.5,-1,0.5"], "std: three values (R, G, B), all > 0"),
    (["--image-size", "0"], "image_size: a positive number of pixels, got 0"),
    (["--mean", "a,b,c"], "mean: comma-separated numbers"),
    (["-m", "pixels", "--mean", "0.5,0.5,0.5"], "model: pixels brings its own input handling; mean apply to"),
])
def test_bad_input_settings_on_evaluate_are_one_line(scenes, tmp_path, capsys, extra, message):
    _, path = _tiny_vit_folder(tmp_path / "mine")
    data = scenes
    model = [] if "-m" in extra else ["-m", str(path)]
    capsys.readouterr()
    assert main(["evaluate", *model, "--dataset", str(data), "--results", str(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("*.parquet"))


#: A `py:` module whose forward adds `SHIFT` to what block 1 gives block 2: an edit of its code, the
#: weights the same. Hidden state 2 is block 2's output, so the edit reaches layer 2 only.
EDITABLE = toy_module("torch.nn.Linear(24, 24) for _ in range(2)", forward="""t = self.blocks[0](t) + SHIFT
        return self.blocks[1](t)""")


def test_an_edited_py_forward_is_measured_again(scenes, tmp_path, capsys, monkeypatch):
    """Issue 56: an edit to a `py:` module's forward (weights unchanged) was "nothing to do", and
    `--overwrite` wrote `ok` rows from the activations of the old code. The module's source is
    part of its fingerprint and of its activation cache key."""
    import pandas as pd

    from bench import api

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    src, results = tmp_path / "model" / "toy.py", tmp_path / "results"
    src.parent.mkdir()
    run = ["evaluate", "-m", f"mine=py:{src}:make", "--dataset", str(scenes), "--probes", "linear", "--layers", "1,2",
           "--epochs", "2", "--results", str(results), "--format", "json"]

    def evaluate(shift: str, *extra: str) -> tuple[list[dict], str]:
        src.write_text(EDITABLE.replace("SHIFT", shift))
        before = set(results.glob("*.parquet")) if results.exists() else set()
        assert main([*run, *extra]) == 0
        err = capsys.readouterr().err
        new = set(results.glob("*.parquet")) - before
        assert len(new) == 1, err  # a run that wrote its rows
        return sorted(pd.read_parquet(new.pop()).to_dict("records"), key=lambda r: r["layer"]), err

    def entries() -> int:  # cache entries, one a split
        return len(set((tmp_path / "cache" / "activations").glob("*")))

    clean, _ = evaluate("0.0")
    assert [r["status"] for r in clean] == ["ok", "ok"] and entries() == 3
    assert main(run) == 0 and "nothing to do" in capsys.readouterr().err  # unchanged: skipped

    nan, err = evaluate("float('nan')")  # the code edited, the weights not: measured again, a new cache entry
    assert "nothing to do" not in err and entries() == 6
    assert nan[0]["weights_fingerprint"] != clean[0]["weights_fingerprint"]
    assert nan[1]["status"] == "error" and "NaN or inf" in nan[1]["error"]
    assert (nan[0]["status"], nan[0]["beta_star"]) == ("ok", clean[0]["beta_star"])  # layer 1 runs the same code
    shown = api.load_results(results)  # the old source's rows: an older measurement, as edited weights'
    assert set(shown["run_id"]) == {nan[0]["run_id"]} and "older weights" in shown.attrs["set_aside"]

    inf, err = evaluate("float('inf')", "--overwrite")  # never the old activations
    assert entries() == 9 and inf[1]["status"] == "error" and "NaN or inf" in inf[1]["error"]
    again, _ = evaluate("0.0", "--overwrite")  # the first source again: its own entry, its own numbers
    assert entries() == 9 and again[0]["weights_fingerprint"] == clean[0]["weights_fingerprint"]
    assert [r["beta_star"] for r in again] == [r["beta_star"] for r in clean]


def test_a_py_backbones_fingerprint_covers_the_python_files_beside_it(tmp_path, monkeypatch):
    """The rule: the names and bytes of every `*.py` file in the module's folder. A helper it imports
    from there counts; other files there, and the module's weights' randomness, do not."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "toy.py").write_text(EDITABLE.replace("SHIFT", "toy_helper.SHIFT").replace(
        "import torch\n", "import torch\nimport toy_helper\n", 1))
    spec = f"py:{tmp_path / 'toy.py'}:make"

    def revision(helper: str) -> str:
        (tmp_path / "toy_helper.py").write_text(helper)
        monkeypatch.delitem(sys.modules, "toy_helper", raising=False)  # as a new process would import it
        return resolve_backbone(spec).info.revision

    first = revision("SHIFT = 0.0\n")
    assert revision("SHIFT = 0.0\n") == first
    (tmp_path / "notes.md").write_text("not code")
    assert revision("SHIFT = 0.0\n") == first
    assert revision("SHIFT = 1.0\n") != first


def test_a_py_backbones_fingerprint_is_the_same_in_another_process(tmp_path):
    (tmp_path / "toy.py").write_text(PY_MODEL)
    spec = f"py:{tmp_path / 'toy.py'}:make"
    code = ("import sys; from evaluators.backbones import resolve_backbone; "
            "print(resolve_backbone(sys.argv[1]).info.revision)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == resolve_backbone(spec).info.revision
