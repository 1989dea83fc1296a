"""Ray scale-out: one evaluation grid, local path against `--executor ray` with 2 workers.

The grid: 2 backbones (random:dinov2-small, random:dinov2-small-reg) x 4 layers (3, 6, 9, 12)
x 3 probe families (linear, quadratic, dnn), one seed, on a small ColorShape set; each run
starts from an empty activation cache, so it times extraction and training. Three runs,
same process, same inputs:
- local, default torch threads (what `bench evaluate` does: the baseline);
- local at 1 torch thread (what each Ray CPU task runs with);
- Ray, a local instance with 2 CPUs (2 workers); its start-up is timed apart.
Target: local (default) / Ray >= 1.6 on an idle 2-core machine. The rows of the Ray run are
checked against the 1-thread local run (equal to 1e-9). The ceiling line says how far any
2-worker run could get: the one-thread run's work split perfectly in two, against a default
that already spreads its matrix products over both cores. Then Ray's per-task overhead:
no-op tasks, one at a time (latency) and 200 at once (throughput).

    .venv/bin/python benchmarks/ray_grid.py [--n-train 160] [--epochs 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import ray
import torch

from evaluators.runner.request import EvaluationRequest
from evaluators.runner.run import run_evaluation
from generators.base import build_config, get_generator
from generators.engine import generate

MODELS = ["random:dinov2-small", "random:dinov2-small-reg"]
GRID = dict(layers="0.25,0.5,0.75,last", probes=["linear", "quadratic", "dnn"], seeds=[0])
SKIP = {"run_id", "created_at", "wall_time_s", "host", "package_versions"}


def timed_run(root: Path, name: str, data: Path, epochs: int, **kw) -> tuple[float, list[dict]]:
    """One grid run from an empty cache; (seconds, rows)."""
    os.environ["BINDINGBENCH_CACHE"] = str(root / f"cache-{name}")
    t0 = time.perf_counter()
    request = EvaluationRequest(MODELS, data, results_dir=root / f"results-{name}", epochs=epochs, **GRID, **kw)
    path = run_evaluation(request, progress=False)
    return time.perf_counter() - t0, pq.read_table(path).to_pylist()


def same_rows(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        abs(x[k] - y[k]) <= 1e-9 if isinstance(x[k], float) else x[k] == y[k]
        for x, y in zip(a, b) for k in x if k not in SKIP)


@ray.remote(num_cpus=1)
def _noop(i: int) -> int:
    return i


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-train", type=int, default=160)
    ap.add_argument("--epochs", type=int, default=20, help="epoch cap (probes stop earlier on a plateau)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bindingbench-ray-"))
    data = root / "ds"
    gen = get_generator("colorshape")
    n_eval = max(16, args.n_train // 4)
    generate(gen, build_config(gen, "small", dict(
        n_train=args.n_train, n_val=n_eval, n_test=n_eval, image_size=64, n_colors=3, n_shapes=3,
        colors_per_scene=2, shapes_per_scene=2, n_objects=3, object_size=12, margin=2)), data)
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores; grid {len(MODELS)} backbones x "
          f"4 layers x 3 families, {args.n_train} training scenes, epochs <= {args.epochs}")
    threads = torch.get_num_threads()
    t_local, _ = timed_run(root, "local", data, args.epochs)
    print(f"local, {threads} torch threads (default): {t_local:.1f} s")
    torch.set_num_threads(1)
    t_local1, rows1 = timed_run(root, "local1", data, args.epochs)
    torch.set_num_threads(threads)
    print(f"local, 1 torch thread:                {t_local1:.1f} s")
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    t_init = time.perf_counter() - t0
    t_ray, rows_ray = timed_run(root, "ray", data, args.epochs, executor="ray")
    print(f"ray, 2 workers:                       {t_ray:.1f} s (+ {t_init:.1f} s ray.init); rows equal to the "
          f"1-thread local run: {same_rows(rows_ray, rows1)}")
    print(f"speed-up vs local default: {t_local / t_ray:.2f}x (target >= 1.6); vs local 1 thread: "
          f"{t_local1 / t_ray:.2f}x; counting ray.init: {t_local / (t_ray + t_init):.2f}x")
    print(f"ceiling of any 2-worker run on {os.cpu_count()} cores against the local default (the one-thread "
          f"work split perfectly in two): {2 * t_local / t_local1:.2f}x")
    ray.get(_noop.remote(0))  # workers up
    t0 = time.perf_counter()
    for i in range(50):
        ray.get(_noop.remote(i))
    latency = (time.perf_counter() - t0) / 50
    t0 = time.perf_counter()
    ray.get([_noop.remote(i) for i in range(200)])
    throughput = (time.perf_counter() - t0) / 200
    print(f"ray per-task overhead: {1e3 * latency:.1f} ms a task one at a time, {1e3 * throughput:.1f} ms a task "
          f"200 at once")
    ray.shutdown()
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
