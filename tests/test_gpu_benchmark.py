"""benchmarks/gpu.py runs end to end on the CPU at tiny sizes, within its budget, and says what it cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
FIT_PHASES = ("fit_device", "attention_device", "power", "fit_cpu", "attention_cpu")


def run(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def test_tiny_cpu_run_reports_every_phase_within_its_budget(tmp_path):
    out = tmp_path / "gpu.json"
    budget = 30
    proc = run("--device", "cpu", "--n-train", "60", "--n-eval", "20", "--image-size", "32", "--input-size", "28",
               "--layers", "0,12", "--budget", str(budget), "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    phases = report["phases"]
    assert set(phases) == {"generate", "extract", "sm_utilisation", "ratio", *FIT_PHASES}
    assert phases["generate"]["seconds"] > 0
    runs = {(r["model"], r["dtype"]): r for r in phases["extract"]["runs"]}
    assert set(runs) == {(m, d) for m in ("random:dinov2-small", "pixels") for d in ("fp32", "bf16")}
    for key, r in runs.items():
        assert r["seconds"] > 0 if r["status"] == "done" else (r["status"] == "skipped" and r["reason"]), key
    assert phases["extract"]["layers"] == [0, 12]
    # no GPU here: the sampler is skipped, and says why
    assert phases["sm_utilisation"] == {"status": "skipped", "reason": "device is cpu"}
    for name in (*FIT_PHASES, "ratio"):
        p = phases[name]
        assert p["status"] in ("done", "partial", "skipped", "stopped"), name
        if p["status"] in ("skipped", "stopped"):
            assert p["reason"], name
        if p["status"] == "stopped":  # what ran before the stop, in seconds
            assert p.get("seconds_at_least", p.get("seconds")) > 0, name
    for name in ("fit_device", "fit_cpu"):
        p = phases[name]
        assert p["row_sets_total"] == 4  # layers 0 and 12, views cls and mean
        if p["status"] in ("done", "partial"):
            assert 0 < p["row_sets_done"] <= 4 and p["per_row_set_s"] > 0
            assert p["all_row_sets_extrapolated"] == (p["status"] == "partial")
            assert all(-1 <= b <= 1 for beta in p["beta"].values() for b in beta.values() if b is not None)
    # the budget holds: fits still running at their share were stopped (a few seconds' slack for
    # the interpreter's start, the alarm's granularity and clean-up)
    assert report["elapsed_s"] <= budget + 10
    assert report["skipped"] == sorted(set(report["skipped"]), key=report["skipped"].index)
    assert "cut for the budget" in proc.stdout or not report["skipped"]
    for line in ("extract random:dinov2-small fp32", "attention on pixels (cpu)", "cpu / device"):
        assert line in proc.stdout


@pytest.mark.parametrize("args", [["--device", "cpu", "--budget", "0"], ["--device", "cpu", "--n-train", "0"]])
def test_bad_sizes_exit_2_in_one_line(args):
    proc = run(*args, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "must be positive" in proc.stderr


def test_dmon_sm_column_is_read_from_its_header():
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu import read_dmon

    text = """# gpu     sm    mem    enc    dec    jpg    ofa
# Idx      %      %      %      %      %      %
    0     87     40      0      0      0      0
    0      -      -      -      -      -      -
    0     12      3      0      0      0      0
"""
    assert list(read_dmon(text.splitlines())) == [87.0, 12.0]
    # an older driver's header with the sm column elsewhere
    assert list(read_dmon(["# gpu pwr sm", "    0  70  55"])) == [55.0]
    assert list(read_dmon(["    0  70  55"])) == []  # no header yet: nothing is guessed
