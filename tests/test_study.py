"""A newcomer's study end to end through the CLI: one results folder holding trial (`--limit`)
and full runs of both tasks, then leaderboard, plots and report; checks that fail before any
work; the activation cache's size estimate; the shards as Hugging Face `datasets` reads them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.results import read_results
from tests.helpers import make_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "tiny", n_train=48, n_val=16, n_test=16, image_size=64,
                        n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                        object_size=12, margin=2, val_fraction=0.25, test_fraction=0.25)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh activation cache per test, so what a test extracted is what it sees."""
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def full_disk(path) -> SimpleNamespace:
    """`shutil.disk_usage` of a disk with 1 kB free."""
    return SimpleNamespace(total=10**12, used=10**12 - 1000, free=1000)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_limit_and_full_runs_of_both_tasks_share_one_results_folder(tiny, tmp_path, cache_dir, capsys):
    from evaluators.cache.inventory import list_entries

    results = tmp_path / "results"
    binding = ["evaluate", "--dataset", tiny, "--results", results, "--probes", "linear", "--epochs", "1"]
    code, _, err = run(capsys, *binding, "--model", "oracle:objects", "--limit", 8)
    assert code == 0, err
    # the trial extracted 8 scenes of each split, not the whole splits, and said so in whole lines
    assert {e.rows for e in list_entries(cache_dir)} == {"8"}
    assert "extract oracle:objects train: 8/8" in err and "\r" not in err
    assert [r["limit"] for r in read_results(results).to_pylist()] == [8]

    code, out, err = run(capsys, *binding, "--model", "oracle:objects,oracle:features", "--format", "json")
    assert code == 0, err
    assert {(r["backbone"], r["status"]) for r in json.loads(out)} == {("oracle:objects", "ok"), ("oracle:features", "ok")}
    # a no-op run prints an empty JSON list and says what it skipped
    code, out, err = run(capsys, *binding, "--model", "oracle:objects,oracle:features", "--format", "json")
    assert code == 0 and json.loads(out) == [] and "skipped 2 row(s)" in err

    code, _, err = run(capsys, "evaluate", "--task", "issameobject", "--dataset", tiny, "--results", results,
                       "--model", "pixels", "--probes", "linear,cosine", "--epochs", "1", "--limit", 8)
    assert code == 0, err
    assert "nearly trivial" in err  # ColorShape's flat colours: pixels alone read IsSameObject

    # the leaderboard shows the full binding run, and names the trial it set aside in one line
    code, out, err = run(capsys, "leaderboard", results, "--format", "json")
    assert code == 0, err
    assert {(r["dataset"], r["backbone"]) for r in json.loads(out)} == {("tiny", "oracle:objects"),
                                                                        ("tiny", "oracle:features")}
    assert err == "set aside: 1 binding rows on tiny (--limit 8; --include-limited shows it)\n"
    code, out, _ = run(capsys, "leaderboard", results, "--format", "json", "--include-limited")
    assert {r["dataset"] for r in json.loads(out)} == {"tiny", "tiny (limit 8)"}
    # the only IsSameObject measurement is a trial: it is shown, alone
    code, out, err = run(capsys, "leaderboard", results, "--task", "issameobject", "--format", "json")
    assert code == 0 and {r["probe"] for r in json.loads(out)} == {"linear", "cosine"}

    for kind in ("bars", "layers"):
        code, _, err = run(capsys, "plot", kind, results, "-o", tmp_path / "plots" / kind)
        assert code == 0, err
        assert (tmp_path / "plots" / f"{kind}.png").stat().st_size > 0

    code, out, err = run(capsys, "report", results, "-o", tmp_path / "report.html")
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    assert "Binding: β* by backbone" in page and "oracle:features" in page and "IsSameObject accuracy by layer" in page
    assert "not shown: Identical objects (toys) (no --analysis directory given" in err
    assert "Not shown: Identical objects (toys)" in page and "--include-limited shows it" in page


def test_cls_and_mean_of_a_builtin_backbone_are_trained_once(tiny, tmp_path, cache_dir, capsys):
    from evaluators.cache.inventory import list_entries

    code, out, err = run(capsys, "evaluate", "--dataset", tiny, "--results", tmp_path, "--model", "oracle:features",
                         "--probes", "linear", "--tokens", "cls,mean", "--epochs", "1", "--format", "json")
    assert code == 0, err
    assert "cls and mean are the same vector" in err
    rows = {r["tokens"]: r for r in read_results(tmp_path).to_pylist()}
    assert set(rows) == {"cls", "mean"}
    assert rows["cls"]["L_O_given_F"] == rows["mean"]["L_O_given_F"] and rows["cls"]["config"] == rows["mean"]["config"]
    assert {tuple(e.token_choices) for e in list_entries(cache_dir)} == {("cls",)}  # extracted once too


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory) -> Path:
    """A tiny DINOv2 checkpoint (2 blocks, width 32, patch 8 at 32 px): a backbone with attention."""
    from tests.test_backbones import tiny_checkpoint

    return tiny_checkpoint("dinov2", tmp_path_factory.mktemp("ckpt") / "dinov2")[1]


def test_every_check_fails_before_any_extraction(tiny, tiny_vit, tmp_path, cache_dir, capsys, monkeypatch):
    from evaluators.cache.entries import EntryWriter

    opened, open_entry = [], EntryWriter.open
    monkeypatch.setattr(EntryWriter, "open", lambda self: opened.append(self.path) or open_entry(self))

    def refused(*args, message: str) -> None:
        code, out, err = run(capsys, *args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not opened  # no extraction started: no activations entry was opened for writing
        assert not cache_dir.exists() or not any(cache_dir.rglob("*.npy"))  # nothing was extracted

    # the backbone that has attention comes first: its work would be thrown away by pixels' failure
    refused("evaluate", "--task", "issameobject", "--dataset", tiny, "--results", tmp_path / "r",
            "--model", tiny_vit, "--model", "pixels", "--probes", "linear,attention-qk",
            message="attention-qk needs a backbone that exposes")
    refused("toys-analysis", "--model", "pixels", "--dataset", tiny, "--out", tmp_path / "toys",
            message="toys-analysis needs identical-object scenes")
    (tmp_path / "a-file").write_text("")
    refused("evaluate", "--dataset", tiny, "--model", "oracle:objects", "--results", tmp_path / "a-file" / "results",
            message="results: cannot write to")
    monkeypatch.setattr("evaluators.cache.extract.shutil.disk_usage", full_disk)
    refused("evaluate", "--dataset", tiny, "--model", "oracle:objects", "--results", tmp_path / "r",
            message="cache: this run needs ~")


def test_cache_estimate_matches_what_extraction_writes(tiny, tiny_vit, tmp_path, cache_dir, capsys, monkeypatch):
    """The estimate is the fp16 bytes extraction writes: refused up front on a full disk, then
    matched by the entry on disk."""
    from evaluators.cache.inventory import list_entries

    # 80 scenes x 3 hidden states x 16 patch tokens x width 32 x 2 bytes (fp16) = 245,760 bytes
    with monkeypatch.context() as m:
        m.setattr("evaluators.cache.extract.shutil.disk_usage", full_disk)
        code, _, err = run(capsys, "evaluate", "--dataset", tiny, "--model", tiny_vit, "--results", tmp_path / "r",
                           "--tokens", "all", "--layers", "all", "--probes", "attention")
    assert code == 2 and "warning: --tokens all over 3 layers" in err and "~246 kB of activations cache" in err
    assert "cache: this run needs ~246 kB in the activations cache" in err.splitlines()[-1]
    code, _, err = run(capsys, "extract", "--model", tiny_vit, "--dataset", tiny, "--tokens", "all", "--layers", "all")
    assert code == 0, err
    data = sum(e.bytes for e in list_entries(cache_dir))
    assert 245_760 <= data <= 245_760 + 3 * 3 * 4096  # + per-array .npy headers and the entry's JSON
    # once cached, a run adds nothing and says nothing about the cache
    code, _, err = run(capsys, "evaluate", "--dataset", tiny, "--model", tiny_vit, "--results", tmp_path / "r",
                       "--tokens", "all", "--layers", "all", "--probes", "attention", "--epochs", "1")
    assert code == 0 and "activations cache" not in err


def test_hugging_face_datasets_reads_the_shards_as_images(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets
    from PIL import Image

    card = json.loads((tiny / "dataset.json").read_text())
    files = [str(tiny / name) for name in card["splits"]["test"]["shards"]]
    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf-cache"))
    scene = ds[0]
    assert isinstance(scene["image"], Image.Image) and isinstance(scene["mask"], Image.Image)
    assert scene["image"].size == (64, 64) and len(ds) == 16
    assert isinstance(ds.features["image"], datasets.Image) and len(scene["F"]) > 0
    # stored as palette PNGs, decoded as RGB (what a vision model expects); masks keep their ids
    raw = pq.read_table(files[0]).slice(0, 1).to_pylist()[0]
    assert Image.open(io.BytesIO(raw["image"]["bytes"])).mode == "P"
    assert scene["image"].mode == "RGB" and scene["mask"].mode == "L"
    ours = next(Dataset(tiny).iter_scenes("test"))
    assert np.array_equal(np.asarray(scene["image"]), ours["image"]) and ours["image"].shape == (64, 64, 3)
    assert np.array_equal(np.asarray(scene["mask"]), ours["mask"]) and ours["mask"].max() >= 1


def test_a_one_class_test_set_is_named_not_left_blank(tmp_path, cache_dir, capsys):
    """One object per scene and --exclude-background: every test pair is 'same', so balanced
    accuracy and AUROC cannot be defined; the run says why instead of printing blanks."""
    data = make_dataset(tmp_path / "single", n_train=24, n_val=8, n_test=8, image_size=64, n_colors=3, n_shapes=3,
                        colors_per_scene=1, shapes_per_scene=1, n_objects=1, object_size=24, margin=2,
                        val_fraction=0.25, test_fraction=0.25)
    code, _, err = run(capsys, "evaluate", "--task", "issameobject", "--dataset", data, "--results", tmp_path / "r",
                       "--model", "pixels:8", "--probes", "cosine", "--exclude-background")
    assert code == 0, err
    assert "hold one class only" in err and "--exclude-background drops every background pair" in err
    rows = read_results(tmp_path / "r").to_pylist()
    assert rows and all(r["status"] == "ok" and r["auroc"] is None for r in rows)


#: A `bench` process that says, last on stdout, which heavy modules it imported; the zoo recipe it is
#: given (JSON, argv[1]) replaces the one of that name, as the in-process run saw it.
RERUN = ("import json, sys\nfrom evaluators.zoo import RECIPES, Recipe\nrecipe = Recipe(**json.loads(sys.argv[1]))\n"
         "RECIPES[recipe.name] = recipe\nfrom bench.cli import main\ncode = main(sys.argv[2:])\n"
         "print(json.dumps([m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]))\n"
         "sys.exit(code)")


@pytest.mark.slow
def test_a_rerun_of_a_finished_study_imports_no_torch(tiny, tmp_path, cache_dir, capsys, monkeypatch):
    """Every row held: `bench run` plans from the registry's metadata (a zoo model's from its recipe
    and card) and the results' keys, writes nothing and keeps the site built from the same results,
    so neither model code (torch, transformers) nor the plotting library loads."""
    import os
    import subprocess
    import sys

    from test_zoo import use_tiny_zoo

    from evaluators.zoo import RECIPES

    use_tiny_zoo(cache_dir, monkeypatch)
    study = tmp_path / "small.toml"
    study.write_text(f'threads = 1\n[datasets.tiny]\npath = "{tiny}"\n[[evaluate]]\n'
                     'backbones = ["oracle:objects", "pixels", "zoo:untrained"]\nprobes = ["linear"]\nepochs = 1\n')
    out = tmp_path / "study"
    code, _, err = run(capsys, "run", study, "--out", out)
    assert code == 0, err
    files, index = sorted((out / "results").glob("*.parquet")), out / "site" / "index.html"
    assert len(read_results(out / "results")) == 3 and index.is_file()
    built = index.stat().st_mtime_ns
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", RERUN, json.dumps(RECIPES["untrained"].to_dict()), "run", str(study),
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "nothing to fit" in done.stderr and done.stderr.count("1/1 rows held (done)") == 3, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    assert "oracle:objects" in done.stdout  # the leaderboard is printed all the same
    assert sorted((out / "results").glob("*.parquet")) == files and index.stat().st_mtime_ns == built


#: A `bench` process that says, last on stdout, whether it imported torch.
TORCHLESS = ("import json, sys\nfrom bench.cli import main\ncode = main(sys.argv[1:])\n"
             "print(json.dumps('torch' in sys.modules))\nsys.exit(code)")


@pytest.mark.slow
def test_a_rerun_of_a_finished_intervention_sweep_imports_no_torch(tiny, tiny_vit, tmp_path, cache_dir, capsys):
    """Every row of a study with an intervention sweep held: the rerun plans the intervened
    backbones from their subspace files, read with numpy (the interventions package loads its
    torch modules only when a backbone runs or a subspace is fitted), and imports no torch."""
    import os
    import subprocess
    import sys

    study = tmp_path / "sweep.toml"
    study.write_text(f'threads = 1\n[datasets.tiny]\npath = "{tiny}"\n[[evaluate]]\nbackbones = ["vit={tiny_vit}"]\n'
                     'probes = ["linear"]\nepochs = 1\ninterventions = { subspace = { kind = "random", layer = 1, '
                     'rank = 2 }, kinds = ["shuffle"], strengths = [1] }\n')
    out = tmp_path / "study"
    code, _, err = run(capsys, "run", study, "--out", out)
    assert code == 0, err
    assert len(list((out / "subspaces").glob("*.npz"))) == 1 and len(read_results(out / "results")) == 2
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", TORCHLESS, "run", str(study), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "nothing to fit" in done.stderr, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) is False
