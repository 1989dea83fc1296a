"""Torch threads of `bench evaluate`: the default against fixed counts, idle and beside a busy process.

The run: `bench evaluate --model oracle:objects --probes dnn` on a balanced ColorShape set of
500/150/150 scenes at 128 px, each in its own process, on 2 cores (the benchmark pins itself
and every process it starts to the first two cores it may use). Settings: `--threads 1`,
`--threads 2` and the default (no option); conditions: idle, then with one CPU-bound process
pinned to the same two cores. It prints each wall time, the thread count the default chose,
and per condition the default's time over the best setting's (the target: at most 1.5).
"Idle" means only that this benchmark starts nothing beside the run: each line gives the
1-minute load average before the run, so a run on a machine that others use says so.

    .venv/bin/python benchmarks/threads.py [--n-train 500 --n-val 150 --n-test 150] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"default": [], "1 thread": ["--threads", "1"], "2 threads": ["--threads", "2"]}
TARGET = 1.5


def two_cores() -> set[int]:
    """The first two cores this process may use (all of them on a smaller machine)."""
    return set(sorted(os.sched_getaffinity(0))[:2])


def bench_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args], env=env,
                          capture_output=True, text=True, check=True)


def timed_evaluate(data: Path, results: Path, extra: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of one evaluate run, and the thread line it printed."""
    t0 = time.perf_counter()
    done = bench_cli("evaluate", "--model", "oracle:objects", "--dataset", str(data), "--probes", "dnn",
                     "--results", str(results), "--format", "csv", *extra, env=env)
    wall = time.perf_counter() - t0
    line = next((m.group(0) for m in re.finditer(r"threads: .*", done.stderr)), "?")
    return wall, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=500)
    parser.add_argument("--n-val", type=int, default=150)
    parser.add_argument("--n-test", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting and condition (the fastest is kept)")
    args = parser.parse_args()
    cores = two_cores()
    os.sched_setaffinity(0, cores)  # inherited by every process started below
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "BINDINGBENCH_CACHE": str(root / "cache"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        data = root / "data"
        bench_cli("generate", "colorshape", "--preset", "small", "--n-train", str(args.n_train), "--n-val",
                  str(args.n_val), "--n-test", str(args.n_test), "--image-size", "128", "--out", str(data),
                  "--workers", "1", env=env)
        timed_evaluate(data, root / "warm-up", ["--epochs", "1"], env)  # the activation cache, filled once
        print(f"evaluate oracle:objects dnn, {args.n_train}/{args.n_val}/{args.n_test} scenes, cores {sorted(cores)}, "
              f"{args.repeats} run(s) each (fastest kept)")
        runs = 0
        for condition in ("idle", "one CPU-bound process beside"):
            neighbour = (subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition != "idle" else None)
            try:
                times = {}
                for name, extra in SETTINGS.items():
                    best = None
                    for _ in range(args.repeats):
                        load = os.getloadavg()[0]
                        runs += 1
                        wall, line = timed_evaluate(data, root / f"results-{runs}", extra, env)
                        best = wall if best is None else min(best, wall)
                        print(f"  {condition:<30} {name:<10} {wall:7.1f} s   load before {load:4.1f}   {line}",
                              flush=True)
                    times[name] = best
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
            fastest = min(times, key=times.get)
            ratio = times["default"] / times[fastest]
            verdict = "ok" if ratio <= TARGET else f"over the {TARGET}x target"
            print(f"{condition}: default {times['default']:.1f} s, best {fastest} {times[fastest]:.1f} s: "
                  f"default / best = {ratio:.2f}x ({verdict})", flush=True)


if __name__ == "__main__":
    main()
