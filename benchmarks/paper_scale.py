"""The papers' scale on one machine: the README's study at the balanced preset, end to end.

    python benchmarks/paper_scale.py --scale 0.25 [--baseline small.json] [--json out.json]

The binding paper's ColorShape (the `balanced` preset: 39,200/9,800/9,800 scenes, 8 colours x 8
shapes, 18 objects a scene, H(O) = 39.9 bits) with every split scaled by `--scale`, and the
README's study on it: two backbones (random weights of the hub architectures, so it runs offline:
`random:dinov2-small` and `random:dinov2-base-reg`) at every layer x cls,mean under linear,
quadratic and dnn, then attention on every token of the first backbone's last layer. Phases, each
its own `bench` process (as a user runs them), so that each one's peak memory is its own:

1. generate: the dataset, seed 0;
2. extract BACKBONE: every layer's cls and mean tokens (and, for the attention backbone, every
   token of its last layer, from the same forward pass: `bench extract --also last:all`) into a
   cache of the benchmark's own;
3. fit pooled: `bench evaluate` of linear, quadratic, dnn on every row set of both backbones;
4. fit attention: `bench evaluate --tokens all --probes attention`, under `--memory-budget`.

Each phase prints its wall time, the peak RSS of its process tree (sampled every 0.2 s: a fit's
worker processes count too), the peak GPU memory it reserved, and the cache's bytes on disk after
it; `--baseline JSON` (an earlier run's `--json`, e.g. at `--scale 0.051`, 2,000 training scenes)
prints each phase's time beside the baseline's and their ratio against the ratio of the scenes
(≤ 1: the cost grew no faster than the scenes). Last, the headline: each backbone's β* with its
interval at the layer chosen on validation, from the results as `bench leaderboard` reads them.
The benchmark also writes `study.toml` in its folder: the same study as one file, so that
`bench run study.toml` gives the same β* (tests/test_paper_scale.py checks it at a tiny scale).

`--epochs` caps every probe's gradient stage (default 30; validation plateaus stop most fits
earlier) and `--attention-epochs` the attention probe's (default 10): both are in the rows and
the printout. `--dtype` lists the extraction dtypes; the fits read the first. Default: fp32 then
bf16 on CUDA (the fits read fp32; bf16's extraction is timed beside it); on a CPU, bf16 where the
processor has bf16 matrix units (AMX: ~4.7x fp32's images/s on the Xeon this was measured on) and
fp32 where it has none (bf16 there is ~7x slower than fp32). The dtype is in the rows and in
`study.toml`.

The study's measured cost at both presets is in docs/reference/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from generators.colorshape import ColorShapeGenerator  # noqa: E402  (after ROOT is on the path)

#: The balanced preset's splits, which `--scale` scales.
BALANCED = {split: ColorShapeGenerator.presets["balanced"][f"n_{split}"] for split in ("train", "val", "test")}
#: The README study's backbones: the hub architectures at random initialisation (no download). On a
#: CPU only the first by default: extracting DINOv2-B at 224 px runs ~3 images/s on 2 cores in fp32,
#: 80 min for the 14,700 scenes of `--scale 0.25` alone.
BACKBONES = ("random:dinov2-small", "random:dinov2-base-reg")
POOLED_FAMILIES = "linear,quadratic,dnn"

#: Runs `bench` with the given arguments as the `bench` script does, then writes the CUDA memory
#: it reserved at its peak (0 without CUDA) to the file named by $PAPER_SCALE_GPU.
CHILD = ("import os, sys\nfrom bench.cli import main\ntry:\n    code = main(sys.argv[1:])\nfinally:\n"
         "    peak = 0\n    torch = sys.modules.get('torch')\n"
         "    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():\n"
         "        peak = torch.cuda.max_memory_reserved()\n"
         "    open(os.environ['PAPER_SCALE_GPU'], 'w').write(str(peak))\nsys.exit(code)")


class TreeRss:
    """The peak summed RSS of a process and its descendants, sampled every `period` seconds from
    /proc: a fit's row sets run in worker processes of their own, whose memory the parent's
    `ru_maxrss` does not include."""

    def __init__(self, pid: int, period: float = 0.2) -> None:
        self.pid, self.period, self.peak = pid, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.period)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def tree_rss(root: int) -> int:
    """Bytes resident in `root` and all its descendants now."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    total = 0
    for pid in tree:
        try:
            fields = Path(f"/proc/{pid}/statm").read_text().split()
        except OSError:
            continue
        total += int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def run_phase(name: str, args: list[str], work: Path, env: dict[str, str], report: dict[str, Any]) -> None:
    """Run `bench ARGS` as phase `name`; record its wall time, peak tree RSS, peak GPU memory and
    the cache's bytes after it in `report["phases"]`, and print them. A failing phase ends the
    benchmark with its command's last output."""
    gpu_file = work / f".gpu-{len(report['phases'])}"
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], env={**env, "PAPER_SCALE_GPU": str(gpu_file)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rss = TreeRss(proc.pid)
    out = proc.communicate()[0]
    wall = time.perf_counter() - started
    peak = rss.stop()
    if proc.returncode != 0:
        raise SystemExit(f"phase {name} failed (bench {' '.join(args)}):\n{out[-3000:]}")
    phase = {"name": name, "wall_s": round(wall, 2), "peak_rss_bytes": peak,
             "peak_gpu_bytes": int(gpu_file.read_text() or 0) if gpu_file.exists() else 0,
             "cache_bytes": folder_bytes(work / "cache"), "command": "bench " + " ".join(args)}
    report["phases"].append(phase)
    print(phase_line(phase, report, baseline_phase(report, name)), flush=True)


def baseline_phase(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The baseline run's phase of the same name, if a baseline was given."""
    base = report.get("baseline") or {}
    return next((p for p in base.get("phases", []) if p["name"] == name), None)


def phase_line(phase: dict[str, Any], report: dict[str, Any], base: dict[str, Any] | None) -> str:
    """One phase's printout: time, memory, cache, and the ratio to its baseline's time beside the
    scenes' ratio."""
    line = (f"{phase['name']:44s} {phase['wall_s']:9.1f} s  peak RSS {gib(phase['peak_rss_bytes']):6.2f} GiB  "
            f"GPU {gib(phase['peak_gpu_bytes']):5.2f} GiB  cache {gib(phase['cache_bytes']):7.3f} GiB")
    if base is not None:
        scenes = report["scenes"]["train"] / report["baseline"]["scenes"]["train"]
        ratio = phase["wall_s"] / max(base["wall_s"], 1e-9)
        line += f"  | baseline {base['wall_s']:.1f} s: {ratio:.2f}x for {scenes:.2f}x the scenes ({ratio / scenes:.2f})"
    return line


def gib(n: float) -> float:
    return n / 2**30


def scenes_at(scale: float) -> dict[str, int]:
    """Each split's scenes at `scale` (at least 8, so that every split can be fitted and scored)."""
    return {split: max(8, round(n * scale)) for split, n in BALANCED.items()}


def study_text(opts: argparse.Namespace, scenes: dict[str, int]) -> str:
    """The benchmark's study as one `bench run` file: the same dataset and evaluations."""
    size = f"\nimage_size = {opts.image_size}" if opts.image_size else ""
    backbones = "\n".join(f'{label(b)} = {backbone_value(b, opts)}' for b in opts.backbones)
    return f'''description = "benchmarks/paper_scale.py --scale {opts.scale}: the README study at the balanced preset"
threads = {opts.threads}

[datasets.balanced]
generator = "colorshape"
preset = "balanced"
n_train = {scenes["train"]}
n_val = {scenes["val"]}
n_test = {scenes["test"]}
seed = {opts.seed}{size}

[[evaluate]]
layers = "{opts.layers}"
tokens = "cls,mean"
probes = [{", ".join(f'"{p}"' for p in POOLED_FAMILIES.split(","))}]
epochs = {opts.epochs}
device = "{opts.device}"
dtype = "{opts.dtypes[0]}"
[evaluate.backbones]
{backbones}

[[evaluate]]
layers = "last"
tokens = "all"
probes = ["attention"]
epochs = {opts.attention_epochs}
device = "{opts.device}"
dtype = "{opts.dtypes[0]}"
[evaluate.backbones]
{label(opts.backbones[0])} = {backbone_value(opts.backbones[0], opts)}
'''


def label(spec: str) -> str:
    """A backbone's name in the rows: its spec with ':' (which a study's names do not take) as '-'."""
    return spec.replace(":", "-")


def backbone_value(spec: str, opts: argparse.Namespace) -> str:
    return f'{{ spec = "{spec}", image_size = {opts.input_size} }}' if opts.input_size else f'"{spec}"'


def headline(results: Path) -> dict[str, dict[str, Any]]:
    """Each (backbone, probe family x tokens) cell's β* at the layer chosen on validation, with its
    interval, as `bench leaderboard` reads the results."""
    from bench.api import leaderboard, load_results

    board = leaderboard(load_results(results))
    cells: dict[str, dict[str, Any]] = {}
    for row in board.to_dict(orient="records"):
        cells[f"{row['backbone']} {row['probe']} {row['tokens']}"] = {k: row[k] for k in ("value", "lo", "hi", "layer", "sensitivity")}
    return cells


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.05, help="every split x S, 0 < S <= 1 [0.05]")
    parser.add_argument("--out", type=Path, default=None, help="work folder, kept [a temporary one, removed]")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier run's --json to compare with")
    parser.add_argument("--backbones", default=None,
                        help=f"comma-separated specs [{','.join(BACKBONES)} on CUDA, {BACKBONES[0]} on a CPU]")
    parser.add_argument("--layers", default="all", help="the pooled fits' layers [all]")
    parser.add_argument("--epochs", type=int, default=30, help="gradient-stage epoch cap, pooled families [30]")
    parser.add_argument("--attention-epochs", type=int, default=10, help="the attention probe's epoch cap [10]")
    parser.add_argument("--memory-budget", default=None, help="the attention fit's memory budget, e.g. 1GiB")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None,
                        help="extraction dtypes, the fits' first [fp32,bf16 on CUDA; bf16 on a CPU with AMX; fp32]")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=None, help="scene side in px [the preset's]")
    parser.add_argument("--input-size", type=int, default=None, help="backbones' input side [theirs]")
    opts = parser.parse_args(argv)
    if not (0 < opts.scale <= 1) or not math.isfinite(opts.scale):
        parser.exit(2, f"paper_scale.py: error: --scale must be in (0, 1], got {opts.scale}\n")
    opts.on_cuda = opts.device.startswith("cuda") or (opts.device == "auto" and cuda_available())
    opts.dtypes = (opts.dtype or default_dtypes(opts.on_cuda)).split(",")
    opts.backbones = [b.strip() for b in (opts.backbones or ",".join(BACKBONES[: 2 if opts.on_cuda else 1])).split(",")
                      if b.strip()]
    from bench.core.errors import BenchError
    from evaluators.cache.keys import check_dtype

    try:
        for dtype in opts.dtypes:
            check_dtype(dtype)
        check_budget(opts)
    except BenchError as e:
        parser.exit(2, f"paper_scale.py: error: {e}\n")
    return opts


def check_budget(opts: argparse.Namespace) -> None:
    """`--memory-budget` as bytes, refused (a `BenchError`) unless it holds one training batch of the
    attention backbone's tokens, as the fit would refuse it, but before any scene is made."""
    if opts.memory_budget is None:
        return
    import numpy as np

    from bench.core.resources import parse_size
    from evaluators.backbones import backbone_metadata
    from evaluators.fitting.data import RowReader, auto_batch_size, bounded_row_sets
    from evaluators.probes.training import TrainConfig

    opts.memory_budget = parse_size(opts.memory_budget)
    info = backbone_metadata(opts.backbones[0])
    if info is None or not info.patch_size:
        return  # its shape is known once it runs: the fit checks then
    side = (opts.input_size or info.input_size) // info.patch_size
    one = RowReader(np.zeros((1, side * side, info.width), dtype=np.float16))
    n_train = scenes_at(opts.scale)["train"]
    bounded_row_sets([(None, {"train": one})], TrainConfig(memory_budget=opts.memory_budget,
                                                           batch_size=auto_batch_size(n_train)), holds=False)


def default_dtypes(on_cuda: bool) -> str:
    """fp32 and bf16 on CUDA; on a CPU bf16 only where the processor has bf16 matrix units (AMX),
    since elsewhere it is slower than fp32 (see the module's docstring)."""
    if on_cuda:
        return "fp32,bf16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "fp32"
    return "bf16" if "amx_bf16" in flags.split() else "fp32"


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (the default backbones and dtypes depend on it)."""
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opts = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = (opts.out or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        return run(opts, work)


def run(opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every phase in `work`; the report (also written to `--json`)."""
    scenes = scenes_at(opts.scale)
    report: dict[str, Any] = {"scale": opts.scale, "scenes": scenes, "backbones": opts.backbones,
                              "epochs": opts.epochs, "attention_epochs": opts.attention_epochs,
                              "memory_budget": opts.memory_budget, "device": opts.device, "dtypes": opts.dtypes,
                              "cpus": os.cpu_count(), "phases": [],
                              "baseline": json.loads(opts.baseline.read_text()) if opts.baseline else None}
    (work / "study.toml").write_text(study_text(opts, scenes))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BINDINGBENCH_CACHE": str(work / "cache")}
    data, results = work / "balanced", work / "results"  # the folder's name is the rows' dataset, as in study.toml
    print(f"scale {opts.scale}: {scenes['train']:,}/{scenes['val']:,}/{scenes['test']:,} scenes; "
          f"{', '.join(opts.backbones)}; epochs ≤ {opts.epochs} (attention ≤ {opts.attention_epochs}); "
          f"extraction {', '.join(opts.dtypes)} (fits read {opts.dtypes[0]}); {opts.threads} thread(s)", flush=True)
    common = ["--device", opts.device, "--threads", str(opts.threads)]
    size = ["--image-size", str(opts.image_size)] if opts.image_size else []
    run_phase("generate", ["generate", "colorshape", "--preset", "balanced", "--n-train", str(scenes["train"]),
                           "--n-val", str(scenes["val"]), "--n-test", str(scenes["test"]), "--seed", str(opts.seed),
                           "--workers", str(opts.threads), "--out", str(data), *size], work, env, report)
    dtypes, fit_dtype = opts.dtypes, ["--dtype", opts.dtypes[0]]
    inputs = ["--image-size", str(opts.input_size)] if opts.input_size else []
    for b in opts.backbones:
        for dtype in dtypes:
            # the attention fit's tokens come from the same forward pass as the fits' dtype's pooled ones
            tokens = ["--also", "last:all"] if (b, dtype) == (opts.backbones[0], dtypes[0]) else []
            run_phase(f"extract {b} {dtype}{' + last:all' if tokens else ''}",
                      ["extract", "-m", b, "-d", str(data), "--layers", "all", "--tokens", "cls,mean", *tokens,
                       "--dtype", dtype, "--device", opts.device, *inputs], work, env, report)
    models = [a for b in opts.backbones for a in ("-m", f"{label(b)}={b}")]
    run_phase("fit pooled", ["evaluate", *models, "-d", str(data), "--layers", opts.layers, "--tokens", "cls,mean",
                             "--probes", POOLED_FAMILIES, "--epochs", str(opts.epochs), "--results", str(results),
                             *fit_dtype, *inputs, *common], work, env, report)
    budget = ["--memory-budget", str(opts.memory_budget)] if opts.memory_budget else []
    run_phase("fit attention", ["evaluate", "-m", f"{label(opts.backbones[0])}={opts.backbones[0]}", "-d", str(data), "--tokens", "all", "--probes",
                                "attention", "--epochs", str(opts.attention_epochs), "--results", str(results),
                                *fit_dtype, *inputs, *budget, *common], work, env, report)
    report["total_s"] = round(sum(p["wall_s"] for p in report["phases"]), 1)
    report["peak_rss_bytes"] = max(p["peak_rss_bytes"] for p in report["phases"])
    report["beta_star"] = headline(results)
    print(f"total {report['total_s']:.0f} s ({report['total_s'] / 60:.1f} min), peak RSS "
          f"{gib(report['peak_rss_bytes']):.2f} GiB; β* at the layer chosen on validation:")
    for cell, v in report["beta_star"].items():
        print(f"  {cell:50s} {v['value']:.4f} [{v['lo']:.4f}, {v['hi']:.4f}]  layer {v['layer']}, "
              f"sensitivity {v['sensitivity']:.4f}")
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
