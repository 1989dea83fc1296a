"""What a GPU buys: extraction and every probe family's fit of a backbone, on the device and on the CPU.

One command for a CUDA machine (issue 37's benchmark):

    PYTHONPATH=. python benchmarks/gpu.py [--budget 360] [--json gpu.json]

generates the colorshape small preset (128 px, 2,000/500/500 scenes, seed 0), then

1. times extraction of `random:dinov2-small` (all 13 hidden states, views cls and mean) and of
   `pixels` (view all), in fp32 and in bf16;
2. times the fit of linear, quadratic, dnn over every (layer, tokens) row set of
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
(unused time passes on), and a fit still running at the end of its share is stopped
(`OutOfBudget`). What was cut is said: a phase is `done`, `partial` (row sets done of the total,
the total extrapolated and labelled so) or `skipped`/`stopped` with its reason. `--device cpu`
and the size options run it end to end on any machine (tests/test_gpu_benchmark.py does, at tiny
sizes). The project need not be installed: the checkout's root goes first on sys.path, and
nothing here imports the 3D renderer.

This file is the script: its options and the phases in order. Its parts: `gpu_budget` (the one
clock, the phases' shares, the deadline), `gpu_fits` (the dataset, extraction, the fits on one
device), `gpu_pool` (the CPU path's worker processes), `gpu_sampler` (`nvidia-smi dmon`),
`gpu_profile` and `gpu_timeline` (`--profile`'s process and the reading of its trace) and
`gpu_report` (`--json`, the ratios, the table).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: it need not be installed

try:
    import torch

    from bench.core.errors import BenchError
    from bench.core.paths import check_output_dir, check_output_file
    from benchmarks import gpu_budget
    from benchmarks.gpu_fits import MODEL, PIXELS, extract, fit_attention, fit_stack, make_dataset, power
    from benchmarks.gpu_pool import fit_side_by_side
    from benchmarks.gpu_profile import profile_fresh_process
    from benchmarks.gpu_report import Phases, print_table, profile_note, ratios, summary_note, write_json
    from benchmarks.gpu_sampler import SmSampler
    from evaluators.backbones import resolve_backbone
    from evaluators.tasks.binding.task import binding_task
except ModuleNotFoundError as missing:  # run from a checkout, where not all the project's dependencies are installed
    print(f"gpu.py: the project needs the module {missing.name!r}, which is not installed here "
          f"(pip install {missing.name}, or pip install -e . for all its dependencies)", file=sys.stderr)
    sys.exit(2)

#: bf16 extraction is skipped when, by the fp32 time, it would leave less than this part of
#: the budget to the fits.
FIT_RESERVE = 0.6


def run(args: argparse.Namespace, report: dict) -> None:
    """The benchmark's phases, in order, into `report` (filled as they finish; see `Phases`)."""
    clock = gpu_budget.Clock(args.budget, [k for k in gpu_budget.SHARES if k != "profile" or args.profile])
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
        t0 = gpu_budget.now()
        ds = make_dataset(root, args.n_train, args.n_eval, args.image_size, args.seed)
        task = binding_task(ds)
        phases["generate"] = {"status": "done", "seconds": round(gpu_budget.now() - t0, 2)}
        say(f"generated {args.n_train}/{args.n_eval}/{args.n_eval} scenes at {args.image_size} px "
            f"in {phases['generate']['seconds']} s")

        runs, fp32 = [], {}
        for spec, layers, token_choices, side in ((MODEL, args.layers, ["cls", "mean"], args.input_size),
                                                  (PIXELS, "last", ["all"], None)):
            backbone = resolve_backbone(spec)
            fp32[spec], secs = extract(backbone, ds, layers, token_choices, args.device, "fp32", cache, side)
            runs.append({"model": spec, "dtype": "fp32", "status": "done", "seconds": round(secs, 2)})
            if clock.left() - secs < FIT_RESERVE * args.budget:
                runs.append({"model": spec, "dtype": "bf16", "status": "skipped",
                             "reason": f"at the fp32 time ({secs:.1f} s) it would leave the fits under "
                                       f"{FIT_RESERVE:.0%} of the budget"})
                continue
            _, secs = extract(backbone, ds, layers, token_choices, args.device, "bf16", cache, side)
            runs.append({"model": spec, "dtype": "bf16", "status": "done", "seconds": round(secs, 2)})
        phases["extract"] = {"status": "done" if all(r["status"] == "done" for r in runs) else "partial",
                             "runs": runs, "layers": fp32[MODEL]["train"].layers}
        say("extraction: " + ", ".join(f"{r['model']} {r['dtype']} " + (f"{r['seconds']} s" if "seconds" in r
                                                                          else "skipped") for r in runs))

        acts = fp32[MODEL]
        row_sets = [(layer, tokens) for layer in reversed(acts["train"].layers) for tokens in ("cls", "mean")]
        pixel_layer = fp32[PIXELS]["train"].layers[-1]
        windows = {}
        start = gpu_budget.now()
        phases["fit_device"] = fit_stack(acts, task, row_sets, families, args.device, clock.share("fit_device"))
        windows["fit_device"] = (start, gpu_budget.now())
        say(f"fit on {args.device}: {summary_note(phases['fit_device'])}")
        start = gpu_budget.now()
        phases["fit_device_again"] = fit_stack(acts, task, row_sets, families, args.device,
                                               clock.share("fit_device_again"))
        windows["fit_device_again"] = (start, gpu_budget.now())
        say(f"fit on {args.device} again (warm): {summary_note(phases['fit_device_again'])}")
        start = gpu_budget.now()
        phases["attention_device"] = fit_attention(fp32[PIXELS], task, pixel_layer, args.device,
                                                   clock.share("attention_device"))
        windows["attention_device"] = (start, gpu_budget.now())
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


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
