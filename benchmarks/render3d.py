"""3D rendering throughput (clevr scenes, OSMesa unless $BINDINGBENCH_GL says otherwise).

Measures scenes/s at 224 and 336 px for three outputs: RGB; RGB + instance mask;
RGB + mask + per-object visibility (the "alone" passes). Each is timed in this
process (1 worker) and in 2 spawned worker processes rendering concurrently (their
rates summed). Rates are printed as ratios of the baseline (RGB, 224 px, 1 worker,
this process). Then the full `generate` pipeline (PNG encoding and Parquet writing
included) at 336 px with 1 and 2 workers gives the projected time of the paper-scale
occlusion dataset (8,000 / 2,000 / 2,000 scenes per camera height) against the
10-minute target, and of the 5-height sweep.

    .venv/bin/python benchmarks/render3d.py [--scenes 150] [--generate 400]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from generators import pyrender_setup, render3d
from generators.base import build_config, get_generator
from generators.engine import generate, scene_seed
from generators.scene3d import STAGE

SIZES = (224, 336)
MODES = {
    "rgb": dict(rgb=True, mask=False, visibility=False),
    "rgb+mask": dict(rgb=True, mask=True, visibility=False),
    "rgb+mask+visibility": dict(rgb=True, mask=True, visibility=True),
}
PAPER_SCALE = 8_000 + 2_000 + 2_000
SWEEP_HEIGHTS = 5
TARGET_S = 600.0
TARGET_PER_WORKER = 30.0


def measure(n: int, offset: int) -> dict[tuple[int, str], tuple[float, float]]:
    """(wall, CPU) scenes/s of layout + render for every (size, mode), in this process, after
    a warm-up. CPU time counts llvmpipe's threads too: it is the rate on an otherwise idle core."""
    gen_cls = get_generator("clevr")
    rates = {}
    for size in SIZES:
        gen = gen_cls(build_config(gen_cls, "default", {"image_size": size}))
        renderer = render3d.get_renderer(size)
        for i in range(10):  # context, shaders, every model
            lay = gen.layout("train", i, scene_seed(0, "train", i))
            renderer.render(lay.placed, lay.camera, lay.lights, STAGE)
        for mode, flags in MODES.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(offset, offset + n):
                lay = gen.layout("train", i, scene_seed(0, "train", i))
                renderer.render(lay.placed, lay.camera, lay.lights, STAGE, **flags)
            rates[(size, mode)] = (n / (time.perf_counter() - t0), n / (time.process_time() - c0))
    return rates


def pipeline(n: int, workers: int, out: Path) -> tuple[float, float]:
    """(wall, CPU) scenes/s of `generate` at 336 px end to end (worker start-up included);
    CPU time sums this process and its workers."""
    gen_cls = get_generator("clevr")
    cfg = build_config(gen_cls, "default", {"n_train": n * 4 // 6, "n_val": n // 6, "n_test": n // 6,
                                             "shard_size": max(n // 12, 1)})
    t0, c0 = time.perf_counter(), _cpu()
    card = generate(gen_cls, cfg, out, workers=workers)
    total = sum(s["n"] for s in card["splits"].values())
    return total / (time.perf_counter() - t0), total / (_cpu() - c0)


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenes", type=int, default=150, help="scenes per (size, mode) and worker")
    ap.add_argument("--generate", type=int, default=400, help="scenes per end-to-end generate run")
    args = ap.parse_args()
    print(f"platform: {pyrender_setup.platform()}; load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    one = measure(args.scenes, 0)
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        parts = list(pool.map(measure, [args.scenes] * 2, [0, args.scenes]))
    base = one[(224, "rgb")][0]
    print(f"baseline: rgb at 224 px, 1 worker = {base:.1f} scenes/s (wall)")
    print(f"{'size':>5} {'output':<22} {'1 worker':>15} {'2 workers (sum)':>16} {'per worker':>10} "
          f"{'per CPU-s, 1 / 2 workers':>26}")
    for size in SIZES:
        for mode in MODES:
            r1, c1 = one[(size, mode)]
            r2 = sum(p[(size, mode)][0] for p in parts)
            c2 = sum(p[(size, mode)][1] for p in parts) / 2
            print(f"{size:>5} {mode:<22} {r1:6.1f} ({r1 / base:4.2f}x) {r2:7.1f} ({r2 / base:4.2f}x) {r2 / 2:10.1f} "
                  f"{c1:17.1f} / {c2:6.1f}")
    per_worker = sum(p[(224, "rgb+mask+visibility")][0] for p in parts) / 2
    verdict = "meets" if per_worker >= TARGET_PER_WORKER else "misses"
    print(f"224 px, mask + visibility, 2 workers: {per_worker:.1f} scenes/s per worker "
          f"({verdict} the {TARGET_PER_WORKER:.0f} target)")
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            rate, cpu_rate = pipeline(args.generate, workers, Path(tmp) / f"w{workers}")
            one_height = PAPER_SCALE / rate
            idle = PAPER_SCALE / (cpu_rate * workers)  # the same CPU work on `workers` idle cores
            verdict = "meets" if one_height < TARGET_S else "misses"
            print(f"generate 336 px, {workers} worker(s): {rate:6.1f} scenes/s ({rate / base:.2f}x baseline), "
                  f"{cpu_rate:5.1f} per CPU-s; paper scale {PAPER_SCALE} scenes: {one_height / 60:5.1f} min "
                  f"({verdict} the {TARGET_S / 60:.0f} min target; {idle / 60:4.1f} min on {workers} idle core(s)); "
                  f"{SWEEP_HEIGHTS}-height sweep: {SWEEP_HEIGHTS * one_height / 60:5.1f} min")


if __name__ == "__main__":
    main()
