"""benchmarks/gpu.py runs end to end on the CPU at tiny sizes and says what it cut; its budget logic
(shares, stops, extrapolation) is checked on a fake clock that fake fits advance: no test here asserts
on wall time, which a loaded machine stretches. How fast anything runs is the benchmark's own output."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
FIT_PHASES = ("fit_device", "fit_device_again", "attention_device", "power", "fit_cpu", "attention_cpu")


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The script in a process of its own; `timeout` only guards against a hang (a tiny run's
    fits are bounded by its --budget; start-up, generation and extraction take a minute loaded)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_tiny_cpu_run_reports_every_phase(tmp_path):
    """A smoke run of the whole script: every phase is in the report, each with a status and, where
    it was cut, why (which status a phase reaches depends on the machine's speed: any is allowed;
    that the budget holds is test_the_run_keeps_its_budget_by_its_clock's)."""
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
    assert report["elapsed_s"] > 0
    assert report["skipped"] == sorted(set(report["skipped"]), key=report["skipped"].index)
    assert "cut for the budget" in proc.stdout or not report["skipped"]
    for line in ("extract random:dinov2-small fp32", "attention on pixels (CPU path)", "cpu / device"):
        assert line in proc.stdout


@pytest.mark.parametrize("args", [["--device", "cpu", "--budget", "0"], ["--device", "cpu", "--n-train", "0"]])
def test_bad_sizes_exit_2_in_one_line(args):
    proc = run(*args, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "must be positive" in proc.stderr


@pytest.mark.parametrize("flag, where", [("--json", "missing/gpu.json"), ("--json", "."), ("--profile", "file")])
def test_an_unwritable_destination_exits_2_before_any_work(tmp_path, flag, where):
    (tmp_path / "file").write_text("in the way\n")
    proc = run("--device", "cpu", flag, str(tmp_path / where), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and f"{flag}:" in proc.stderr and "generated" not in proc.stderr
    assert (tmp_path / "file").read_text() == "in the way\n"


def test_a_missing_dependency_exits_2_naming_it(tmp_path):
    """Run from a checkout (as on a GPU machine's image), a dependency that is not installed is
    named in one line, not a traceback."""
    (tmp_path / "scipy").mkdir()  # a package the project needs and a bare image could lack
    (tmp_path / "scipy" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'scipy'\", name='scipy')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "'scipy'" in proc.stderr and "pip install" in proc.stderr


def test_dmon_sm_column_is_read_from_its_header():
    read_dmon = _part("gpu_sampler").read_dmon

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


def _part(name: str = "gpu"):
    """`benchmarks/gpu.py` (the script) or one of its parts (`gpu_budget`, `gpu_fits`, ...), imported."""
    sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


class FakeClock:
    """The benchmark's one clock (`gpu_budget.now`, which every part reads) in a test: it moves only when told, by the seconds a fake
    fit says it took (`advance`, also a fake `sleep`), or by `tick` at each reading."""

    def __init__(self, t: float = 1000.0, tick: float = 0.0) -> None:
        self.t, self.tick = t, tick

    def __call__(self) -> float:
        t, self.t = self.t, self.t + self.tick
        return t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    sleep = advance


def _fake_clock(monkeypatch, **kwargs) -> FakeClock:
    clock = FakeClock(**kwargs)
    monkeypatch.setattr(_part("gpu_budget"), "now", clock)
    return clock


def test_a_fit_running_at_the_end_of_its_share_is_stopped_not_waited_for(monkeypatch):
    """The real alarm (`deadline`) stops a fit that would run for 60 s at its 0.3 s share (the 60 s
    only guard against a broken alarm: the fit then returns and the phase reads "done"); the phase
    says how long it ran by the benchmark's clock, and the ratio with it is a lower bound."""
    fits, report = _part("gpu_fits"), _part("gpu_report")
    clock = _fake_clock(monkeypatch)

    def endless(*args):
        clock.advance(0.3)
        time.sleep(60)
        return 60.0, {"attention": 0.5}

    monkeypatch.setattr(fits, "fit", endless)
    stopped = fits.fit_attention({}, None, 0, "cpu", 0.3)
    assert stopped == {"status": "stopped", "reason": "still training at this phase's 0 s", "seconds_at_least": 0.3}
    # the ratio of all row sets' times, a partial phase's extrapolated and said so
    ratio = report.ratios({"fit_device": {"all_row_sets_s": 1.0, "all_row_sets_extrapolated": False},
                        "fit_cpu": {"all_row_sets_s": 20.0, "all_row_sets_extrapolated": True, "workers": 2,
                                    "row_sets_total": 4, "times": {"12/cls": 10.0, "12/mean": 12.0}},
                        "attention_device": {"status": "done", "seconds": 0.1}, "attention_cpu": stopped})
    assert ratio["cpu_over_device"] == 20.0 and ratio["extrapolated"] is True and "cpu_over_device_warm" not in ratio
    assert ratio["one_core_over_device"] == 44.0  # (10 + 12) s for 2 of 4 row sets
    assert ratio["attention_cpu_over_device"] == 3.0 and ratio["attention_ratio_is_lower_bound"] is True


def test_the_run_keeps_its_budget_by_its_clock(tmp_path, monkeypatch):
    """The whole run on the fake clock, its work faked: extraction takes 15 s a run (so the pixels'
    bf16 run, which would leave the fits under 60 % of the 100 s budget, is skipped), and each
    fitting phase uses its whole share but the first, which uses half. Each phase gets its weight's
    part of the time left (the half left by the first passes on), and the run ends at its budget."""
    gpu = _part()
    clock = _fake_clock(monkeypatch)
    given: list[tuple[str, float]] = []

    def extract(spec, ds, layers, token_choices, device, dtype, cache, input_size=None):
        clock.advance(15)
        return {s: SimpleNamespace(layers=[0, 12]) for s in ("train", "val", "test")}, 15.0

    def phase(name):
        def fake(*args):
            allowance = args[-1]
            used = allowance / 2 if not given else allowance
            given.append((name, round(allowance, 6)))
            clock.advance(used)
            return {"status": "stopped", "reason": "fake", "seconds_at_least": round(used, 2)}
        return fake

    for name in ("fit_stack", "fit_attention", "power", "fit_side_by_side"):
        monkeypatch.setattr(gpu, name, phase(name))
    monkeypatch.setattr(gpu, "extract", extract)
    monkeypatch.setattr(gpu, "make_dataset", lambda *args: None)
    monkeypatch.setattr(gpu, "binding_task", lambda ds: None)
    monkeypatch.setattr(gpu, "resolve_backbone", lambda spec: spec)
    monkeypatch.setattr(gpu.torch, "set_num_threads", lambda n: None)  # this process's threads stay as they are
    out = tmp_path / "gpu.json"
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--device", "cpu", "--budget", "100", "--json", str(out)])
    gpu.main()
    report = json.loads(out.read_text())
    assert [(r["model"], r["dtype"], r["status"]) for r in report["phases"]["extract"]["runs"]] == [
        (gpu.MODEL, "fp32", "done"), (gpu.MODEL, "bf16", "done"), (gpu.PIXELS, "fp32", "done"),
        (gpu.PIXELS, "bf16", "skipped")]
    weights = [0.35, 0.15, 0.2, 0.15, 0.2, 0.1]  # gpu_budget.SHARES, in the run's order
    left, want = 100 - 45, []
    for i, w in enumerate(weights):
        want.append(round(left * w / sum(weights[i:]), 6))
        left -= want[-1] / 2 if i == 0 else want[-1]
    assert [a for _, a in given] == pytest.approx(want)
    assert [n for n, _ in given] == ["fit_stack", "fit_stack", "fit_attention", "power", "fit_side_by_side",
                                     "fit_attention"]
    assert report["elapsed_s"] == 100.0


def test_sm_sampler_reads_a_running_dmon(tmp_path, monkeypatch):
    """The sampler reads `nvidia-smi dmon` while it runs (here a stand-in nvidia-smi that prints six
    readings and waits to be stopped), stamps each reading with the benchmark's clock (a fake one
    that moves 0.5 s at each reading), and means the readings whose period lies in a window, not
    those of its first second."""
    _fake_clock(monkeypatch, t=100.0, tick=0.5)
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '# gpu sm mem'\necho '# Idx % %'\n"
                    "for i in 1 2 3; do echo '    0 40 1'; echo '    0 60 1'; done\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = _part("gpu_sampler").SmSampler()
    limit = time.monotonic() + 60  # a hang guard: the six lines are read in milliseconds
    while len(sampler.samples) < 6:
        assert time.monotonic() < limit and sampler.proc.poll() is None, sampler.samples
        time.sleep(0.01)
    sampler.stop()
    assert sampler.proc.returncode is not None and not sampler.thread.is_alive()  # dmon stopped, its reader ended
    assert sampler.samples == [(100 + 0.5 * i, 40.0 if i % 2 == 0 else 60.0) for i in range(6)]
    window = sampler.mean(100, 102.5)  # the readings stamped 101 to 102.5
    assert window == {"status": "done", "mean_sm_pct": 50.0, "samples": 4}
    assert sampler.mean(100, 101.4)["samples"] == 1
    assert sampler.mean(100, 100.9)["status"] == "skipped"
    assert sampler.mean(90, 95)["status"] == "skipped"
    gpu_sm = {**window, "fit_device": window, "attention_device": sampler.mean(90, 95)}
    assert _part("gpu_report").sm_note(gpu_sm) == "50.0 % mean over 4 s (fit_device 50.0 %)"


@pytest.mark.slow
def test_the_launch_count_runs_on_the_cpu_and_counts_every_stage():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "launches.py"), "--layers", "11", "--n-train", "60",
                           "--n-eval", "20"], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
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
    timeline = _part("gpu_timeline")
    cpu, dev = False, True

    def ev(name, a, b, device=cpu):
        return name, a, b, device

    p = timeline.STAGE_PREFIX
    events = [ev(p + "linear", 0, 1_000_000), ev(p + "gradient", 1_000_000, 2_000_000),
              ev(p + "gradient", 3_000_000, 4_000_000), ev(p + "linear", 0, 1_000_000, dev),
              ev("gemm", 100_000, 300_000, dev), ev("gemm", 200_000, 400_000, dev),  # two streams: 0.3 s busy
              ev("adam", 1_500_000, 3_500_000, dev),  # half in each gradient window, none between them counted there
              ev("cudaLaunchKernel", 0, 10_000), ev("cudaLaunchKernel", 20_000, 40_000), ev("aten::mm", 0, 50_000),
              ev("aten::item", 500_000, 900_000), ev("cudaStreamSynchronize", 600_000, 700_000)]
    got = timeline.timeline(events)
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


@pytest.mark.slow
def test_profile_reads_a_fresh_process_first_and_warm_fits(tmp_path):
    """`--profile`, last: a spawned process fits the row sets twice under the profiler, each fit's
    stages read apart, the difference first less warm, its files written; the timed fits stay
    unprofiled and both count in the ratio. The budget only bounds a hang: the profile, last, gets
    what the tiny run leaves of it (a minute and a half loaded, of 900 s)."""
    out, prof = tmp_path / "gpu.json", tmp_path / "prof"
    proc = run("--device", "cpu", "--n-train", "60", "--n-eval", "20", "--image-size", "32", "--input-size", "28",
               "--layers", "12", "--families", "linear", "--budget", "900", "--json", str(out), "--profile", str(prof),
               timeout=1200)
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
    fit = {"wall_s": 5.0, "device_busy_s": 2.0, "stages": {"linear": {"wall_s": 2.0, "device_busy_s": 1.0}},
           "runtime": {"cudaMalloc": {"calls": 40, "host_s": 0.9}, "cudaLaunchKernel": {"calls": 9, "host_s": 0.5}}}
    warm = {"wall_s": 3.5, "device_busy_s": 2.0, "stages": {"linear": {"wall_s": 1.25, "device_busy_s": 1.0}},
            "runtime": {"cudaLaunchKernel": {"calls": 9, "host_s": 0.1}}}
    assert _part("gpu_timeline").first_less_warm(fit, warm) == {
        "wall_s": 1.5, "device_busy_s": 0.0, "stages": {"linear": {"wall_s": 0.75, "device_busy_s": 0.0}},
        "runtime_host_s": {"cudaLaunchKernel": 0.4, "cudaMalloc": {"host_s": 0.9, "calls": "40/0"}}}


def test_a_profiling_process_past_its_share_is_stopped_and_says_so(tmp_path, monkeypatch):
    """A profiling process still running at the end of its share (one that would run for 600 s) is
    killed, and the phase says why."""
    profile = _part("gpu_profile")
    monkeypatch.setattr(profile, "profile_fits", _endless)  # the spawned process's target
    args = SimpleNamespace(profile=tmp_path / "prof", layers="12", input_size=28, families="linear", device="cpu")
    got = profile.profile_fresh_process(tmp_path, tmp_path / "cache", args, 1, allowance=0.3)
    assert got == {"status": "stopped", "reason": "the profiling process was stopped at this phase's 0 s"}
    assert profile.profile_fresh_process(tmp_path, tmp_path / "cache", args, 1, allowance=0) == \
        {"status": "skipped", "reason": "budget spent"}


@pytest.mark.slow
def test_the_cpu_path_fits_row_sets_in_worker_processes(monkeypatch):
    """Four row sets on two spawned worker processes: each row set's own time and β* come back from
    its worker; a row set whose fit raises is said and the others kept; fits still running at the
    end of the share (here every one: the fake fit would run for 600 s) are stopped, not waited for,
    and the phase says how long it waited. (The 600 s share of the first two only guards a hang.)"""
    pool = _part("gpu_pool")
    monkeypatch.setattr(pool, "fit_one_on_cpu", _worker_fit)
    acts = {s: _Split() for s in ("train", "val", "test")}
    rows = [(layer, tokens) for layer in (12, 0) for tokens in ("cls", "mean")]
    out = pool.fit_side_by_side(acts, None, rows, ["linear"], 2, 600)
    assert (out["status"], out["row_sets_done"], out["workers"]) == ("done", 4, 2) and "reason" not in out
    assert out["times"] == {k: 1.0 for k in ("12/cls", "12/mean", "0/cls", "0/mean")}
    assert out["beta"]["0/mean"] == {"linear": 0.25} and out["all_row_sets_s"] == out["seconds"]
    failed = pool.fit_side_by_side(acts, None, rows, ["boom"], 2, 600)  # layer 0's fits raise
    assert (failed["status"], set(failed["times"])) == ("partial", {"12/cls", "12/mean"})
    assert failed["errors"] == {"0/cls": "ValueError: boom", "0/mean": "ValueError: boom"}
    assert failed["reason"] == "2 row set(s) failed"
    stopped = pool.fit_side_by_side(acts, None, rows, ["endless"], 2, 1)
    assert stopped["status"] == "stopped" and stopped["reason"] == "4 row set(s) still fitting at this phase's 1 s"
    assert stopped["seconds_at_least"] >= 1.0 and stopped["row_sets_total"] == 4


def test_the_cpu_path_times_the_wall_of_row_sets_side_by_side_and_stops_at_its_share(monkeypatch):
    """On a fake pool and the fake clock (two workers take the row sets in order; a fit takes the
    seconds it says; the poll's sleep moves the clock): four fits of 1 s take 2 s of wall; where
    layer 0's would take 30 s, a 3 s share stops them, and the whole is extrapolated from the two
    that finished, their own times kept."""
    pool = _part("gpu_pool")
    clock = _fake_clock(monkeypatch)
    pools: list[_FakePool] = []
    monkeypatch.setattr(pool, "multiprocessing", SimpleNamespace(get_context=lambda method: _FakeContext(clock, pools)))
    monkeypatch.setattr(pool, "time", SimpleNamespace(sleep=clock.sleep))
    monkeypatch.setattr(pool, "fit_one_on_cpu", _worker_fit)
    acts = {s: _Split() for s in ("train", "val", "test")}
    rows = [(layer, tokens) for layer in (12, 0) for tokens in ("cls", "mean")]
    out = pool.fit_side_by_side(acts, None, rows, ["linear"], 2, 30)
    assert (out["status"], out["row_sets_done"], out["workers"]) == ("done", 4, 2)
    assert out["seconds"] == pytest.approx(2.0, abs=0.05)  # the last fit's end, to two polls of 0.02 s
    assert out["times"] == {k: 1.0 for k in ("12/cls", "12/mean", "0/cls", "0/mean")}
    assert pools[-1].terminated
    cut = pool.fit_side_by_side(acts, None, rows, ["slow"], 2, 3)
    assert (cut["status"], cut["row_sets_done"]) == ("partial", 2) and cut["times"] == {"12/cls": 1.0, "12/mean": 1.0}
    assert cut["seconds"] == pytest.approx(3.0, abs=0.05) and pools[-1].terminated  # stopped at the share
    assert cut["all_row_sets_extrapolated"] and cut["reason"] == "2 row set(s) still fitting at this phase's 3 s"
    assert cut["all_row_sets_s"] == pytest.approx(2 * cut["seconds"], abs=0.011)


class _Split:
    """A split's activations whose row set reads its layer."""

    def get(self, layer, tokens):
        return [[float(layer)]]


def _worker_fit(arrays, task, families):
    """A row set's fit (`fit_one_on_cpu`): it says it took 1 s, or for layer 0 30 s where the family
    is "slow"; it raises where the family is "boom", and runs for 600 s where it is "endless"."""
    if families == ["endless"]:
        time.sleep(600)
    if families == ["boom"] and arrays["train"][0][0] == 0:
        raise ValueError("boom")
    return 30.0 if families == ["slow"] and arrays["train"][0][0] == 0 else 1.0, {f: 0.25 for f in families}


def _endless(*args):
    """A profiling process that would run for 600 s."""
    time.sleep(600)


class _FakeContext:
    """`multiprocessing.get_context("spawn")` as `fit_side_by_side` uses it, on the fake clock."""

    def __init__(self, clock: FakeClock, pools: list) -> None:
        self.clock, self.pools = clock, pools

    def Barrier(self, parties):  # noqa: N802 — multiprocessing's name
        return SimpleNamespace(wait=lambda timeout=None: 0)

    def Pool(self, workers, initializer=None, initargs=()):  # noqa: N802
        self.pools.append(_FakePool(self.clock, workers))
        return self.pools[-1]


class _FakePool:
    """Workers that take tasks in order, each as soon as one is free; a task runs at once, here, and
    its result is ready once the clock reaches the end of the seconds it says it took."""

    def __init__(self, clock: FakeClock, workers: int) -> None:
        self.clock, self.free_at, self.terminated = clock, [clock()] * workers, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.terminate()

    def apply_async(self, fn, args):
        worker = self.free_at.index(min(self.free_at))
        try:
            value = fn(*args)
            seconds = value[0]
        except Exception as e:  # noqa: BLE001 — handed back by get(), as a pool does
            value, seconds = e, 0.0
        self.free_at[worker] += seconds
        return SimpleNamespace(ready=lambda end=self.free_at[worker]: self.clock.t >= end, get=lambda v=value: _got(v))

    def terminate(self) -> None:
        self.terminated = True


def _got(value):
    if isinstance(value, Exception):
        raise value
    return value


@pytest.mark.slow
def test_a_crash_keeps_the_phases_measured_before_it(tmp_path, monkeypatch):
    """A device session is short: each phase is in --json as soon as it is measured, and a crash
    adds its error there (and still ends the run with its traceback)."""
    gpu = _part()
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


def test_split_of_reads_stage_times_gc_and_restores_the_label(monkeypatch):
    """A fit's wall split without a profiler, on the fake clock: each stage's host seconds (a stage
    met twice is summed), the time before the first stage and after the last, the collector's pauses
    (the collector is made to take 0.01 s; automatic collections are off, so the one below is the
    only pause); the fitting's own stage label is back in place afterwards, also when the block raises."""
    fits = _part("gpu_fits")
    import gc

    import evaluators.fitting as fitting

    clock = _fake_clock(monkeypatch)

    def collector_runs(phase, info):  # called before split_of's own callback, at start and at stop
        clock.advance(0.005)

    label, enabled = fitting.stage_label, gc.isenabled()
    gc.disable()
    gc.callbacks.insert(0, collector_runs)
    try:
        with fits.split_of("cpu") as split:
            clock.advance(0.05)
            for pause in (0.1, 0.05):
                with fitting.stage_label("linear"):
                    clock.advance(pause)
            with fitting.stage_label("test"):
                gc.collect()
            clock.advance(0.02)
    finally:
        gc.callbacks.remove(collector_runs)
        if enabled:
            gc.enable()
    assert fitting.stage_label is label
    assert split == {"stages_s": {"linear": 0.15, "test": 0.01}, "before_stages_s": 0.05, "after_stages_s": 0.02,
                     "gc_s": 0.005, "gc_pauses": 1}
    with pytest.raises(KeyError), fits.split_of("cpu"):
        with fitting.stage_label("start"):
            raise KeyError
    assert fitting.stage_label is label
