"""`bench evaluate --executor ray` on a local Ray with 2 CPUs: the same rows as the local path,
also when a worker dies mid-task, and the checks that run before any task.

Equality is exact (metrics to 1e-9) against the local path at one torch thread, the thread
count a CPU task runs with: float32 training rounds differently at other thread counts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from bench.cli import main
from evaluators.cache import inventory as cache_inventory
from evaluators.runner.request import EvaluationRequest
from evaluators.runner.run import run_evaluation
from tests.helpers import TINY_SCENES, make_dataset

ray = pytest.importorskip("ray")

#: The calibration's backbones: oracles whose binding is known exactly, and the no-learning controls.
MODELS = ["oracle:objects", "oracle:features", "oracle:mix-0.5", "pixels", "random:dinov2-small"]
GRID = dict(layers="0.5,last", probes=["linear", "dnn"], seeds=[0], epochs=3)
#: Columns that differ between any two runs of the same grid.
RUN_COLUMNS = {"run_id", "created_at", "wall_time_s", "host", "package_versions", "command"}


def run_plan(models: list[str], data: Path, **options) -> Path | None:
    """The run of one plan, quietly: the local and the Ray path take the same plan."""
    return run_evaluation(EvaluationRequest(models, data, **options), progress=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("ray") / "ds", n_train=96, n_val=32, n_test=32, **TINY_SCENES)


@pytest.fixture(scope="module")
def local_rows(data, tmp_path_factory) -> list[dict]:
    """The grid on the local path, at the one torch thread a Ray CPU task uses."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # threads=1: the default takes the cores other work leaves free, which varies with load
        path = run_plan(MODELS, data, results_dir=tmp_path_factory.mktemp("local"), threads=1, **GRID)
    finally:
        torch.set_num_threads(threads)
    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            if k in RUN_COLUMNS:
                continue
            if isinstance(w[k], float):
                assert g[k] == pytest.approx(w[k], rel=0, abs=1e-9), (k, g["backbone"], g["layer"], g["probe"])
            else:
                assert g[k] == w[k], (k, g["backbone"], g["layer"], g["probe"])


@pytest.mark.ray
@pytest.mark.slow
def test_ray_rows_equal_local_rows_and_logs_every_task(data, local_rows, local_ray, tmp_path):
    results = tmp_path / "results"
    path = run_plan(MODELS, data, results_dir=results, executor="ray", **GRID)
    rows = pq.read_table(path).to_pylist()
    assert_same_rows(rows, local_rows)
    assert {r["status"] for r in rows} == {"ok"} and {r["layer"] for r in rows} == {0, 6, 12}
    logs = sorted(p.name for p in (results / "logs" / rows[0]["run_id"]).iterdir())
    # 5 backbones x 5 row shards (3 of train's 96 rows, 1 each of val and test); training units on a CPU,
    # whose stacks hold one row set: a task per row set (layers 0 and 12 of random:dinov2-small, one
    # layer of the others)
    assert len({(r["backbone"], r["layer"]) for r in rows}) == 6
    assert sum(n.startswith("extract-") for n in logs) == 25 and len(logs) == 1 + 25 + 6 and "driver.log" in logs
    train_logs = [n for n in logs if n.startswith("train-")]
    assert len(train_logs) == 6 and all("trained on 1 row set(s)" in (results / "logs" / rows[0]["run_id"] / n)
                                         .read_text() for n in train_logs)
    # a second run skips every finished row, as locally
    assert run_plan(MODELS, data, results_dir=results, executor="ray", **GRID) is None


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["extract", "train"])
def test_a_killed_worker_is_retried_and_the_rows_are_the_same(stage, data, local_rows, local_ray, tmp_path,
                                                            monkeypatch, capsys):
    marker = tmp_path / "killed"
    # the two cheapest backbones: one training unit dies, the other does not
    models = MODELS[:2]
    if stage == "extract":  # extraction starts from nothing (the cheap backbone), and dies after its first rows
        monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
        models = MODELS[:1]
    monkeypatch.setenv("BINDINGBENCH_FAULT", f"{stage}:{marker}")
    results = tmp_path / "results"
    args = ["evaluate", "--dataset", str(data), "--results", str(results), "--executor", "ray", "--format", "csv",
            "--epochs", "3", "--layers", "0.5,last", "--probes", "linear,dnn"]
    code = main(sum((["--model", m] for m in models), args))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert marker.exists()  # one worker did die
    (path,) = results.glob("*.parquet")
    want = [r for r in local_rows if r["backbone"] in models]
    assert_same_rows(pq.read_table(path).to_pylist(), want)
    assert all(e.complete for e in cache_inventory.list_entries())
    assert len(out.out.strip().splitlines()) == 1 + len(want)  # the table only: no Ray noise on stdout
    assert "per-task logs in" in out.err and "Traceback" not in out.err


def test_storage_a_worker_cannot_see_is_named_in_one_line(data, tmp_path):
    from evaluators.runner.ray_tasks import _storage_problem

    card = data / "dataset.json"
    digest = hashlib.sha256(card.read_bytes()).hexdigest()
    token = tmp_path / "token"
    token.write_text("abc")
    mine = hashlib.sha256(b"abc").hexdigest()
    assert _storage_problem(str(card), digest, str(token), mine) is None
    assert "cannot read dataset" in _storage_problem(str(tmp_path / "elsewhere" / "dataset.json"), digest,
                                                     str(token), mine)
    assert "does not see the driver's activation cache" in _storage_problem(str(card), digest, str(token), digest)


@pytest.mark.ray
@pytest.mark.slow
def test_generate_on_ray_writes_the_same_bytes(local_ray, tmp_path, capsys):
    args = ["generate", "colorshape", "--preset", "small", "--n-train", "24", "--n-val", "8", "--n-test", "8",
            "--image-size", "64", "--set", "n_objects=3", "--set", "object_size=12", "--set", "margin=2",
            "--set", "n_colors=3", "--set", "n_shapes=3", "--set", "colors_per_scene=2", "--set", "shapes_per_scene=2",
            "--set", "shard_size=8"]
    assert main([*args, "--out", str(tmp_path / "local"), "--workers", "1"]) == 0
    assert main([*args, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0, capsys.readouterr().err
    local = {p.name: p.read_bytes() for p in (tmp_path / "local").glob("*.parquet")}
    assert len(local) == 5 and local == {p.name: p.read_bytes() for p in (tmp_path / "ray").glob("*.parquet")}
    cards = [json.loads((tmp_path / d / "dataset.json").read_text()) for d in ("local", "ray")]
    assert cards[0]["splits"] == cards[1]["splits"]


@pytest.mark.parametrize("extra, message", [
    (["--executor", "dask"], "executor: unknown 'dask'"),
    (["--address", "auto"], "need --executor ray"),
    (["--executor", "ray", "--gpus-per-task", "-1"], "gpus-per-task: must be ≥ 0"),
])
def test_bad_executor_options_exit_2_with_one_line(extra, message, data, tmp_path, capsys):
    code = main(["evaluate", "--model", "pixels", "--dataset", str(data), "--results", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_local_path_does_not_import_ray():
    code = ("import sys, bench.cli, evaluators.runner.run, bench.commands.evaluate; "
            "sys.exit('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1]).returncode == 0


@pytest.mark.ray
@pytest.mark.slow
def test_input_settings_reach_the_ray_workers(data, local_rows, local_ray, tmp_path):
    """--image-size/--mean/--std: each worker builds the backbone with them, as the driver does."""
    grid = dict(layers="last", probes=["linear"], seeds=[0], epochs=3, image_size=28, mean=(0.5, 0.5, 0.5))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = pq.read_table(run_plan(["random:dinov2-small"], data, results_dir=tmp_path / "local", threads=1,
                                       **grid)).to_pylist()
    finally:
        torch.set_num_threads(threads)
    got = pq.read_table(run_plan(["random:dinov2-small"], data, results_dir=tmp_path / "ray", executor="ray",
                                 **grid)).to_pylist()
    assert_same_rows(got, local)
    # the settings did reach the model: the same row without them reads other numbers
    (default,) = [r for r in local_rows if r["backbone"] == "random:dinov2-small" and r["layer"] == 12
                  and r["probe"] == "linear"]
    assert got[0]["L_O_paper"] != pytest.approx(default["L_O_paper"], abs=1e-6)


@pytest.mark.ray
@pytest.mark.slow
def test_issameobject_on_ray_equals_the_local_rows(data, local_ray, tmp_path):
    """Extraction in row shards, one task per (backbone, layer) with every probe and seed, rows in
    the local order; the attention baseline and correlations need the model inside the task."""
    from test_backbones import tiny_checkpoint

    ckpt = str(tiny_checkpoint("dinov2", tmp_path / "m")[1])
    grid = dict(task="issameobject", seeds=[0, 1], tokens=["all"], epochs=2)
    runs = [([ckpt], dict(layers="0,1", probes=["linear", "cosine", "attention-qk"])),
            (["oracle:patches"], dict(probes=["linear", "cosine"]))]
    local, got = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, (models, kw) in enumerate(runs):
            local += pq.read_table(run_plan(models, data, results_dir=tmp_path / f"local{i}", threads=1, **grid,
                                                  **kw)).to_pylist()
    finally:
        torch.set_num_threads(threads)
    for i, (models, kw) in enumerate(runs):
        got += pq.read_table(run_plan(models, data, results_dir=tmp_path / f"ray{i}", executor="ray", **grid,
                                            **kw)).to_pylist()
    assert len(got) == 2 * 2 * 3 + 2 * 2 and {r["status"] for r in got} == {"ok"}
    assert any(r["attention_r"] is not None for r in got)
    assert_same_rows(got, local)


@pytest.mark.ray
@pytest.mark.slow
def test_gpu_tasks_ask_for_their_share_and_share_a_gpu():
    """No GPU here: a Ray started with two logical GPUs schedules the executor's task options,
    four 0.5-GPU tasks at once on two devices (the packing `--gpus-per-task 0.5` asks for). "At
    once" is a barrier all four must reach while each holds its share, not overlapping clocks: on a
    busy machine Ray's workers start seconds apart, and tasks of a second apiece then never overlapped."""
    from evaluators.runner.ray_tasks import slots, task_options

    assert task_options(0.5)["num_gpus"] == 0.5 and task_options(0.0)["num_gpus"] == 0.0
    assert task_options(0.5)["num_cpus"] == 1
    code = f"""
import logging, time, ray
from evaluators.runner.ray_tasks import slots, task_options
ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
@ray.remote(num_cpus=0)
class Barrier:
    def __init__(self):
        self.arrived = 0
    def arrive(self):
        self.arrived += 1
    def count(self):
        return self.arrived
barrier = Barrier.remote()
def held(barrier):
    ray.get(barrier.arrive.remote())
    deadline = time.time() + 120
    while ray.get(barrier.count.remote()) < 4 and time.time() < deadline:
        time.sleep(0.05)
    return ray.get_gpu_ids(), ray.get(barrier.count.remote()) == 4
out = ray.get([ray.remote(held).options(**task_options(0.5)).remote(barrier) for _ in range(4)])
print(slots(0.5), slots(1.0), slots(0.0), sorted(str(ids) for ids, _ in out), all(met for _, met in out))
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[0] == "4 2 4 ['[0]', '[0]', '[1]', '[1]'] True"


def test_gpu_requests_follow_the_device():
    from bench.core.errors import BenchError
    from evaluators.runner.ray_tasks import task_gpus

    assert task_gpus("cuda", None) == 1.0 and task_gpus("cuda", 0.5) == 0.5 and task_gpus("cpu", None) == 0.0
    for device, gpus in (("cpu", 1.0), ("cuda", 0.0)):
        with pytest.raises(BenchError, match="gpus-per-task"):
            task_gpus(device, gpus)
