"""Third-party entries through Python entry points (bench/core/registry.py), in a real process.

A throwaway `*.dist-info` with an `entry_points.txt` and a one-file plugin on PYTHONPATH
(no pip, no network; all from docs/how-to/plugins.md) registers a backbone source, a binding probe
family, a generator and a task; the new names must reach `bench models`, `bench evaluate --help`,
a results row, a study, the leaderboard and the site, exactly as built-in ones do."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.errors import BenchError
from bench.core.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-c", "from bench.cli import main; main()"]

PLUGINS = ROOT / "docs/how-to/plugins.md"


def plugins_block(lang: str, n: int = 0) -> str:
    """The Plugins how-to's `n`th code block in `lang`: the test runs what the page shows."""
    return re.findall(rf"```{lang}\n(.*?)```", PLUGINS.read_text(), re.S)[n]


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    (site / "bbplugin.py").write_text(plugins_block("python"))
    (site / "bbtask.py").write_text(plugins_block("python", 1))  # the toy task
    info = site / "bbplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bbplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(plugins_block("ini"))
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def bench(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    p = subprocess.run([*BENCH, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.slow
def test_a_plugin_reaches_models_help_results_and_the_leaderboard(plugin_env, tmp_path):
    models = bench(plugin_env, "models", "--format", "csv")
    assert "coarse:16,coarse," in models  # listed under its own source
    assert "coarse:16,coarse," not in bench({**os.environ, "PYTHONPATH": str(ROOT)}, "models", "--format", "csv")
    assert "coarse:<P>" in bench(plugin_env, "models")  # its spec form is named
    help_text = " ".join(bench(plugin_env, "evaluate", "--help").split())
    assert "dnn, attention (needs --tokens all), plug-linear" in help_text
    assert "plug-shapes" in bench(plugin_env, "generators", "--format", "csv")

    data, results = tmp_path / "data", tmp_path / "results"
    bench(plugin_env, "generate", "plug-shapes", "--preset", "small", "--n-train", "40", "--n-val", "20",
          "--n-test", "20", "--workers", "1", "--out", str(data))
    bench(plugin_env, "evaluate", "-m", "coarse:16", "-d", str(data), "--probes", "linear,plug-linear",
          "--epochs", "2", "--threads", "1", "--results", str(results), "--format", "csv")
    cells = list(csv.DictReader(io.StringIO(bench(plugin_env, "leaderboard", str(results), "--format", "csv"))))
    # the plugin's backbone and probe, ranked beside a built-in probe, which comes first (registration order)
    assert [(c["backbone"], c["probe"], c["tokens"], c["status"]) for c in cells] == [
        ("coarse:16", "linear", "cls", "ok"), ("coarse:16", "plug-linear", "cls", "ok")]
    assert all(float(c["n_F_eff"]) > 1 and c["value"] for c in cells)


def failing(args: list[str], env: dict[str, str]) -> str:
    """Run the CLI in a process; assert exit 2 and one `bench: error:` line; return it."""
    p = subprocess.run([*BENCH, *args], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("bench: error: "), p.stderr
    return p.stderr.strip()


STUDY = """
threads = 1
[datasets.toy]
path = "{data}"
[[evaluate]]
backbones = ["coarse:16"]
task = "norm"
"""


@pytest.mark.slow
def test_a_plugin_task_runs_through_evaluate_a_study_the_leaderboard_and_the_site(plugin_env, tmp_path):
    """The toy task of docs/how-to/plugins.md, from the test package's `bindingbench.tasks` entry
    point: named by `--help`, run by `bench evaluate --task norm` and by a study's block, ranked
    by the leaderboard and shown by the site; uninstalled, its rows are set aside in one line."""
    help_text = " ".join(bench(plugin_env, "evaluate", "--help").split())
    assert "norm (share of scenes whose token norm beats the median)" in help_text
    assert "norm: median-norm [median-norm]" in help_text  # its probe registry and defaults
    data, results = tmp_path / "data", tmp_path / "results"
    bench(plugin_env, "generate", "colorshape", "--preset", "small", "--n-train", "40", "--n-val", "20",
          "--n-test", "20", "--workers", "1", "--out", str(data))
    out = bench(plugin_env, "evaluate", "-m", "coarse:16", "-d", str(data), "--task", "norm", "--threads", "1",
                "--results", str(results), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))  # the record's summary columns
    assert list(rows[0]) == ["backbone", "layer", "tokens", "probe", "seed", "status", "majority_accuracy", "error"]
    assert [(r["backbone"], r["layer"], r["tokens"], r["probe"], r["status"]) for r in rows] == [
        ("coarse:16", "0", "mean", "median-norm", "ok")]
    assert 0.4 <= float(rows[0]["majority_accuracy"]) <= 0.6  # about half the scenes beat the median
    cells = list(csv.DictReader(io.StringIO(bench(plugin_env, "leaderboard", str(results), "--task", "norm",
                                                  "--format", "csv"))))
    assert [(c["backbone"], c["probe"], c["tokens"], c["status"], c["metric"]) for c in cells] == [
        ("coarse:16", "median-norm", "mean", "ok", "majority_accuracy")]
    assert float(cells[0]["value"]) == float(rows[0]["majority_accuracy"])

    study = tmp_path / "toy.toml"
    study.write_text(STUDY.format(data=data))
    bench(plugin_env, "run", str(study), "--out", str(tmp_path / "study"))
    from bench.core.results import read_results

    made = read_results(tmp_path / "study" / "results").to_pylist()
    assert [(r["task"], r["probe"], r["status"]) for r in made] == [("norm", "median-norm", "ok")]

    bench(plugin_env, "site", str(results), "--out", str(tmp_path / "site"))
    index = (tmp_path / "site" / "index.html").read_text()
    assert "median-norm" in index and "above-median share" in index

    plain = {**os.environ, "PYTHONPATH": str(ROOT)}  # the plugin uninstalled: its rows are set aside
    p = subprocess.run([*BENCH, "leaderboard", str(results)], capture_output=True, text=True, env=plain, timeout=600)
    set_aside = [x for x in p.stderr.splitlines() if "no installed task registers" in x]
    assert len(set_aside) == 1 and "1 rows of task norm" in set_aside[0], p.stderr


def test_a_plugin_task_that_fails_to_import_or_takes_a_name_is_one_line(tmp_path):
    site = tmp_path / "site"
    info = site / "badtask-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: badtask\nVersion: 0.1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    (info / "entry_points.txt").write_text("[bindingbench.tasks]\nsegmentation = no_such_task_module\n")
    line = failing(["evaluate", "-m", "pixels", "-d", str(tmp_path), "--task", "segmentation"], env)
    assert line.startswith("bench: error: plugin: bindingbench.tasks entry point 'segmentation' "
                           "(no_such_task_module) failed: ModuleNotFoundError"), line
    (site / "taken.py").write_text("from bench.core.tasks import TASKS, Task\n"
                                   "TASKS.register('binding', Task('mine', 'x:Y', 'x:run', 'm', ()))\n")
    (info / "entry_points.txt").write_text("[bindingbench.tasks]\nbinding = taken\n")
    line = failing(["evaluate", "-m", "pixels", "-d", str(tmp_path), "--task", "binding"], env)
    assert line == ("bench: error: plugin: bindingbench.tasks entry point 'binding' (taken) failed: "
                    "BenchError: task: 'binding' is registered twice"), line


def test_the_old_probes_group_still_reaches_the_binding_families():
    from evaluators.probes.families import BINDING_PROBES, ISSAMEOBJECT_PROBES

    assert BINDING_PROBES.groups == ("bindingbench.binding_probes", "bindingbench.probes")
    assert ISSAMEOBJECT_PROBES.groups == ("bindingbench.issameobject_probes",)


def test_a_plugin_that_fails_to_load_is_one_line(tmp_path):
    site = tmp_path / "site"
    (site / "broken-0.1.dist-info").mkdir(parents=True)
    (site / "broken-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (site / "broken-0.1.dist-info" / "entry_points.txt").write_text("[bindingbench.backbones]\nb = no_such_module\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    p = subprocess.run([*BENCH, "models"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2
    assert p.stderr.startswith("bench: error: plugin: bindingbench.backbones entry point 'b' (no_such_module) failed: "
                               "ModuleNotFoundError") and p.stderr.count("\n") == 1, p.stderr


def test_registry_names_get_and_unknown_names():
    reg: Registry[int] = Registry("colour")
    reg.register("red", 1)

    @reg.register("green")
    def green() -> int:
        return 2

    assert reg.names() == ("red", "green") and reg.get("red") == 1 and reg.get("green") is green
    with pytest.raises(BenchError, match=r"^colour: unknown 'gren'; allowed: red, green \(did you mean green\?\)$"):
        reg.get("gren")
    with pytest.raises(BenchError, match=r"^colour: unknown 'blue'; allowed: red, green$"):
        reg.get("blue")
    with pytest.raises(BenchError, match="'red' is registered twice"):
        reg.register("red", 3)
    assert reg.register("red", 1) == 1  # the same entry again is harmless (a module imported twice)


def _groups_hook(sizes):
    """The plugin's hook: its O-probes are told the feature groups' sizes."""
    return {"groups": tuple(sizes)}


def test_a_plugin_family_gets_its_hook_its_hyperparameters_and_the_warm_start(monkeypatch):
    """A plugin family's entry carries what a built-in's carries: a hook for the constructor
    arguments its O-probes need, its optimiser settings (on the job, not the module) and the
    warm start of its other probes from its O|F-probe."""
    import numpy as np
    import torch

    from bench.core.codes import FeatureSpace
    from evaluators.tasks.binding.jobs import binding_jobs
    from evaluators.tasks.binding.task import BindingTask
    from evaluators.probes.families import BINDING_PROBES, ProbeFamily
    from evaluators.fitting import RowReader, TrainConfig, fit_probes
    from evaluators.tasks.binding.metrics import Priors
    from evaluators.probes.pooled import LinearProbe

    class GroupedProbe(LinearProbe):
        """A linear probe with a per-bit offset that gradient training fits, and what its hook gives."""

        def __init__(self, in_dim, n_bits, cond_dim=0, groups=None):
            super().__init__(in_dim, n_bits, cond_dim)
            self.groups, self.offset = groups, torch.nn.Parameter(torch.zeros(n_bits))

        def readout(self, x, t, cond):
            return super().readout(x, t, cond) + self.offset

    entry = ProbeFamily(GroupedProbe, {"lr": 5e-3, "weight_decay": 0.2, "ema": 0.9},
                        conjunction_args=_groups_hook, warm_starts=True)
    monkeypatch.setitem(BINDING_PROBES._entries, "plug-grouped", entry)
    space = FeatureSpace((("colour", ("red", "blue")), ("shape", ("square", "circle", "star"))))
    rng = np.random.default_rng(0)
    codes = {s: ((rng.random((n, 5)) < 0.5).astype(np.uint8), (rng.random((n, 6)) < 0.3).astype(np.uint8))
             for s, n in (("train", 48), ("val", 16), ("test", 16))}
    task = BindingTask(space, codes, Priors(1.0, 1.0, 1.0), None, None, np.ones(16), None)
    jobs = {j.name: j for j in binding_jobs("plug-grouped", 4, task)}
    assert set(jobs) == {"plug-grouped/F", "plug-grouped/O|F", "plug-grouped/O_paper"}
    assert jobs["plug-grouped/O|F"].model.groups == (2, 3) == jobs["plug-grouped/O_paper"].model.groups
    assert jobs["plug-grouped/F"].model.groups is None  # F-bits are not conjunctions: no hook
    assert {j.warm_start for j in jobs.values()} == {None, "plug-grouped/O|F"}
    assert jobs["plug-grouped/F"].warm_start == "plug-grouped/O|F"
    assert all((j.optim.lr, j.optim.weight_decay, j.optim.ema) == (5e-3, 0.2, 0.9) for j in jobs.values())
    assert not hasattr(jobs["plug-grouped/F"].model, "lr")
    inputs = {s: RowReader(rng.normal(size=(len(codes[s][0]), 4)).astype(np.float32)) for s in codes}
    fits = fit_probes(list(jobs.values()), inputs, TrainConfig(epochs=1, l2_path=(1e-2,), l1_path=()))
    assert all(f.error is None for f in fits.values())
    assert {(f.setting["lr"], f.setting["weight_decay"], f.setting["ema"]) for f in fits.values()} == {(5e-3, 0.2, 0.9)}
