"""benchmarks/gpu.py runs end to end on the CPU at tiny sizes, within its budget, and says what it cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
FIT_PHASES = ("fit_device", "fit_device_again", "attention_device", "power", "fit_cpu", "attention_cpu")


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
    for name in ("fit_device", "fit_device_again", "fit_cpu"):
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
    for line in ("extract random:dinov2-small fp32", "attention on pixels (CPU path)", "cpu / device"):
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


def _gpu_module():
    sys.path.insert(0, str(ROOT))
    import benchmarks.gpu as gpu

    return gpu


def test_row_set_loop_stops_before_a_row_set_that_would_pass_its_share(monkeypatch):
    """Fits of 0.2 s each in a 0.5 s share: two are fitted, the third is not started, and the
    total over all row sets is extrapolated from them and labelled so."""
    gpu = _gpu_module()
    import time

    def fake_fit(acts, task, layer, view, families, device):
        time.sleep(0.2)
        return 0.2, {f: 0.5 for f in families}

    monkeypatch.setattr(gpu, "fit", fake_fit)
    rows = [(layer, view) for layer in (12, 6, 0) for view in ("cls", "mean")]
    out = gpu.fit_row_sets({}, None, rows, ["linear", "dnn"], "cpu", 0.5)
    assert (out["status"], out["row_sets_done"], out["row_sets_total"]) == ("partial", 2, 6)
    assert out["all_row_sets_extrapolated"] and out["all_row_sets_s"] == pytest.approx(6 * 0.2, abs=0.05)
    assert out["beta"] == {"12/cls": {"linear": 0.5, "dnn": 0.5}, "12/mean": {"linear": 0.5, "dnn": 0.5}}
    assert "would pass" in out["reason"]
    done = gpu.fit_row_sets({}, None, rows[:2], ["linear"], "cpu", 5)
    assert done["status"] == "done" and not done["all_row_sets_extrapolated"] and "reason" not in done
    # a fit still running at the end of the share is stopped, not waited for
    monkeypatch.setattr(gpu, "fit", lambda *a: time.sleep(5))
    t0 = time.perf_counter()
    stopped = gpu.fit_attention({}, None, 0, "cpu", 0.3)
    assert time.perf_counter() - t0 < 2 and stopped["status"] == "stopped" and stopped["seconds_at_least"] >= 0.25
    # the ratio of all row sets' times, a partial phase's extrapolated and said so
    ratio = gpu.ratios({"fit_device": {"all_row_sets_s": 1.0, "all_row_sets_extrapolated": False},
                        "fit_cpu": {"all_row_sets_s": 20.0, "all_row_sets_extrapolated": True, "workers": 2,
                                    "row_sets_total": 4, "times": {"12/cls": 10.0, "12/mean": 12.0}},
                        "attention_device": {"status": "done", "seconds": 2.0}, "attention_cpu": stopped})
    assert ratio["cpu_over_device"] == 20.0 and ratio["extrapolated"] is True and "cpu_over_device_warm" not in ratio
    assert ratio["one_core_over_device"] == 44.0  # (10 + 12) s for 2 of 4 row sets
    assert ratio["attention_ratio_is_lower_bound"] is True


def test_the_cpu_path_fits_row_sets_side_by_side_and_stops_at_its_share(monkeypatch):
    """Four row sets of 1 s each on two worker processes: about 2 s of wall, each row set's own
    time and β* kept; where layer 0's row sets would take 30 s, a 3 s share stops them, and the
    whole is extrapolated from the two that finished."""
    gpu = _gpu_module()
    monkeypatch.setattr(gpu, "fit_one_on_cpu", _sleepy_fit)
    acts = {s: _Split() for s in ("train", "val", "test")}
    rows = [(layer, view) for layer in (12, 0) for view in ("cls", "mean")]
    out = gpu.fit_side_by_side(acts, None, rows, ["linear"], 2, 30)
    assert (out["status"], out["row_sets_done"], out["workers"]) == ("done", 4, 2)
    assert 1.9 <= out["seconds"] < 6 and out["all_row_sets_s"] == out["seconds"]
    assert out["times"] == {k: 1.0 for k in ("12/cls", "12/mean", "0/cls", "0/mean")}
    assert out["beta"]["0/mean"] == {"linear": 0.25}
    t0 = time.perf_counter()
    cut = gpu.fit_side_by_side(acts, None, rows, ["slow"], 2, 3)
    assert time.perf_counter() - t0 < 15  # the slow fits are stopped, not waited for
    assert (cut["status"], cut["row_sets_done"]) == ("partial", 2) and set(cut["times"]) == {"12/cls", "12/mean"}
    assert cut["all_row_sets_extrapolated"] and "2 row set(s) still fitting" in cut["reason"]
    assert cut["all_row_sets_s"] == pytest.approx(2 * cut["seconds"], abs=0.011)


class _Split:
    """A split's activations whose row set reads its layer."""

    def get(self, layer, view):
        return [[float(layer)]]


def _sleepy_fit(arrays, task, families):
    """A row set's fit that takes 1 s, or 30 s for layer 0 where the family is "slow"."""
    time.sleep(30 if families == ["slow"] and arrays["train"][0][0] == 0 else 1.0)
    return 1.0, {f: 0.25 for f in families}
