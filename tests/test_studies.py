"""Study files and `bench run`: a whole comparison from one file, run with one command, making
only what is missing (a rerun fits nothing, an added backbone only its rows, a run killed with
kill -9 resumes to the same rows); bad files exit 2 with one line naming the file and key path;
the shipped studies plan offline and ship in the wheel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bench.cli import main
from bench.core.results import read_results

#: Columns that differ between two runs of the same rows.
RUN_COLUMNS = ("run_id", "created_at", "wall_time_s", "command", "host", "device", "package_versions")

GRID = """
description = "Two datasets, references, a tiny ViT, three families, attention and IsSameObject."
threads = 1

[datasets.cs-a]
generator = "colorshape"
preset = "small"
n_train = 32
n_val = 12
n_test = 12
image_size = 64
set = {{ n_colors = 3, n_shapes = 3, colors_per_scene = 2, shapes_per_scene = 2, n_objects = 3, object_size = 12, margin = 2, val_fraction = 0.25, test_fraction = 0.25 }}

[datasets.cs-b]
path = "{data_b}"

[[evaluate]]
backbones = [{backbones}]
tokens = "cls"
probes = ["linear", "quadratic", "dnn"]
epochs = 2

[[evaluate]]
backbones = ["pixels"]
datasets = ["cs-a"]
tokens = "all"
probes = ["attention"]
epochs = 1

[[evaluate]]
backbones = [{pair_backbones}]
datasets = ["cs-b"]
task = "issameobject"
layers = "last"
probes = ["linear", "cosine"]
epochs = 1
limit = 8
"""
BACKBONES = ['"oracle:objects"', '"pixels"', '"vit=./vit"']
PAIR_BACKBONES = ['"pixels"', '"vit=./vit"']
#: A part of the grid (one dataset, two backbones) that a test kills mid-run.
PART = """
threads = 1
[datasets.cs-b]
path = "data-b"
[[evaluate]]
backbones = ["oracle:objects", "pixels"]
tokens = "cls"
probes = ["linear", "quadratic", "dnn"]
epochs = 2
"""


def rows_of(results: Path) -> dict[tuple, dict]:
    """Every row by its key, without the columns that name the run rather than the measurement."""
    from bench.core.results import KEY_COLUMNS

    out = {}
    for r in read_results(results).to_pylist():
        out[tuple(r[c] for c in KEY_COLUMNS)] = {k: v for k, v in r.items() if k not in RUN_COLUMNS}
    return out


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """The grid study's folder: a tiny DINOv2 checkpoint (./vit) and a second dataset beside it."""
    from tests.helpers import TINY_SCENES, make_dataset
    from tests.test_backbones import tiny_checkpoint

    root = tmp_path_factory.mktemp("grid")
    tiny_checkpoint("dinov2", root / "vit")
    make_dataset(root / "data-b", n_train=32, n_val=12, n_test=12, seed=5, **TINY_SCENES)
    return root


def write_grid(root: Path, name: str, pair_backbones: list[str] = PAIR_BACKBONES) -> Path:
    path = root / f"{name}.toml"
    path.write_text(GRID.format(data_b="data-b", backbones=", ".join(BACKBONES),
                                pair_backbones=", ".join(pair_backbones)))
    return path


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_a_grid_runs_with_one_command_and_reruns_only_what_is_missing(grid, tmp_path, capsys):
    study = write_grid(grid, "grid")
    code, out, err = run(capsys, "run", study, "--out", tmp_path / "a", "--dry-run")
    assert code == 0, err
    assert "cs-a: to make" in out and "cs-b: present" in out and "vit (" in out and "2 layers, hidden states 2" in out
    assert "30 s a row set, a stated constant" in out and not (tmp_path / "a" / "results").exists()

    code, out, err = run(capsys, "run", study, "--out", tmp_path / "a", "--format", "json")
    assert code == 0, err
    rows = rows_of(tmp_path / "a" / "results")
    # binding: 4 backbones x 2 datasets x 3 families (the ViT at its last layer); attention: 1;
    # IsSameObject: 2 backbones x 2 probes
    assert len(rows) == 3 * 2 * 3 + 1 + 2 * 2, sorted(rows)
    assert all(r["status"] == "ok" for r in rows.values()), [r["error"] for r in rows.values() if r["error"]]
    files = sorted((tmp_path / "a" / "results").glob("*.parquet"))

    # run again: the plan holds every row and nothing is fitted
    code, out, err = run(capsys, "run", study, "--out", tmp_path / "a", "--dry-run")
    assert "to fit: 0 row sets" in out and "(nothing to fit)" in out
    code, _, err = run(capsys, "run", study, "--out", tmp_path / "a")
    assert code == 0 and "nothing to fit" in err
    assert sorted((tmp_path / "a" / "results").glob("*.parquet")) == files

    # one backbone more: only its rows are fitted, the plan says so first
    study = write_grid(grid, "grid", [*PAIR_BACKBONES, '"pixels:8"'])
    code, out, _ = run(capsys, "run", study, "--out", tmp_path / "a", "--dry-run")
    assert "to fit: 1 row sets" in out and "· pixels:8: 0 layers, hidden states 0; tokens all; probes linear,cosine; " \
                                            "1 row sets; 0/2 rows held" in out
    assert "from the wall_time_s of the rows already present" in out  # timed by the rows of its task
    assert run(capsys, "run", study, "--out", tmp_path / "a")[0] == 0
    new = [f for f in (tmp_path / "a" / "results").glob("*.parquet") if f not in files]
    assert len(new) == 1
    assert {(r["backbone"], r["task"], r["probe"]) for r in read_results(new[0].parent).to_pylist()
            if r["run_id"] == new[0].stem} == {("pixels:8", "issameobject", "linear"), ("pixels:8", "issameobject", "cosine")}

    # killed with kill -9 mid-run (after its first backbone's rows) and run again: the rows of the
    # uninterrupted run above, every key and number
    part = grid / "part.toml"
    part.write_text(PART)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", STALLED_RUN, "run", str(part), "--out", str(tmp_path / "b")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300  # a hang guard: the first backbone's rows take seconds
    while not list((tmp_path / "b" / "results").glob("*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run wrote no rows"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(rows_of(tmp_path / "b" / "results")) == 3, "the kill should land between the two backbones"
    assert run(capsys, "run", part, "--out", tmp_path / "b")[0] == 0
    again = rows_of(tmp_path / "b" / "results")
    assert len(again) == 6 and again.keys() <= rows.keys()
    different = {k: [c for c in again[k] if rows[k][c] != again[k][c]] for k in again if rows[k] != again[k]}
    assert not different, different


#: `bench run` whose second write of its rows (the second backbone's) never comes: it stays between
#: the two backbones until it is killed, whatever the machine's speed.
STALLED_RUN = """
import time
import evaluators.tasks.binding.run as binding
import evaluators.tasks.issameobject.run as pairs
from bench.cli import main

write, writes = binding.write_run, []
def stalled(*args):
    writes.append(1)
    if len(writes) == 2:
        time.sleep(600)
    return write(*args)
binding.write_run = pairs.write_run = stalled  # each task's runner writes its rows
main()
"""


#: (study text, the key path its one line names)
MALFORMED = [
    ("evaluate = []\n[datasets.a]\npath = 'x'", "datasets.a.path"),
    ("[[evaluate]]\nbackbones = ['pixels']", "datasets: missing"),
    ("[datasets.a]\ngenerator = 'colorshape'", "evaluate: missing"),
    ("colour = 1\n[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']", "colour: unknown key"),
    ("threads = 'two'\n[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']", "threads: expected an integer"),
    ("threads = 0\n[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']", "threads: must be ≥ 1"),
    ("[datasets.a]\ngenerator = 'colourshape'\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a.generator: generator: unknown"),
    ("[datasets.a]\ngenerator = 'colorshape'\npreset = 'huge'\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a: preset"),
    ("[datasets.a]\ngenerator = 'colorshape'\nn_train = 'many'\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a.n_train: expected an integer"),
    ("[datasets.a]\ngenerator = 'colorshape'\npath = 'x'\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a: give exactly one"),
    ("[datasets.a]\nimport = 'coco'\nsrc = 'x'\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a.import: unknown importer"),
    ("[datasets.a]\nimport = 'clevr'\nsrc = 'x'\ntop_n = 3\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a.top_n: unknown key"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixles']", "evaluate[1].backbones[1]: model: unknown backbone"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels', 'random:dinov3']", "evaluate[1].backbones[2]"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\nprobes = ['linear', 'mlp']", "evaluate[1].probes[2]: unknown probe 'mlp'"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\ntokens = 'patches'", "evaluate[1].tokens: unknown tokens"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\ntask = 'binding'\n[[evaluate]]\nbackbones = ['pixels']\ntask = 'depth'", "evaluate[2].task: unknown task"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\ndatasets = ['b']", "evaluate[1].datasets[1]: no dataset 'b'"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\nseeds = [0, 'one']", "evaluate[1].seeds[2]: expected an integer"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\n[leaderboard]\nmetrics = ['beta']", "leaderboard.metrics[1]: unknown metric"),
    ("[datasets.a]\ngenerator = 'colorshape'\nn_train = '${N}'\n[[evaluate]]\nbackbones = ['pixels']", "datasets.a.n_train: ${N} is not set"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\ncontrol = 'shuffled'", "evaluate[1].control: unknown control"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = { a = 'pixels', b = { spec = 'pixels', size = 3 } }", "evaluate[1].backbones.b.size: unknown key"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['a=pixels']\n[[evaluate]]\nbackbones = ['a=oracle:objects']", "evaluate[2].backbones: a names oracle:objects here"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]\nbackbones = ['pixels']", "not valid TOML"),
    # the request's own checks (`EvaluationRequest`), their one line after the block's key path
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\ntask = 'issameobject'\ntokens = 'cls'",
     "evaluate[1]: tokens: issameobject reads all only"),
    ("[datasets.a]\ngenerator = 'colorshape'\n[[evaluate]]\nbackbones = ['pixels']\nepochs = 0", "evaluate[1]: epochs: must be ≥ 1"),
]


@pytest.mark.parametrize("text, key", MALFORMED, ids=[k.split(":")[0] for _, k in MALFORMED])
def test_a_malformed_study_exits_2_with_one_line_naming_the_file_and_key(tmp_path, capsys, text, key):
    study = tmp_path / "bad.toml"
    study.write_text(text)
    code, out, err = run(capsys, "run", study, "--out", tmp_path / "out")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"bench: error: {study}: ") and key in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


#: One request of both backbone kinds: a ground-truth one (its mean view an alias of cls) and a
#: checkpoint folder, under a limit smaller than every split.
SAME_REQUEST = """
[datasets.d]
path = "data-b"
[[evaluate]]
backbones = ["pixels", "vit=./vit"]
tokens = ["cls", "mean"]
probes = ["linear", "quadratic"]
seeds = [0, 1]
limit = 8
"""


def test_a_study_plans_the_rows_and_cache_bench_evaluate_plans(grid, tmp_path, monkeypatch):
    """One planner: a study asks the evaluation planner on the request `bench evaluate` makes, so
    both key the same rows (`row_key`), owe the same row sets (the cls/mean alias, the limit) and
    count the same cache bytes."""
    from bench import api
    from bench.core.dataset import Dataset
    from bench.core.results import existing_keys, row_key, write_run
    from evaluators.cache.extract import pending_bytes, split_fingerprint
    from evaluators.runner.planning import backbone_plans, effective_limit

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    (grid / "same.toml").write_text(SAME_REQUEST)
    study = api.load_study(grid / "same.toml")
    block, ds = study.blocks[0], Dataset(grid / "data-b")
    request = block.request(block.backbones, ds.path)
    limit = effective_limit(ds, request.limit)
    test_fp = split_fingerprint(ds, "test", limit)
    pixels, vit = backbone_plans(request, ds, done=set(), test_fp=test_fp, limit=limit, progress=False)
    assert limit == 8 and pixels.aliases == {"cls": ["mean"]} and vit.aliases == {}
    # the rows the run would write, as it keys them; held: every row of seed 0, and pixels' cls rows of seed 1
    rows = [dict(backbone=p.name, dataset=ds.name, dataset_fingerprint=test_fp, limit=limit, control=None,
                 split="test", layer=w.layer, tokens=v, task="binding", probe=f, seed=w.seed, status="ok",
                 weights_fingerprint=p.backbone.info.revision, probe_fingerprint=p.probe_fps[f])
            for p in (pixels, vit) for w in p.todo for f in w.families for v in p.shown(w.tokens)]
    held = [r for r in rows if r["seed"] == 0 or (r["backbone"] == "pixels" and r["tokens"] == "cls")]
    out = tmp_path / "out"
    write_run(held, out / "results", "held")
    (out / "bench-study.json").write_text('{"study": "same", "settings": {}}')
    assert existing_keys(out / "results") == {row_key(r) for r in held}
    evaluate = backbone_plans(request, ds, done=existing_keys(out / "results"), test_fp=test_fp, limit=limit,
                              progress=False)
    plan = api.plan_study(study, out)
    units = {u.backbone.name: u for u in plan.units}
    for p, pending, kept in zip(evaluate, (1, 2), (6, 4)):  # pixels owes seed 1 (its mean rows), the vit seed 1
        u = units[p.name]
        assert (u.layers, u.pending_row_sets, u.held) == (tuple(p.layers), len(p.todo), kept) and len(p.todo) == pending
        assert (u.rows, u.row_sets) == (len([r for r in rows if r["backbone"] == p.name]),
                                        len(p.layers) * len(p.token_choices) * 2)
    assert [p.skipped for p in evaluate] == [2, 4]
    assert units["vit"].activation_bytes == sum(
        pending_bytes(vit.backbone, ds, s, layers=vit.layers, token_choices=vit.token_choices, dtype=request.dtype,
                      limit=limit)
        for s in ("train", "val", "test")) > 0


def test_variables_fill_values_with_their_types_and_typos_are_refused(tmp_path, capsys, monkeypatch):
    from bench import api

    study = tmp_path / "vars.toml"
    study.write_text("[datasets.a]\ngenerator = 'colorshape'\npreset = 'small'\nn_train = '${N:-40}'\n"
                     "[[evaluate]]\nbackbones = ['pixels']\nepochs = '${EPOCHS:-}'\n")
    assert api.load_study(study).datasets["a"].overrides["n_train"] == 40
    assert api.load_study(study, {"N": "12"}).datasets["a"].overrides["n_train"] == 12
    monkeypatch.setenv("EPOCHS", "3")
    assert api.load_study(study).blocks[0].options["epochs"] == 3
    monkeypatch.delenv("EPOCHS")
    assert "epochs" not in api.load_study(study).blocks[0].options  # empty: the evaluator's default
    code, _, err = run(capsys, "run", study, "--set", "NN=3", "--dry-run")
    assert code == 2 and "set: the study reads no variable NN (it reads: EPOCHS, N)" in err


def test_a_folder_of_another_study_is_refused(grid, tmp_path, capsys):
    study = write_grid(grid, "grid")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "bench-study.json").write_text('{"study": "other", "settings": {}}')
    code, _, err = run(capsys, "run", study, "--out", tmp_path / "out", "--dry-run")
    assert code == 2 and "holds study 'other'" in err


#: The first hub download each paper's study names in its dry run (its first backbone's).
PRESET_HUB_IDS = {"fbp": "facebook/dinov2-large", "obv": "facebook/dinov2-small"}


@pytest.mark.parametrize("name, layers", [
    ("fbp", {"dinov2-large": 24, "dinov2-large-336": 24, "clip-vit-large-14": 24, "clip-vit-large-14-336": 24}),
    ("obv", {"dinov2-small": 12, "dinov2-base": 12, "dinov2-large": 24, "dinov2-giant": 40, "clip-vit-large-14": 24,
             "mae-vit-large": 24, "vit-large-16": 24}),
])
def test_the_papers_studies_plan_offline_with_every_layer_count(name, layers, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache: nothing is there to read
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "run", name, "--dry-run")
    assert code == 0, err
    for backbone, n in layers.items():
        assert f"· {backbone}" in out and f"{n} layers" in out
    # named as needing the hub (a run offline refuses them before it makes anything: test_hostile_inputs)
    assert f"not in the local cache, downloaded when it runs: {PRESET_HUB_IDS[name]}" in out
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))
    assert not (tmp_path / name).exists()  # a dry run writes nothing


def test_bench_studies_lists_the_shipped_ones(capsys):
    code, out, _ = run(capsys, "studies", "--format", "json")
    assert code == 0 and {"demo", "fbp", "obv"} <= set(out.replace('"', " ").split())


def test_a_folder_named_like_a_shipped_study_does_not_hide_it(tmp_path, monkeypatch):
    """`bench demo` run in a working directory that holds a folder named `demo` reads the shipped
    study (it took the folder for the study file and stopped: "no study file demo")."""
    from bench import api

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    study = api.load_study("demo")
    assert study.name == "demo" and study.source == "shipped:demo"
    (tmp_path / "mine.toml").mkdir()
    with pytest.raises(api.BenchError, match="no study file mine.toml"):
        api.load_study("mine.toml")


def test_the_studies_ship_in_the_wheel(tmp_path):
    import shutil

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "source"  # built from a copy: a build leaves build/ and *.egg-info beside the sources
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "tests",
                                                                 "benchmarks", "docs", "bench-demo*"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("bindingbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"bench/studies/demo.toml", "bench/studies/fbp.toml", "bench/studies/obv.toml",
            "bench/studies/zoo-ablation.toml", "bench/studies/obv-ablation.toml"} <= names


SWEEP_STUDY = """
[datasets.zoo]
generator = "colorshape"
preset = "zoo"

[[evaluate]]
backbones = ["pixels", "named=oracle:objects"]
interventions = { subspace = { kind = "binding", layer = 1, rank = 4 }, kinds = ["shuffle", "inject"], \
strengths = [0, 0.5, 1], controls = ["random"] }
"""


def test_an_intervention_sweep_plans_its_subspaces_and_intervened_backbones_without_fitting(tmp_path):
    """An `interventions` table expands, per backbone and dataset, into one subspace file per
    subspace kind (fitted once, in the study folder) and an intervened backbone per (subspace,
    kind, strength) other than the kind's identity strength, whose spec reads back to exactly that."""
    from bench import api
    from bench.core.intervention_specs import parse_intervention
    from bench.studies.sweeps import sweep_plan

    (tmp_path / "s.toml").write_text(SWEEP_STUDY)
    block = api.load_study(tmp_path / "s.toml").blocks[0]
    assert "interventions" not in block.options  # not a request keyword
    plan = sweep_plan(block.interventions, block.backbones, "zoo", tmp_path / "study")
    folder = (tmp_path / "study" / "subspaces").resolve()
    assert [(f.backbone, f.spec, f.kind, f.layer, f.rank, f.seed, f.path) for f in plan.fits] == [
        ("pixels", "pixels", "binding", 1, 4, 0, folder / "pixels-L1-binding-r4-s0-zoo.npz"),
        ("pixels", "pixels", "random", 1, 4, 0, folder / "pixels-L1-random-r4-s0-zoo.npz"),
        ("named", "oracle:objects", "binding", 1, 4, 0, folder / "named-L1-binding-r4-s0-zoo.npz"),
        ("named", "oracle:objects", "random", 1, 4, 0, folder / "named-L1-random-r4-s0-zoo.npz"),
    ]
    names = dict(plan.backbones)
    assert len(names) == 16  # 2 backbones x 2 subspaces x 2 kinds x 2 strengths (shuffle 0, inject 1 are the base)
    spec = parse_intervention(names["named shuffle 0.5 (random)"])
    assert (spec.kind, spec.strength, spec.layer, spec.subspace, spec.seed, spec.base) == (
        "shuffle", 0.5, 1, str(folder / "named-L1-random-r4-s0-zoo.npz"), 0, "oracle:objects")
    assert {parse_intervention(s).strength for n, s in names.items() if " inject " in n} == {0.0, 0.5}
    assert {parse_intervention(s).strength for n, s in names.items() if " shuffle " in n} == {0.5, 1.0}


@pytest.mark.parametrize("name, sweeps", [
    # per block: (task, datasets, subspace files, intervened backbones) planned on its first dataset
    ("zoo-ablation", [("segmentation", ("zoo-scenes", "toys"), 12, 48), ("binding", ("zoo-scenes", "toys"), 12, 48),
                      ("objective", ("zoo-scenes",), 9, 36)]),
    ("obv-ablation", [("segmentation", ("ade20k",), 2, 8)]),
])
def test_the_shipped_ablation_studies_load_and_plan_their_sweeps(name, sweeps, tmp_path, monkeypatch):
    """zoo-ablation: four zoo ViTs (three with an objective) at hidden state 2, binding, random and
    feature subspaces, shuffle 0.5/1 and inject 0.5/0 beside the unchanged network, on the zoo's
    scenes and the toys; obv-ablation: DINOv2-L at layer 18 on ADE20K (needs downloads: loaded, not run)."""
    from bench import api
    from bench.studies.sweeps import sweep_plan

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    study = api.load_study(name, allow_unset=True)
    planned = []
    for block in study.blocks:
        plan = sweep_plan(block.interventions, block.backbones, block.datasets[0], tmp_path)
        planned.append((block.task, block.datasets, len(plan.fits), len(plan.backbones)))
        assert {f.layer for f in plan.fits} == ({18} if name == "obv-ablation" else {2})
    assert planned == sweeps


def test_the_ablation_studies_are_listed_among_the_shipped_ones(capsys):
    code, out, _ = run(capsys, "studies", "--format", "json")
    assert code == 0 and {"zoo-ablation", "obv-ablation"} <= set(out.replace('"', " ").split())


def test_a_sweeping_block_says_what_its_sweep_adds_in_the_plan(tmp_path, monkeypatch):
    """`bench run --dry-run` names, per sweeping block, the intervened backbones and subspace fits
    its sweep adds after the block's own rows (they are not in the plan's row sets)."""
    from bench import api

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    lines = api.plan_study(api.load_study("zoo-ablation"), tmp_path / "out").lines()
    assert "  evaluate[3] objective then sweeps 36 intervened backbones (9 subspaces to fit); not in the row sets " \
           "or the estimate above" in lines, lines
