"""benchmarks/paper_scale.py: its bad input is one line and exit 2, and at a tiny scale it runs end to
end and its headline is what `bench run` gives on the study file it writes. No test here asserts on
wall time or memory: those are the benchmark's own output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "paper_scale.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import paper_scale  # noqa: E402  (a benchmark script, not a package module)


@pytest.mark.parametrize("scale", ["0", "-0.5", "1.5", "nan", "inf"])
def test_a_scale_outside_zero_to_one_is_one_line_and_exit_2(scale, tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--scale", scale, "--out", str(tmp_path / "w")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--scale must be in (0, 1]" in proc.stderr
    assert not (tmp_path / "w").exists()  # refused before any work


@pytest.mark.parametrize("option, value, says", [("--memory-budget", "1KiB", "cannot read one batch of rows"),
                                                 ("--memory-budget", "lots", "memory budget"),
                                                 ("--dtype", "fp32,bf8", "dtype: unknown 'bf8'")])
def test_a_memory_budget_below_one_batch_or_an_unknown_dtype_is_one_line_and_exit_2(option, value, says, tmp_path,
                                                                                    capsys):
    """Refused before any scene is made: a budget below one training batch of the attention backbone's
    tokens (128 rows of 256 x 384 values at --scale 0.25) would fail its fit only after the extraction."""
    with pytest.raises(SystemExit) as ended:
        paper_scale.main(["--scale", "0.25", option, value, "--out", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert err.strip().count("\n") == 0 and says in err
    assert not (tmp_path / "w").exists()


def test_scale_scales_every_split_of_the_balanced_preset():
    assert paper_scale.scenes_at(1) == {"train": 39_200, "val": 9_800, "test": 9_800}
    assert paper_scale.scenes_at(0.25) == {"train": 9_800, "val": 2_450, "test": 2_450}
    assert paper_scale.scenes_at(0.0001) == {"train": 8, "val": 8, "test": 8}  # every split can be fitted


@pytest.mark.slow
def test_a_tiny_run_gives_what_bench_run_gives_on_its_study(tmp_path, monkeypatch):
    """Every phase runs and reports its time and memory; the headline (β* and the probe's sensitivity
    beside it, per backbone and column) equals what `bench run study.toml` writes into a results folder
    of its own (on the benchmark's activation cache: extraction's bytes are the cache tests' to check)."""
    from bench.api import load_study, run_study

    tiny = ["--scale", "0.0006", "--backbones", "random:dinov2-small", "--layers", "12", "--input-size", "28",
            "--image-size", "112", "--epochs", "2", "--attention-epochs", "2", "--threads", "1", "--device", "cpu"]
    report = paper_scale.main([*tiny, "--out", str(tmp_path / "bench")])
    names = [p["name"] for p in report["phases"]]
    assert report["dtypes"] == paper_scale.default_dtypes(on_cuda=False).split(",")  # bf16 only on a CPU with AMX
    assert names == ["generate", f"extract random:dinov2-small {report['dtypes'][0]} + last:all",
                     "fit pooled", "fit attention"]
    assert all(p["wall_s"] > 0 and p["peak_rss_bytes"] > 0 for p in report["phases"])
    assert report["phases"][-1]["cache_bytes"] > report["phases"][0]["cache_bytes"] == 0
    cells = report["beta_star"]
    assert set(cells) == {f"random-dinov2-small {family} {tokens}" for family in ("linear", "quadratic", "dnn")
                          for tokens in ("cls", "mean")} | {"random-dinov2-small attention all"}

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "bench" / "cache"))
    done = run_study(load_study(tmp_path / "bench" / "study.toml"), tmp_path / "study")
    assert paper_scale.headline(done.results) == cells
