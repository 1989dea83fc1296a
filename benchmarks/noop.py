"""The fixed cost of a run: `bench evaluate` with nothing to do, against the same run with work.

On a small ColorShape set (`--n-train/--n-val/--n-test` scenes, preset small, `--limit` rows of
each split), each in its own process: (1) the run that fills the results folder (extraction and
fits), (2) the same command again, every row held: it plans from the registry's metadata and the
results' keys and stops before any model code loads, (3) the same with `--overwrite` on the now warm
activation cache: one run end to end against its fit (the rows' `wall_time_s`). Each line gives
the wall time, the peak RSS of that process, and whether it imported torch. Then `bench run` of a small
study (the oracle and pixels on the same scenes) twice: with work, then with every row held, which
plans from metadata, keeps the site built from the same results and loads no torch. Target (issue
59): a no-op at most 3 s and 400 MB; end to end at most 1.5x the fit.

    .venv/bin/python benchmarks/noop.py [--model pixels --model random:dinov2-small] [--layers 0,6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The command line, run as the `bench` script runs it, then the heavy modules it imported.
RUN = ("import json, sys\nfrom bench.cli import main\ncode = main(sys.argv[1:])\n"
       "print(json.dumps([m for m in ('torch', 'transformers') if m in sys.modules]), file=sys.stderr)\n"
       "sys.exit(code)")


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float, list[str]]:
    """Wall seconds, peak RSS (MB) and the heavy modules loaded of one `bench` process."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", RUN, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench {' '.join(args)} failed:\n{err}")
    return wall, usage.ru_maxrss / 1024, json.loads(err.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", default=None, help="[pixels, random:dinov2-small]")
    parser.add_argument("--layers", default="0,6")
    parser.add_argument("--n-train", type=int, default=200)
    parser.add_argument("--n-val", type=int, default=50)
    parser.add_argument("--n-test", type=int, default=50)
    parser.add_argument("--limit", type=int, default=40)
    opts = parser.parse_args()
    models = opts.model or ["pixels", "random:dinov2-small"]
    sys.path.insert(0, str(ROOT))
    from bench.api import generate
    from bench.core.results import read_results

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "BINDINGBENCH_CACHE": f"{tmp}/cache"}
        generate("colorshape", out=f"{tmp}/ds", preset="small", workers=1,
                 overrides={"n_train": opts.n_train, "n_val": opts.n_val, "n_test": opts.n_test})
        print(f"{len(models)} backbone(s) ({', '.join(models)}), layers {opts.layers} where they have them, "
              f"--limit {opts.limit}, probes linear, 2 epochs")
        for k, model in enumerate(models):
            layers = [] if model.startswith(("pixels", "oracle:")) else ["--layers", opts.layers]
            args = ["evaluate", "--dataset", f"{tmp}/ds", "--results", f"{tmp}/results-{k}", "--model", model,
                    *layers, "--limit", str(opts.limit), "--probes", "linear", "--epochs", "2", "--device", "cpu"]
            for what, extra in (("with work (cold cache)", []), ("nothing to do", []),
                                ("--overwrite (warm cache)", ["--overwrite"])):
                wall, rss, loaded = timed([*args, *extra], env)
                line = f"{model:22s} {what:26s} {wall:6.2f} s {rss:7.0f} MB  imports: {', '.join(loaded) or 'no torch'}"
                if extra:
                    rows = read_results(f"{tmp}/results-{k}").to_pylist()
                    last = max(r["run_id"] for r in rows)
                    fit = sum(r["wall_time_s"] for r in rows if r["run_id"] == last)
                    line += f"; its fit {fit:.2f} s, end to end {wall / fit:.1f}x"
                print(line, flush=True)
        study = Path(tmp) / "study.toml"
        study.write_text(f'threads = 1\n[datasets.ds]\npath = "{tmp}/ds"\n[[evaluate]]\n'
                         f'backbones = ["oracle:objects", "pixels"]\nprobes = ["linear"]\nepochs = 2\nlimit = {opts.limit}\n')
        for what in ("with work", "nothing to do"):
            wall, rss, loaded = timed(["run", str(study), "--out", f"{tmp}/study"], env)
            print(f"{'bench run (2 backbones)':22s} {what:26s} {wall:6.2f} s {rss:7.0f} MB  "
                  f"imports: {', '.join(loaded) or 'no torch'}", flush=True)


if __name__ == "__main__":
    main()
