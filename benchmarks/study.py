"""`bench run`: how long a plan takes, and how long a rerun that has nothing to fit takes.

Plan: `bench run NAME --dry-run` on each shipped study (`demo`, `fbp`, `obv`; hub models planned
offline from the registry's metadata, `HF_HUB_OFFLINE=1`), each in its own process, so the
time includes the interpreter, the imports and the metadata look-ups a user waits for. Rerun:
a small study (one ColorShape dataset of 40/20/20 scenes at 128 px, oracle:objects and pixels
with linear and dnn probes, 2 epochs) is run once, then run again: the second run must fit
nothing, and its time is what a rerun of a finished study costs (checking the file, planning,
reading the results and printing the leaderboard). Each line gives the 1-minute load average
before the measurement, since these machines are shared.

    .venv/bin/python benchmarks/study.py [--repeats 3]

Measured on this project's 2-core machine shared with other jobs (load average 5.6–5.9):
plan demo 11.8–12.1 s (its zoo metadata imports transformers), fbp 6.8–6.9 s, obv 6.7 s;
the small study's first run 40.8 s, a rerun with nothing to fit 6.2–6.3 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = """
threads = 1
[datasets.cs]
generator = "colorshape"
preset = "small"
n_train = 40
n_val = 20
n_test = 20
image_size = 128
[[evaluate]]
backbones = ["oracle:objects", "pixels"]
probes = ["linear", "dnn"]
epochs = 2
"""


def bench(*args: str, env: dict[str, str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args], env=env, cwd=cwd,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "BINDINGBENCH_CACHE": str(work / "cache")}
        for name in ("demo", "fbp", "obv"):
            for _ in range(args.repeats):
                load = os.getloadavg()[0]
                seconds, _ = bench("run", name, "--dry-run", env=env, cwd=work)
                print(f"plan {name}: {seconds:.2f} s (load {load:.1f})", flush=True)
        study = work / "small.toml"
        study.write_text(SMALL)
        load = os.getloadavg()[0]
        seconds, _ = bench("run", str(study), env=env, cwd=work)
        print(f"first run of the small study: {seconds:.1f} s (load {load:.1f})", flush=True)
        for _ in range(args.repeats):
            load = os.getloadavg()[0]
            seconds, done = bench("run", str(study), env=env, cwd=work)
            assert "nothing to fit" in done.stderr, done.stderr[-2000:]
            print(f"rerun (nothing to fit): {seconds:.2f} s (load {load:.1f})", flush=True)


if __name__ == "__main__":
    main()
