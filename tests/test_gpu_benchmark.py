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


@pytest.mark.parametrize("flag, where", [("--json", "missing/gpu.json"), ("--json", "."), ("--profile", "file")])
def test_an_unwritable_destination_exits_2_before_any_work(tmp_path, flag, where):
    (tmp_path / "file").write_text("in the way\n")
    proc = run("--device", "cpu", flag, str(tmp_path / where), timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and f"{flag}:" in proc.stderr and "generated" not in proc.stderr
    assert (tmp_path / "file").read_text() == "in the way\n"


def test_a_missing_dependency_exits_2_naming_it(tmp_path):
    """Run from a checkout (as on a GPU machine's image), a dependency that is not installed is
    named in one line, not a traceback."""
    (tmp_path / "threadpoolctl.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'threadpoolctl'\", name='threadpoolctl')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True, text=True,
                          env=env, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "'threadpoolctl'" in proc.stderr and "pip install" in proc.stderr


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


def test_sm_sampler_reads_a_running_dmon(tmp_path, monkeypatch):
    """The sampler runs `nvidia-smi dmon` in the background and means the samples whose period lies
    in a window, not those of its first second (here a stand-in nvidia-smi that prints a reading
    every 0.1 s)."""
    gpu = _gpu_module()
    import time

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '# gpu sm mem'\necho '# Idx % %'\n"
                    "while true; do echo '    0 40 1'; sleep 0.1; echo '    0 60 1'; sleep 0.1; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    t0 = time.perf_counter()
    sampler = gpu.SmSampler()
    time.sleep(1.6)
    sampler.stop()
    window = sampler.mean(t0, time.perf_counter())
    assert window["status"] == "done" and window["samples"] >= 3 and 40 <= window["mean_sm_pct"] <= 60
    assert len(sampler.samples) > window["samples"]  # the first second's readings were taken, and left out
    assert sampler.mean(t0, t0 + 0.9)["status"] == "skipped"
    assert sampler.mean(t0 - 10, t0 - 5)["status"] == "skipped"
    gpu_sm = {**window, "fit_device": window, "attention_device": sampler.mean(t0 - 10, t0 - 5)}
    assert gpu.sm_note(gpu_sm).startswith(f"{window['mean_sm_pct']} % mean over {window['samples']} s (fit_device")


def test_the_launch_count_runs_on_the_cpu_and_counts_every_stage():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "launches.py"), "--layers", "11", "--n-train", "60",
                           "--n-eval", "20"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    eager, graphed = proc.stdout.split("replayed from CUDA graphs, by stage:")
    counts = {line.split()[0]: line.split()[1] for line in eager.splitlines()[1:] if line.startswith("  ")}
    for stage in ("linear", "moments", "gradient", "validation", "scoring"):
        assert int(counts[stage].replace(",", "")) > 0, (stage, proc.stdout)
    runs = {line.split()[0]: line.split()[1] for line in graphed.splitlines() if line.startswith("  ")}
    for stage in ("linear", "moments", "gradient"):  # L-BFGS, Gram–Schmidt, stacked steps
        assert int(runs[stage].replace(",", "")) > 0, (stage, proc.stdout)
    assert "2 row sets" in proc.stdout and "CUDA launches from Python, all told" in proc.stdout


def test_timeline_reads_device_busy_time_by_stage():
    """`timeline` on a hand-made trace (µs): kernels overlapping across streams count once, a stage
    label's device-side twin is no kernel, a stage met twice is summed, runtime calls are counted,
    and the device's idle time is read within each host operation and between them."""
    gpu = _gpu_module()
    cpu, dev = False, True

    def ev(name, a, b, device=cpu):
        return name, a, b, device

    p = gpu.STAGE_PREFIX
    events = [ev(p + "linear", 0, 1_000_000), ev(p + "gradient", 1_000_000, 2_000_000),
              ev(p + "gradient", 3_000_000, 4_000_000), ev(p + "linear", 0, 1_000_000, dev),
              ev("gemm", 100_000, 300_000, dev), ev("gemm", 200_000, 400_000, dev),  # two streams: 0.3 s busy
              ev("adam", 1_500_000, 3_500_000, dev),  # half in each gradient window, none between them counted there
              ev("cudaLaunchKernel", 0, 10_000), ev("cudaLaunchKernel", 20_000, 40_000), ev("aten::mm", 0, 50_000),
              ev("aten::item", 500_000, 900_000), ev("cudaStreamSynchronize", 600_000, 700_000)]
    got = gpu.timeline(events)
    assert got["wall_s"] == 4.0 and got["device_busy_s"] == 2.3 and got["busy_pct"] == 57.5
    assert got["stages"]["linear"] == {"wall_s": 1.0, "device_busy_s": 0.3, "busy_pct": 30.0}
    assert got["stages"]["gradient"] == {"wall_s": 2.0, "device_busy_s": 1.0, "busy_pct": 50.0}
    assert got["runtime"] == {"cudaLaunchKernel": {"calls": 2, "host_s": 0.03},
                              "cudaStreamSynchronize": {"calls": 1, "host_s": 0.1}}
    # idle: [0, 0.1], [0.4, 1.5] and [3.5, 4] s; the host ops cover 0.05 + 0.4 s of it
    assert got["idle"] == {"seconds": 1.7, "between_host_ops_s": 1.25,
                           "within_host_op_s": {"aten::item": 0.4, "cudaStreamSynchronize": 0.1, "aten::mm": 0.05,
                                                "cudaLaunchKernel": 0.03}}
    assert list(got["idle"]["within_host_op_s"]) == ["aten::item", "cudaStreamSynchronize", "aten::mm",
                                                     "cudaLaunchKernel"]


def test_profile_reads_a_fresh_process_first_and_warm_fits(tmp_path):
    """`--profile`, last: a spawned process fits the row sets twice under the profiler, each fit's
    stages read apart, the difference first less warm, its files written; the timed fits stay
    unprofiled and both count in the ratio."""
    out, prof = tmp_path / "gpu.json", tmp_path / "prof"
    proc = run("--device", "cpu", "--n-train", "60", "--n-eval", "20", "--image-size", "32", "--input-size", "28",
               "--layers", "12", "--families", "linear", "--budget", "120", "--json", str(out), "--profile", str(prof))
    assert proc.returncode == 0, proc.stderr[-2000:]
    phases = json.loads(out.read_text())["phases"]
    p = phases["profile"]
    assert p["status"] == "done" and p["row_sets"] == 2 and "reason" not in p, p
    for fit in ("first", "warm"):
        assert {"start", "linear", "test"} <= set(p[fit]["stages"]) and p[fit]["stages"]["linear"]["wall_s"] > 0
        assert p[fit]["device_busy_s"] == 0.0  # the CPU path has no device timeline
    d = p["first_less_warm"]
    assert d["wall_s"] == pytest.approx(p["first"]["wall_s"] - p["warm"]["wall_s"], abs=0.002)
    assert d["stages"]["linear"]["wall_s"] == pytest.approx(
        p["first"]["stages"]["linear"]["wall_s"] - p["warm"]["stages"]["linear"]["wall_s"], abs=0.002)
    assert json.loads((prof / "profile.json").read_text())["first_less_warm"] == d
    assert (prof / "fit_trace.json.gz").stat().st_size > 0
    assert all("aten::" in (prof / f"fit_profile_{fit}.txt").read_text() for fit in ("first", "warm"))
    assert {"cpu_over_device", "cpu_over_device_warm"} <= set(phases["ratio"])
    assert "profile of a fresh process's fits" in proc.stdout and "first less warm" in proc.stdout


def test_first_less_warm_names_calls_whose_counts_differ():
    gpu = _gpu_module()
    fit = {"wall_s": 5.0, "device_busy_s": 2.0, "stages": {"linear": {"wall_s": 2.0, "device_busy_s": 1.0}},
           "runtime": {"cudaMalloc": {"calls": 40, "host_s": 0.9}, "cudaLaunchKernel": {"calls": 9, "host_s": 0.5}}}
    warm = {"wall_s": 3.5, "device_busy_s": 2.0, "stages": {"linear": {"wall_s": 1.25, "device_busy_s": 1.0}},
            "runtime": {"cudaLaunchKernel": {"calls": 9, "host_s": 0.1}}}
    assert gpu.first_less_warm(fit, warm) == {
        "wall_s": 1.5, "device_busy_s": 0.0, "stages": {"linear": {"wall_s": 0.75, "device_busy_s": 0.0}},
        "runtime_host_s": {"cudaLaunchKernel": 0.4, "cudaMalloc": {"host_s": 0.9, "calls": "40/0"}}}


def test_a_profiling_process_past_its_share_is_stopped_and_says_so(tmp_path):
    """A share too short for the spawned process to start: it is killed, and the phase says why."""
    gpu = _gpu_module()
    from types import SimpleNamespace

    args = SimpleNamespace(profile=tmp_path / "prof", layers="12", input_size=28, families="linear", device="cpu")
    got = gpu.profile_fresh_process(tmp_path, tmp_path / "cache", args, 1, allowance=0.3)
    assert got == {"status": "stopped", "reason": "the profiling process was stopped at this phase's 0 s"}
    assert gpu.profile_fresh_process(tmp_path, tmp_path / "cache", args, 1, allowance=0) == \
        {"status": "skipped", "reason": "budget spent"}


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
    failed = gpu.fit_side_by_side(acts, None, rows, ["boom"], 2, 30)  # layer 0's fits raise
    assert (failed["status"], set(failed["times"])) == ("partial", {"12/cls", "12/mean"})
    assert failed["errors"] == {"0/cls": "ValueError: boom", "0/mean": "ValueError: boom"}
    assert failed["reason"] == "2 row set(s) failed"


class _Split:
    """A split's activations whose row set reads its layer."""

    def get(self, layer, view):
        return [[float(layer)]]


def _sleepy_fit(arrays, task, families):
    """A row set's fit that takes 1 s, or for layer 0 30 s where the family is "slow" and raises where it is "boom"."""
    if families == ["boom"] and arrays["train"][0][0] == 0:
        raise ValueError("boom")
    time.sleep(30 if families == ["slow"] and arrays["train"][0][0] == 0 else 1.0)
    return 1.0, {f: 0.25 for f in families}


def test_a_crash_keeps_the_phases_measured_before_it(tmp_path, monkeypatch):
    """A device session is short: each phase is in --json as soon as it is measured, and a crash
    adds its error there (and still ends the run with its traceback)."""
    gpu = _gpu_module()
    out = tmp_path / "gpu.json"

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setattr(gpu, "fit_stack", broken)
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--device", "cpu", "--n-train", "60", "--n-eval", "20",
                                      "--image-size", "32", "--input-size", "28", "--layers", "12",
                                      "--json", str(out)])
    with pytest.raises(RuntimeError, match="illegal memory access"):
        gpu.main()
    report = json.loads(out.read_text())
    assert report["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert set(report["phases"]) == {"generate", "extract"}
    assert report["phases"]["extract"]["status"] == "done" and report["config"]["device"] == "cpu"


def test_split_of_reads_stage_times_gc_and_restores_the_label():
    """A fit's wall split without a profiler: each stage's host seconds (a stage met twice is summed),
    the time before the first stage and after the last, the collector's pauses; the fitting's own
    stage label is back in place afterwards, also when the block raises."""
    gpu = _gpu_module()
    import gc

    import evaluators.fitting as fitting

    label = fitting.stage_label
    with gpu.split_of("cpu") as split:
        time.sleep(0.05)
        for pause in (0.1, 0.05):
            with fitting.stage_label("linear"):
                time.sleep(pause)
        with fitting.stage_label("test"):
            gc.collect()
        time.sleep(0.02)
    assert fitting.stage_label is label
    assert list(split["stages_s"]) == ["linear", "test"]
    assert 0.15 <= split["stages_s"]["linear"] < 0.25
    assert 0.05 <= split["before_stages_s"] < 0.1 and 0.02 <= split["after_stages_s"] < 0.07
    assert split["gc_pauses"] >= 1 and 0 < split["gc_s"] <= split["stages_s"]["test"]
    with pytest.raises(KeyError), gpu.split_of("cpu"):
        with fitting.stage_label("start"):
            raise KeyError
    assert fitting.stage_label is label
