"""`--profile`'s phase of the GPU benchmark: a fresh process (spawned: CUDA started and the row sets
read back from the run's cache before anything is measured) fits the stack twice under
`torch.profiler`, its first fit and then warm, and writes their timelines (`gpu_timeline`), the
difference, the first fit's trace and the host operations' tables (a part of `benchmarks/gpu.py`)."""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import shutil
from pathlib import Path

import torch

from bench.core.dataset import Dataset
from benchmarks import gpu_budget
from benchmarks.gpu_fits import MODEL, extract
from benchmarks.gpu_report import write_json
from benchmarks.gpu_timeline import first_less_warm, profiled
from evaluators.tasks.binding.task import binding_task
from evaluators.tasks.binding.columns import evaluate_binding_sets
from evaluators.fitting import RowReader, TrainConfig


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

    t0 = gpu_budget.now()
    if device == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    save(cuda_start_s=round(gpu_budget.now() - t0, 2))
    t0 = gpu_budget.now()
    ds = Dataset(Path(root) / "small")
    task = binding_task(ds)
    acts, _ = extract(MODEL, ds, layers, ["cls", "mean"], device, "fp32", Path(cache), input_size)
    inputs = [{s: RowReader(a.get(layer, tokens)) for s, a in acts.items()}
              for layer in reversed(acts["train"].layers) for tokens in ("cls", "mean")]
    save(read_back_s=round(gpu_budget.now() - t0, 2), row_sets=len(inputs))
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


def profile_fresh_process(root: Path, cache: Path, args: argparse.Namespace, threads: int, allowance: float) -> dict:
    """`profile_fits` in a spawned process (a fresh CUDA context, nothing set up by this one), stopped
    at `allowance` s; its summary as far as it got."""
    if allowance <= 0:
        return {"status": "skipped", "reason": "budget spent"}
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
