"""Third-party entries through Python entry points (bench/core/registry.py), in a real process.

A throwaway `*.dist-info` with an `entry_points.txt` and a one-file plugin on PYTHONPATH
(no pip, no network; both from the README) registers a backbone source, a binding probe family and a generator;
the new names must reach `bench models`, `bench evaluate --help`, a results row and the
leaderboard, exactly as built-in ones do."""

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

README = ROOT / "README.md"


def readme_block(lang: str) -> str:
    """The README's "Extending BindingBench" code block in `lang`: the test runs what the README shows."""
    section = README.read_text().split("## Extending BindingBench", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("site")
    (site / "bbplugin.py").write_text(readme_block("python"))
    info = site / "bbplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bbplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(readme_block("ini"))
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def bench(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    p = subprocess.run([*BENCH, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout


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
