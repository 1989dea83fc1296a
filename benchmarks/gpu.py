"""What a GPU buys: extraction and every probe family's fit of a backbone, on the device and on the CPU.

One command for a CUDA machine (issue 37's benchmark):

    PYTHONPATH=. python benchmarks/gpu.py [--budget 360] [--json gpu.json]

generates the colorshape small preset (128 px, 2,000/500/500 scenes, seed 0), then

1. times extraction of `random:dinov2-small` (all 13 hidden states, views cls and mean) and of
   `pixels` (view all), in fp32 and in bf16;
2. times the fit of linear, quadratic, dnn over every (layer, view) row set of
   `random:dinov2-small` (stacked, as `bench evaluate` fits a backbone) and of attention on
   `pixels` (tokens all) on the device, sampling SM utilisation every second with
   `nvidia-smi dmon` meanwhile; the stacked fit runs twice, the process's first fit (what a user's
   first `bench evaluate` meets: CUDA's libraries, kernels and the caching allocator's memory are
   set up on first use) and again, warm (what each later fit of a process meets), each fit's wall
   split by fit stage in this process (`split_of`: no profiler);
3. fits the oracles (objects, features, mix-0.5; cls) on the device, so that the GPU's power is
   read beside its speed (with pixels under attention from step 2);
4. fits the same row sets and attention on the CPU path for the device/CPU ratio: a probe fit
   on a CPU runs on one torch thread (the same numbers on any thread count), so the row sets are
   fitted side by side, a process a core (as `--executor ray` fits them), and attention (one row
   set) on one;
5. with `--profile DIR`, last: a fresh process (spawned; CUDA started and the activations read back
   from the run's cache before anything is timed) fits the same row sets twice under
   `torch.profiler`, its first fit and then warm, so that what a process's first fit spends beyond a
   warm one is read apart in one run: for each fit, each fit stage's wall time beside the time the
   GPU was busy in it (the union of its kernels' intervals), the GPU's idle time split by what the
   host did meanwhile (within which operations, or in Python between them), the CUDA runtime calls'
   counts and times (launches, graph launches, waits for the device, allocations), and the
   difference, first less warm, by stage and by runtime call; the host operations that took most
   time (DIR/fit_profile_first.txt, DIR/fit_profile_warm.txt) and the first fit's whole trace
   (DIR/fit_trace.json.gz, for Perfetto or chrome://tracing). Its summary is written
   (DIR/profile.json) before its trace and tables, which are the slowest part. The profiled fits
   are not the benchmark's timed ones: steps 2-4 run as without `--profile`, on a smaller share of
   the budget.

Everything stops within `--budget` seconds: each fitting phase gets a share of the time left
(unused time passes on), a row-set loop stops before a row set that would not fit, and a fit
still running at the end of its share is stopped (`OutOfBudget`). What was cut is said: a phase
is `done`, `partial` (row sets done of the total, the total extrapolated and labelled so) or
`skipped`/`stopped` with its reason. `--device cpu` and the size options run it end to end on
any machine (tests/test_gpu_benchmark.py does, at tiny sizes). The project need not be installed:
the checkout's root goes on sys.path, and nothing here imports the 3D renderer.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# After PYTHONPATH's entries, so that `PYTHONPATH=OTHER_CHECKOUT` times that checkout's probes.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:
    from bench.core.dataset import Dataset, write_text_atomic  # noqa: E402
    from bench.core.errors import BenchError  # noqa: E402
    from bench.core.paths import check_output_dir, check_output_file  # noqa: E402
    from evaluators.backbones import Backbone, resolve_backbone  # noqa: E402
    from evaluators.extract import extract_activations  # noqa: E402
    from evaluators.training import RowReader, TrainConfig  # noqa: E402
    from generators.base import build_config, get_generator  # noqa: E402
    from generators.engine import generate  # noqa: E402
except ModuleNotFoundError as missing:  # run from a checkout, where not all the project's dependencies are installed
    print(f"gpu.py: the project needs the module {missing.name!r}, which is not installed here "
          f"(pip install {missing.name}, or pip install -e . for all its dependencies)", file=sys.stderr)
    sys.exit(2)

try:  # the evaluator's layout moved (evaluators/binding); the entry points kept their names
    from evaluators.binding import binding_task, evaluate_binding  # noqa: E402
except ImportError:
    from evaluators.run import binding_task, evaluate_binding  # noqa: E402
try:  # a fit's stages labelled in profiler traces
    import evaluators.fitting as fitting  # noqa: E402
    from evaluators.fitting import STAGE_PREFIX  # noqa: E402
except ImportError:
    STAGE_PREFIX = None
try:  # row sets fitted as one batched problem (issue 37)
    from evaluators.binding import evaluate_binding_sets  # noqa: E402
except ImportError:
    evaluate_binding_sets = None

SPLITS = ("train", "val", "test")
MODEL, PIXELS = "random:dinov2-small", "pixels"
ORACLES = ("oracle:objects", "oracle:features", "oracle:mix-0.5")
#: Weights of the fitting phases in the time left after extraction; a phase gets
#: left × its weight / the weights of the phases still to run, so time one leaves passes on.
SHARES = {"fit_device": 0.35, "fit_device_again": 0.15, "attention_device": 0.2, "power": 0.15, "fit_cpu": 0.2,
          "attention_cpu": 0.1, "profile": 0.35}
#: bf16 extraction is skipped when, by the fp32 time, it would leave less than this part of
#: the budget to the fits.
FIT_RESERVE = 0.6


#: The benchmark's one clock: every time it reports and every budget decision (a phase's share, the
#: next row set, a stop) reads it. Tests put a fake clock here, advanced by fake fits, to check that
#: logic without waiting on real time. (`deadline`'s alarm is the kernel's real timer.)
now = time.perf_counter


class OutOfBudget(BaseException):
    """A fit ran past its phase's share. A BaseException: the evaluator turns an Exception
    inside a fit into an error row and goes on, and this must end the phase instead."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise OutOfBudget in the main thread once `seconds` have passed."""
    def _alarm(signum, frame):
        raise OutOfBudget

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Clock:
    """The run's budget: what is left, and each fitting phase's share of it."""

    def __init__(self, budget: float, phases: Iterable[str] = SHARES) -> None:
        self.budget, self.t0 = budget, now()
        self.pending = {phase: SHARES[phase] for phase in phases}

    def elapsed(self) -> float:
        return now() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    def share(self, phase: str) -> float:
        weight = self.pending.pop(phase)
        return self.left() * weight / (weight + sum(self.pending.values()))


def read_dmon(lines: Iterable[str]) -> Iterator[float]:
    """The 'sm' column (%) of `nvidia-smi dmon -s u` output, one value per data line; the
    column is found in the header line ('# gpu sm mem ...'), and '-' (no reading) is skipped."""
    column = None
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "#":
            if "sm" in fields[1:]:
                column = fields[1:].index("sm")
            continue
        if column is not None and column < len(fields):
            try:
                yield float(fields[column])
            except ValueError:
                continue


#: `nvidia-smi dmon`'s sampling period (s): a reading is the share of the period before it in
#: which a kernel ran.
DMON_PERIOD_S = 1


class SmSampler:
    """`nvidia-smi dmon -s u -d 1` in the background: SM utilisation with the time it was read."""

    def __init__(self) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        self.samples: list[tuple[float, float]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", str(DMON_PERIOD_S),
                                      "-i", visible if visible.isdigit() else "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for value in read_dmon(self.proc.stdout):
            self.samples.append((now(), value))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.thread.join(timeout=5)

    def mean(self, start: float, stop: float) -> dict:
        """The mean of the readings whose period lies in [start, stop]: a reading taken in the window's
        first second describes mostly what ran before it (the phase before, or the gap between)."""
        values = [v for t, v in self.samples if start + DMON_PERIOD_S <= t <= stop]
        if not values:
            return {"status": "skipped", "reason": f"no whole {DMON_PERIOD_S} s reading in the window"}
        return {"status": "done", "mean_sm_pct": round(sum(values) / len(values), 1), "samples": len(values)}


def make_dataset(root: Path, n_train: int, n_eval: int, image_size: int, seed: int) -> Dataset:
    """The small preset at `image_size` px; below 128 px its objects and margins shrink with the
    image (16 and 4 px at 128), so that its 18 objects still fit a tiny test image."""
    gen = get_generator("colorshape")
    shrink = {"object_size": max(2, 16 * image_size // 128), "margin": max(1, 4 * image_size // 128)} \
        if image_size < 128 else {}
    cfg = build_config(gen, "small", {"n_train": n_train, "n_val": n_eval, "n_test": n_eval,
                                      "image_size": image_size, "seed": seed, **shrink})
    generate(gen, cfg, root / "small", workers=os.cpu_count() or 1)
    return Dataset(root / "small")


def extract(spec: str | Backbone, ds: Dataset, layers: str, views: list[str], device: str, dtype: str, cache: Path,
            input_size: int | None = None) -> tuple[dict, float]:
    """Every split's activations and the seconds they took (a fresh cache: nothing is read back).
    A resolved `spec` is built once, outside the time, not once per split."""
    t0 = now()
    acts = {s: extract_activations(spec, ds, s, layers=layers, views=views, device=device, dtype=dtype,
                                   image_size=input_size, cache_dir=cache, progress=False) for s in SPLITS}
    if device == "cuda":
        torch.cuda.synchronize()
    return acts, now() - t0


def fit(acts: dict, task, layer: int, view: str, families: list[str], device: str) -> tuple[float, dict]:
    """(wall s, β* per family) of one row set, at the evaluator's default settings on `device`."""
    return fit_inputs({s: RowReader(a.get(layer, view)) for s, a in acts.items()}, task, families, device)


def fit_inputs(inputs: dict, task, families: list[str], device: str) -> tuple[float, dict]:
    """`fit` of a row set's readers."""
    t0 = now()
    res = evaluate_binding(inputs, task, families, train=TrainConfig(device=device), n_boot=200)
    if device == "cuda":
        torch.cuda.synchronize()
    return now() - t0, {f: _num(r.metrics.get("beta_star")) for f, r in res.items()}


def _num(x) -> float | None:
    return None if x is None or x != x else round(float(x), 4)


def fit_row_sets(acts: dict, task, row_sets: list[tuple[int, str]], families: list[str], device: str,
                 allowance: float) -> dict:
    """Fit row sets in order while the next one (at the mean so far) fits in `allowance` s."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent", "row_sets_total": len(row_sets)}
    out: dict = {"row_sets_total": len(row_sets), "row_sets_done": 0, "seconds": 0.0, "times": {}, "beta": {}}
    start = now()
    for layer, view in row_sets:
        spent = now() - start
        done = out["row_sets_done"]
        if done and spent + spent / done > allowance:
            out["reason"] = f"the next row set would pass this phase's {allowance:.0f} s"
            break
        try:
            with deadline(allowance - spent):
                wall, beta = fit(acts, task, layer, view, families, device)
        except OutOfBudget:
            out["reason"] = f"row set {layer}/{view} stopped at this phase's {allowance:.0f} s"
            break
        key = f"{layer}/{view}"
        out["times"][key], out["beta"][key] = round(wall, 2), beta
        out["row_sets_done"] += 1
        out["seconds"] = round(out["seconds"] + wall, 2)
    done = out["row_sets_done"]
    if not done:
        return {"status": "skipped", "reason": out.get("reason", "no row set"), "row_sets_total": len(row_sets)}
    out["per_row_set_s"] = round(out["seconds"] / done, 2)
    out["all_row_sets_s"] = round(out["per_row_set_s"] * len(row_sets), 2)
    out["status"] = "done" if done == len(row_sets) else "partial"
    out["all_row_sets_extrapolated"] = done < len(row_sets)
    return out


def fit_side_by_side(acts: dict, task, row_sets: list[tuple[int, str]], families: list[str], workers: int,
                     allowance: float) -> dict:
    """The CPU path on every core: a fit on a CPU runs on one torch thread (version 14: the same
    numbers on any thread count), so the cores fit row sets side by side, one a process (`workers`
    spawned, started before the clock, as `--executor ray` fits them on one-thread tasks). The
    phase's time is the wall until the last row set is fitted (each row set's own time is in
    `times`); those not finished at `allowance` s are stopped, and the whole is extrapolated from
    the rate so far."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent", "row_sets_total": len(row_sets)}
    out: dict = {"row_sets_total": len(row_sets), "row_sets_done": 0, "workers": workers, "times": {}, "beta": {}}
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Barrier(workers + 1)
    with ctx.Pool(workers, initializer=_started, initargs=(started,)) as pool:
        try:  # every worker started and its imports done, outside the time
            started.wait(timeout=max(allowance, 60))
        except threading.BrokenBarrierError:
            return {"status": "skipped", "reason": f"the {workers} worker processes did not start",
                    "row_sets_total": len(row_sets)}
        t0 = now()
        pending = {f"{layer}/{view}": pool.apply_async(fit_one_on_cpu, (
            {s: np.asarray(a.get(layer, view)) for s, a in acts.items()}, task, families)) for layer, view in row_sets}
        while pending and now() - t0 < allowance:
            for key in [k for k, r in pending.items() if r.ready()]:
                try:
                    seconds, out["beta"][key] = pending.pop(key).get()
                    out["times"][key] = round(seconds, 2)
                except Exception as e:  # noqa: BLE001 — a row set that fails is said, the others go on
                    out.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}".splitlines()[0]
            time.sleep(0.02)
        wall = now() - t0
        pool.terminate()
    done = out["row_sets_done"] = len(out["times"])
    if pending or out.get("errors"):
        out["reason"] = "; ".join(filter(None, (
            f"{len(pending)} row set(s) still fitting at this phase's {allowance:.0f} s" if pending else "",
            f"{len(out['errors'])} row set(s) failed" if out.get("errors") else "")))
    if not done:
        return {"status": "stopped", "reason": out["reason"], "seconds_at_least": round(wall, 2),
                "row_sets_total": len(row_sets)}
    out.update(status="done" if done == len(row_sets) else "partial", seconds=round(wall, 2),
               per_row_set_s=round(wall / done, 3), all_row_sets_s=round(wall * len(row_sets) / done, 2),
               all_row_sets_extrapolated=done < len(row_sets))
    return out


def _started(barrier: threading.Barrier) -> None:
    """A worker of `fit_side_by_side`, its imports done: say so (once every worker has, the clock starts)."""
    try:
        barrier.wait()
    except threading.BrokenBarrierError:  # the parent gave up waiting: a worker started later just works
        pass


def fit_one_on_cpu(arrays: dict, task, families: list[str]) -> tuple[float, dict]:
    """A worker of `fit_side_by_side`: one row set's (wall s, β* per family) on the CPU."""
    return fit_inputs({s: RowReader(a) for s, a in arrays.items()}, task, families, "cpu")


#: The CUDA caching allocator's counters a fit's `split_of` reads the change of: device allocations
#: (`cudaMalloc`) and frees, retries after a failed allocation (each frees the cache and waits for the
#: device), and waits on every stream.
ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


@contextmanager
def split_of(device: str) -> Iterator[dict]:
    """Where a fit's wall time went, without a profiler (a profiled process's first fit was only
    0.3 s slower than its warm one, where this run's first was 1.3-1.6 s slower: what differs is
    the process the fit runs in, so it is read in this one): host seconds in each fit stage (the
    `stage_label`s; no wait for the device at their edges, so a stage's queued work may finish in
    the next), before the first stage (building and copying the probes) and after the last (the
    metrics); the garbage collector's pauses; and on CUDA the allocator's counters that grew
    (`ALLOCATOR_COUNTS`). The dict yielded is filled when the block ends."""
    got: dict = {}
    if STAGE_PREFIX is None:
        yield got
        return
    stages: dict[str, float] = {}
    edges: list[float] = []
    label = fitting.stage_label

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        t0 = now()
        with label(name):
            yield
        edges.extend((t0, now()))
        stages[name] = stages.get(name, 0.0) + edges[-1] - t0

    pauses: list[float] = []

    def collector(phase: str, info: dict) -> None:
        if phase == "start":
            pauses.append(-now())
        elif pauses:
            pauses[-1] += now()

    counts = torch.cuda.memory_stats if device == "cuda" else dict
    before = counts()
    fitting.stage_label = timed
    gc.callbacks.append(collector)
    start = now()
    try:
        yield got
    finally:
        stop = now()
        gc.callbacks.remove(collector)
        fitting.stage_label = label
    after = counts()
    got["stages_s"] = {k: round(v, 3) for k, v in stages.items()}
    if edges:
        got["before_stages_s"], got["after_stages_s"] = round(min(edges) - start, 3), round(stop - max(edges), 3)
    got["gc_s"], got["gc_pauses"] = round(sum(t for t in pauses if t > 0), 3), len(pauses)
    got.update({k: after.get(k, 0) - before.get(k, 0) for k in ALLOCATOR_COUNTS if k in after})


def fit_stack(acts: dict, task, row_sets: list[tuple[int, str]], families: list[str], device: str,
              allowance: float) -> dict:
    """Every row set fitted as one batched problem (`evaluate_binding_sets`, as `bench evaluate`
    fits a backbone), stopped at `allowance` s; each row set's time is its share of the whole."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent", "row_sets_total": len(row_sets)}
    if evaluate_binding_sets is None:  # a checkout from before stacking: one row set at a time
        return fit_row_sets(acts, task, row_sets, families, device, allowance)
    inputs = [{s: RowReader(a.get(layer, view)) for s, a in acts.items()} for layer, view in row_sets]
    t0 = now()
    try:
        with deadline(allowance), split_of(device) as split:
            results = evaluate_binding_sets(inputs, task, families, train=TrainConfig(device=device), n_boot=200)
            if device == "cuda":
                torch.cuda.synchronize()
    except OutOfBudget:
        return {"status": "stopped", "reason": f"the stack was still fitting at this phase's {allowance:.0f} s",
                "seconds_at_least": round(now() - t0, 2), "row_sets_total": len(row_sets)}
    wall = now() - t0
    keys = [f"{layer}/{view}" for layer, view in row_sets]
    share = round(wall / len(row_sets), 3)
    return {"status": "done", "row_sets_total": len(row_sets), "row_sets_done": len(row_sets),
            "seconds": round(wall, 2), "per_row_set_s": share, "all_row_sets_s": round(wall, 2),
            "all_row_sets_extrapolated": False, "stacked": True, "split": split, "times": {k: share for k in keys},
            "beta": {k: {f: _num(r.metrics.get("beta_star")) for f, r in res.items()}
                     for k, res in zip(keys, results)}}


def fit_attention(acts: dict, task, layer: int, device: str, allowance: float) -> dict:
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent"}
    t0 = now()
    try:
        with deadline(allowance):
            wall, beta = fit(acts, task, layer, "all", ["attention"], device)
    except OutOfBudget:
        return {"status": "stopped", "reason": f"still training at this phase's {allowance:.0f} s",
                "seconds_at_least": round(now() - t0, 2)}
    return {"status": "done", "seconds": round(wall, 2), "beta_star": beta["attention"]}


@contextmanager
def profiled(device: str) -> Iterator[dict]:
    """The block under `torch.profiler`; the dict yielded gets `timeline`'s reading of it, and the
    profile itself under "profile" (for its tables and trace, written later: they are slow)."""
    from torch.profiler import ProfilerActivity, profile

    got: dict = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        yield got
    got.update(status="done", **timeline(spans_of(prof)), profile=prof)


def spans_of(prof) -> Iterator[tuple[str, float, float, bool]]:
    """A profile's events as (name, start µs, end µs, on the device), read from kineto's own list:
    `prof.events()` builds a Python tree of them first, 44 s for the 855,000 events of one CPU row
    set's fit, where this takes 2 s."""
    cpu = torch.autograd.DeviceType.CPU
    raw = getattr(prof.profiler, "kineto_results", None)
    if raw is None:  # a torch without kineto's list: the slow way
        for e in prof.events():
            yield e.name, e.time_range.start, e.time_range.end, e.device_type != cpu
        return
    for e in raw.events():
        yield e.name(), e.start_ns() / 1e3, e.end_ns() / 1e3, e.device_type() != cpu


def profile_fits(root: str, cache: str, layers: str, input_size: int | None, families: list[str], device: str,
                 threads: int, out_dir: str) -> None:
    """The fresh process of `--profile`: CUDA started and the row sets read back from `cache`, then
    the stack fitted twice under the profiler; DIR/profile.json is rewritten as each part is read,
    so that a process stopped for the budget leaves what it had."""
    torch.set_num_threads(threads)
    out, report = Path(out_dir), {"status": "started"}
    out.mkdir(parents=True, exist_ok=True)

    def save(**update) -> None:
        report.update(update)
        write_json(out / "profile.json", report)

    t0 = now()
    if device == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    save(cuda_start_s=round(now() - t0, 2))
    t0 = now()
    ds = Dataset(Path(root) / "small")
    task = binding_task(ds)
    acts, _ = extract(MODEL, ds, layers, ["cls", "mean"], device, "fp32", Path(cache), input_size)
    inputs = [{s: RowReader(a.get(layer, view)) for s, a in acts.items()}
              for layer in reversed(acts["train"].layers) for view in ("cls", "mean")]
    save(read_back_s=round(now() - t0, 2), row_sets=len(inputs))
    profiles = {}
    for name in ("first", "warm"):
        with profiled(device) as got:
            evaluate_binding_sets(inputs, task, families, train=TrainConfig(device=device), n_boot=200)
            if device == "cuda":
                torch.cuda.synchronize()
        profiles[name] = got.pop("profile")
        save(**{name: got})
    save(status="done", first_less_warm=first_less_warm(report["first"], report["warm"]))
    raw = out / "fit_trace.json"  # the trace is written by kineto (a second); the tables need
    profiles["first"].export_chrome_trace(str(raw))  # `prof.events()`' Python tree (most of a minute)
    with raw.open("rb") as src, gzip.open(out / "fit_trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    for name, prof in profiles.items():
        (out / f"fit_profile_{name}.txt").write_text(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                                               row_limit=40))
    save(files=sorted(str(f) for f in out.iterdir() if f.name != "profile.json"))


def first_less_warm(first: dict, warm: dict) -> dict:
    """What the first fit spent beyond the warm one: wall and device-busy seconds, in all and per
    stage, and host seconds per CUDA runtime call (calls as `first/warm` where their counts differ)."""
    def less(a: dict, b: dict, key: str) -> float:
        return round(a.get(key, 0.0) - b.get(key, 0.0), 3)

    out = {"wall_s": less(first, warm, "wall_s"), "device_busy_s": less(first, warm, "device_busy_s"),
           "stages": {k: {"wall_s": less(v, warm["stages"].get(k, {}), "wall_s"),
                          "device_busy_s": less(v, warm["stages"].get(k, {}), "device_busy_s")}
                      for k, v in first["stages"].items()},
           "runtime_host_s": {}}
    for k in sorted(set(first["runtime"]) | set(warm["runtime"])):
        a, b = first["runtime"].get(k, {"calls": 0, "host_s": 0.0}), warm["runtime"].get(k, {"calls": 0, "host_s": 0.0})
        out["runtime_host_s"][k] = less(a, b, "host_s") if a["calls"] == b["calls"] else \
            {"host_s": less(a, b, "host_s"), "calls": f"{a['calls']}/{b['calls']}"}
    return out


def profile_fresh_process(root: Path, cache: Path, args: argparse.Namespace, threads: int, allowance: float) -> dict:
    """`profile_fits` in a spawned process (a fresh CUDA context, nothing set up by this one), stopped
    at `allowance` s; its summary as far as it got."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent"}
    if evaluate_binding_sets is None or STAGE_PREFIX is None:
        return {"status": "skipped", "reason": "this checkout has no stacked fit with labelled stages"}
    summary = args.profile / "profile.json"
    summary.unlink(missing_ok=True)
    proc = multiprocessing.get_context("spawn").Process(
        target=profile_fits, args=(str(root), str(cache), args.layers, args.input_size, args.families.split(","),
                                   args.device, threads, str(args.profile)))
    proc.start()
    proc.join(allowance)
    stopped = proc.is_alive()
    if stopped:
        proc.kill()
        proc.join()
    got = json.loads(summary.read_text()) if summary.exists() else {}
    why = (f"the profiling process was stopped at this phase's {allowance:.0f} s" if stopped
           else f"the profiling process failed (exit code {proc.exitcode})" if proc.exitcode else None)
    if got.get("status") == "done":  # the summary is whole: a stop or failure cut its files only
        if why:
            got["reason"] = f"{why} while writing its trace and tables"
    elif why:
        got.update(status="partial" if "first" in got else "stopped" if stopped else "skipped", reason=why)
    return got


#: CUDA runtime calls `timeline` counts: launches from the host, and the calls that wait for the device.
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent",
                 "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaGraphInstantiateWithFlags")


#: How many host operations `timeline` names beside the device's idle time.
IDLE_TOP = 15


def timeline(events: Iterable[tuple[str, float, float, bool]]) -> dict:
    """Where a profiled fit's time went (`spans_of` its profile, times in µs): its wall and the time
    the device was busy (the union of its kernels' and copies' intervals), in all and per fit stage
    (the `STAGE_PREFIX` labels; a stage met several times is summed); the CUDA runtime calls'
    counts and host seconds (`RUNTIME_CALLS`); and
    what the host was doing while the device sat idle: the idle time within each host operation
    (`IDLE_TOP` of them; nested ones each count it) and the idle time within none, the host's Python
    between operations. A stage whose busy share is low waited on the host."""
    device_spans, stages, runtime, host = [], {}, {}, {}
    labelled = STAGE_PREFIX or "\0"
    for name, start, end, on_device in events:
        span = (start, end)
        if on_device:
            if not name.startswith(labelled):  # a label's device-side twin spans its kernels: not one
                device_spans.append(span)
        elif name.startswith(labelled):
            stages.setdefault(name[len(labelled):], []).append(span)
        else:
            host.setdefault(name, []).append(span)
            if name in RUNTIME_CALLS:
                calls = runtime.setdefault(name, [0, 0.0])
                calls[0] += 1
                calls[1] += (span[1] - span[0]) / 1e6
    busy = _union(device_spans)
    every = [span for spans in stages.values() for span in spans]
    whole = (min(a for a, _ in every), max(b for _, b in every)) if every else \
        (min((a for a, _ in busy), default=0.0), max((b for _, b in busy), default=0.0))
    out = {"wall_s": round((whole[1] - whole[0]) / 1e6, 3), "device_busy_s": round(_overlap(busy, [whole]) / 1e6, 3),
           "stages": {}, "runtime": {k: {"calls": n, "host_s": round(t, 3)} for k, (n, t) in sorted(runtime.items())}}
    for name, spans in stages.items():
        wall = sum(b - a for a, b in spans)
        on = _overlap(busy, _union(spans))
        out["stages"][name] = {"wall_s": round(wall / 1e6, 3), "device_busy_s": round(on / 1e6, 3),
                               "busy_pct": round(100 * on / max(wall, 1e-9), 1)}
    out["busy_pct"] = round(100 * out["device_busy_s"] / max(out["wall_s"], 1e-9), 1)
    idle = _gaps(busy, whole)
    during = sorted(((_overlap(_union(spans), idle), name) for name, spans in host.items()), reverse=True)
    within_ops = _overlap(_union([span for spans in host.values() for span in spans]), idle)
    total = sum(b - a for a, b in idle)
    out["idle"] = {"seconds": round(total / 1e6, 3), "between_host_ops_s": round((total - within_ops) / 1e6, 3),
                   "within_host_op_s": {name: round(t / 1e6, 3) for t, name in during[:IDLE_TOP] if t > 0}}
    return out


def _gaps(spans: list[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float]]:
    """The parts of `window` that the disjoint, sorted `spans` leave uncovered, in order."""
    out, at = [], window[0]
    for a, b in spans:
        if a > at:
            out.append((at, min(a, window[1])))
        at = max(at, b)
        if at >= window[1]:
            break
    if at < window[1]:
        out.append((at, window[1]))
    return [(a, b) for a, b in out if b > a]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals merged where they overlap, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """Length of the disjoint, sorted `spans` that lies within the disjoint, sorted `windows`."""
    total, i = 0.0, 0
    for a, b in windows:
        while i < len(spans) and spans[i][1] <= a:
            i += 1
        j = i
        while j < len(spans) and spans[j][0] < b:
            total += min(b, spans[j][1]) - max(a, spans[j][0])
            j += 1
    return total


def power(ds: Dataset, task, families: list[str], device: str, cache: Path, allowance: float) -> dict:
    """β* of each oracle's cls row set (extraction included in its time)."""
    out: dict = {"status": "done", "beta": {}, "seconds": 0.0}
    start = now()
    for spec in ORACLES:
        left = allowance - (now() - start)
        if left <= 0:
            out.update(status="partial" if out["beta"] else "skipped", reason=f"budget spent before {spec}")
            break
        try:
            with deadline(left):
                acts, _ = extract(spec, ds, "last", ["cls"], device, "fp32", cache)
                _, beta = fit(acts, task, acts["train"].layers[-1], "cls", families, device)
        except OutOfBudget:
            out.update(status="partial" if out["beta"] else "stopped", reason=f"{spec} stopped at {allowance:.0f} s")
            break
        out["beta"][spec] = beta
    out["seconds"] = round(now() - start, 2)
    return out


class Phases(dict):
    """The phases' results, the report written to `path` (if any) each time one is set: a device
    session is short and lent rarely, and a run cut by its time limit or ended by a crash keeps
    what it had measured."""

    def __init__(self, report: dict, path: Path | None) -> None:
        super().__init__()
        self.report, self.path = report, path

    def __setitem__(self, name: str, value: dict) -> None:
        super().__setitem__(name, value)
        write_json(self.path, self.report)


def write_json(path: Path | None, report: dict) -> None:
    """The report at `path`, whole: written aside and moved in place, so a run killed while
    writing leaves the previous phase's report, never half of one."""
    if path is not None:
        write_text_atomic(json.dumps(report, indent=1, default=str), path)


def run(args: argparse.Namespace, report: dict) -> None:
    """The benchmark's phases, in order, into `report` (filled as they finish; see `Phases`)."""
    clock = Clock(args.budget, [k for k in SHARES if k != "profile" or args.profile])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(cores)
    families = args.families.split(",")
    report["config"] = {**vars(args), "torch": torch.__version__, "cpu_threads": cores,
                        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}
    phases = report["phases"] = Phases(report, args.json)
    root = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    # sampling from the start: dmon's first readings (it starts in about a second) fall before the fits
    sampler = SmSampler() if args.device == "cuda" and shutil.which("nvidia-smi") else None
    try:
        cache = root / "cache"
        t0 = now()
        ds = make_dataset(root, args.n_train, args.n_eval, args.image_size, args.seed)
        task = binding_task(ds)
        phases["generate"] = {"status": "done", "seconds": round(now() - t0, 2)}
        say(f"generated {args.n_train}/{args.n_eval}/{args.n_eval} scenes at {args.image_size} px "
            f"in {phases['generate']['seconds']} s")

        runs, fp32 = [], {}
        for spec, layers, views, side in ((MODEL, args.layers, ["cls", "mean"], args.input_size),
                                          (PIXELS, "last", ["all"], None)):
            backbone = resolve_backbone(spec)
            fp32[spec], secs = extract(backbone, ds, layers, views, args.device, "fp32", cache, side)
            runs.append({"model": spec, "dtype": "fp32", "status": "done", "seconds": round(secs, 2)})
            if clock.left() - secs < FIT_RESERVE * args.budget:
                runs.append({"model": spec, "dtype": "bf16", "status": "skipped",
                             "reason": f"at the fp32 time ({secs:.1f} s) it would leave the fits under "
                                       f"{FIT_RESERVE:.0%} of the budget"})
                continue
            _, secs = extract(backbone, ds, layers, views, args.device, "bf16", cache, side)
            runs.append({"model": spec, "dtype": "bf16", "status": "done", "seconds": round(secs, 2)})
        phases["extract"] = {"status": "done" if all(r["status"] == "done" for r in runs) else "partial",
                             "runs": runs, "layers": fp32[MODEL]["train"].layers}
        say("extraction: " + ", ".join(f"{r['model']} {r['dtype']} " + (f"{r['seconds']} s" if "seconds" in r
                                                                          else "skipped") for r in runs))

        acts = fp32[MODEL]
        row_sets = [(layer, view) for layer in reversed(acts["train"].layers) for view in ("cls", "mean")]
        pixel_layer = fp32[PIXELS]["train"].layers[-1]
        windows = {}
        start = now()
        phases["fit_device"] = fit_stack(acts, task, row_sets, families, args.device, clock.share("fit_device"))
        windows["fit_device"] = (start, now())
        say(f"fit on {args.device}: {summary_note(phases['fit_device'])}")
        start = now()
        phases["fit_device_again"] = fit_stack(acts, task, row_sets, families, args.device,
                                               clock.share("fit_device_again"))
        windows["fit_device_again"] = (start, now())
        say(f"fit on {args.device} again (warm): {summary_note(phases['fit_device_again'])}")
        start = now()
        phases["attention_device"] = fit_attention(fp32[PIXELS], task, pixel_layer, args.device,
                                                   clock.share("attention_device"))
        windows["attention_device"] = (start, now())
        say(f"attention on pixels, {args.device}: {summary_note(phases['attention_device'])}")
        if sampler is not None:
            sampler.stop()
            whole = sampler.mean(windows["fit_device"][0], windows["attention_device"][1])
            phases["sm_utilisation"] = {**whole, **{k: sampler.mean(*w) for k, w in windows.items()}}
            sampler = None
        else:
            phases["sm_utilisation"] = {"status": "skipped", "reason": "device is cpu" if args.device != "cuda"
                                        else "nvidia-smi not found"}

        phases["power"] = power(ds, task, families, args.device, cache, clock.share("power"))
        phases["power"]["pixels_attention"] = phases["attention_device"].get("beta_star")
        say(f"power: {summary_note(phases['power'])}")

        phases["fit_cpu"] = fit_side_by_side(acts, task, row_sets, families, cores, clock.share("fit_cpu"))
        say(f"fit on the CPU path (row sets side by side, {cores} cores): {summary_note(phases['fit_cpu'])}")
        phases["attention_cpu"] = fit_attention(fp32[PIXELS], task, pixel_layer, "cpu", clock.share("attention_cpu"))
        say(f"attention on pixels, CPU path: {summary_note(phases['attention_cpu'])}")
        phases["ratio"] = ratios(phases)
        if args.profile:
            phases["profile"] = profile_fresh_process(root, cache, args, cores, clock.share("profile"))
            say(f"profile of a fresh process's fits: {profile_note(phases['profile'])}")
    finally:
        if sampler is not None:
            sampler.stop()
        shutil.rmtree(root, ignore_errors=True)
    report["elapsed_s"] = round(clock.elapsed(), 1)
    report["skipped"] = [f"{name}: {p['reason']}" for name, p in phases.items() if p.get("reason")]
    report["skipped"] += [f"extract {r['model']} {r['dtype']}: {r['reason']}" for r in phases["extract"]["runs"]
                          if r.get("reason")]


def ratios(phases: dict) -> dict:
    """CPU seconds over device seconds for all the row sets (the process's first device fit, and
    the warm one where it ran; a partial phase's total is its extrapolation): every core's (the
    row sets side by side) and one core's (`one_core_over_device`: each row set's own time, summed,
    what one CPU thread would take); and attention's if both finished."""
    cpu = phases["fit_cpu"]
    out: dict = {"status": "done"}
    for phase, name in (("fit_device", "cpu_over_device"), ("fit_device_again", "cpu_over_device_warm")):
        dev = phases.get(phase, {})
        if "all_row_sets_s" in cpu and "all_row_sets_s" in dev:
            out[name] = round(cpu["all_row_sets_s"] / max(dev["all_row_sets_s"], 1e-9), 2)
            out["extrapolated"] = out.get("extrapolated", False) or cpu["all_row_sets_extrapolated"] \
                or dev["all_row_sets_extrapolated"]
            if cpu.get("workers") and cpu.get("times"):  # one core's: each row set's own time, summed
                one_core = sum(cpu["times"].values()) * cpu["row_sets_total"] / len(cpu["times"])
                out[name.replace("cpu_", "one_core_")] = round(one_core / max(dev["all_row_sets_s"], 1e-9), 2)
    att_d, att_c = phases["attention_device"], phases["attention_cpu"]
    if att_d.get("status") == "done" and att_c.get("status") in ("done", "stopped"):
        c = att_c.get("seconds", att_c.get("seconds_at_least"))
        out["attention_cpu_over_device"] = round(c / max(att_d["seconds"], 1e-9), 2)
        out["attention_ratio_is_lower_bound"] = att_c["status"] == "stopped"
    if len(out) == 1:
        return {"status": "skipped", "reason": "no fit finished on both the device and the CPU"}
    return out


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def summary_note(p: dict) -> str:
    if p.get("status") in ("skipped", "stopped") and "seconds_at_least" not in p:
        return f"{p['status']}: {p.get('reason', '')}"
    if "row_sets_done" in p:
        note = (f"{p['row_sets_done']}/{p['row_sets_total']} row sets in {p['seconds']} s "
                f"({p['per_row_set_s']} s each; all {p['all_row_sets_s']} s"
                + (", extrapolated)" if p["all_row_sets_extrapolated"] else ")"))
    elif "seconds_at_least" in p:
        note = f"> {p['seconds_at_least']} s (stopped)"
    elif "beta" in p:
        note = "; ".join(f"{spec} " + ", ".join(f"{f} {b}" for f, b in beta.items())
                         for spec, beta in p["beta"].items())
        if p.get("pixels_attention") is not None:
            note += f"; pixels attention {p['pixels_attention']}"
    else:
        note = f"{p['seconds']} s, β* {p.get('beta_star')}"
    if p.get("split", {}).get("stages_s"):
        note += f"; {split_note(p['split'])}"
    return note + (f"  [{p['reason']}]" if p.get("reason") else "")


def split_note(split: dict) -> str:
    """`split_of`'s reading in a line."""
    parts = [f"{k} {v} s" for k, v in split["stages_s"].items()]
    parts += [f"{k.replace('_stages_s', '')} stages {split[k]} s" for k in ("before_stages_s", "after_stages_s")]
    parts.append(f"gc {split['gc_s']} s ({split['gc_pauses']} pauses)")
    parts += [f"{k} +{split[k]}" for k in ALLOCATOR_COUNTS if split.get(k)]
    return "host s: " + ", ".join(parts)


def profile_note(p: dict) -> str:
    fits = [name for name in ("first", "warm") if name in p]
    if not fits:
        return f"{p['status']}: {p.get('reason', '')}"
    note = "; ".join(f"{name} fit {fit_note(p[name])}" for name in fits)
    if "first_less_warm" in p:
        d = p["first_less_warm"]
        stages = ", ".join(f"{k} {v['wall_s']:+} s" for k, v in d["stages"].items())
        calls = sorted(((v if isinstance(v, float) else v["host_s"], k) for k, v in d["runtime_host_s"].items()),
                       reverse=True)[:3]
        note += f"; first less warm: {d['wall_s']:+} s ({stages})" + (
            "; host s in runtime calls " + ", ".join(f"{k} {t:+}" for t, k in calls) if calls else "")
    return note + (f"  [{p['reason']}]" if p.get("reason") else "")


def fit_note(t: dict) -> str:
    """One profiled fit: wall, device busy in all and by stage, and what the device waited on."""
    stages = ", ".join(f"{k} {v['wall_s']} s ({v['busy_pct']} % busy)" for k, v in t["stages"].items())
    idle = t["idle"]
    return (f"{t['wall_s']} s, device busy {t['busy_pct']} %" + (f" ({stages})" if stages else "")
            + f", device idle {idle['seconds']} s, {idle['between_host_ops_s']} s of it in the host's Python"
            " between operations")


def sm_note(sm: dict) -> str:
    if sm["status"] != "done":
        return f"skipped: {sm['reason']}"
    parts = [f"{k} {w['mean_sm_pct']} %" for k, w in sm.items() if isinstance(w, dict) and "mean_sm_pct" in w]
    return f"{sm['mean_sm_pct']} % mean over {sm['samples']} s ({', '.join(parts)})"


def print_table(report: dict) -> None:
    p = report["phases"]
    c = report["config"]
    print(f"{MODEL} + {PIXELS} on {c['device_name']} ({c['cpu_threads']} CPU threads), small preset at "
          f"{c['image_size']} px, {c['n_train']}/{c['n_eval']}/{c['n_eval']} scenes, budget {c['budget']:.0f} s, "
          f"took {report['elapsed_s']} s")
    rows = [("generate", f"{p['generate']['seconds']} s")]
    for r in p["extract"]["runs"]:
        rows.append((f"extract {r['model']} {r['dtype']}", f"{r['seconds']} s" if "seconds" in r else "skipped"))
    rows += [(f"fit {c['families']} (device {c['device']})", summary_note(p["fit_device"])),
             (f"the same again, warm (device {c['device']})", summary_note(p["fit_device_again"])),
             (f"attention on pixels (device {c['device']})", summary_note(p["attention_device"])),
             ("SM utilisation while fitting", sm_note(p["sm_utilisation"])),
             ("β* (power)", summary_note(p["power"])),
             (f"fit {c['families']} (CPU path, row sets side by side)", summary_note(p["fit_cpu"])),
             ("attention on pixels (CPU path)", summary_note(p["attention_cpu"])),
             ("cpu / device", summary_note(p["ratio"]) if p["ratio"]["status"] == "skipped" else
              "; ".join(f"{k} {v}" for k, v in p["ratio"].items() if k != "status")),
             *([("profile of a fresh process's fits", profile_note(p["profile"]))] if "profile" in p else [])]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if report["skipped"]:
        print("cut for the budget: " + "; ".join(report["skipped"]))


def refuse(text: str) -> None:
    """A bad input: one line, exit status 2."""
    print(f"gpu.py: {text}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--budget", type=float, default=360.0, help="seconds the whole run may take")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--input-size", type=int, help=f"{MODEL}'s input side in px (default: its native 224)")
    ap.add_argument("--layers", default="all", help=f"hidden states of {MODEL} (all, last, 0,6,12, ...)")
    ap.add_argument("--families", default="linear,quadratic,dnn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="last, a fresh process's first and warm fits under torch.profiler; "
                         "its summary, tables and trace go to DIR")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        refuse("no CUDA device here; --device cpu runs the CPU path alone")
    if args.budget <= 0 or min(args.n_train, args.n_eval, args.image_size, args.input_size or 1) < 1:
        refuse("--budget, --n-train, --n-eval, --image-size and --input-size must be positive")
    report: dict = {}
    try:
        if args.json:  # before minutes of work, not after
            check_output_file(args.json, "--json")
        if args.profile:
            check_output_dir(args.profile, "--profile")
        run(args, report)
    except BenchError as e:
        refuse(str(e))
    except BaseException as e:  # a crash or an interrupt: the phases measured so far stay in --json
        report["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        write_json(args.json, report)
        raise
    print_table(report)
    write_json(args.json, report)


if __name__ == "__main__":
    main()
