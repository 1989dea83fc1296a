"""The attention probe on a token cache larger than it may hold: its peak RSS against its budget.

    python benchmarks/attention_stream.py [--scale 1] [--epochs 2] [--memory-budget 1GiB] [--out DIR]

At `--scale 1` this is the balanced preset's three splits (39,200/9,800/9,800 scenes) for one layer
of a small backbone: 256 patch tokens x 384 values a scene, 11.6 GB of fp16 on disk, 23 GB as the
float32 the probe computes in, beside this machine's 24 GiB of RAM. The tokens are fabricated
(seeded standard-normal values written straight to the cache's file format, no backbone run);
the scenes' codes are the preset's own (its dataset is generated: 58,800 scenes took 15 min at
112 px, where 18 objects barely fit and placing them is slow; 14,700 took 31 s at the preset's 256), so the fit is the binding task's: `evaluate_binding` with the attention
family, on one torch thread as every CPU fit, for `--epochs` epochs (a cap: the validation
plateau may stop it earlier; random tokens hold no binding, so the guard keeps the prior).

Printed: the cache's bytes, the fit's wall time and epochs, the process's peak RSS before the fit
(imports, codes) and after it, against the budget. The token files are read with positioned reads,
so the page cache that holds them is the kernel's, not the process's (RSS counts mapped pages
touched, and nothing here maps them).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from paper_scale import scenes_at  # noqa: E402  (the balanced preset's splits x S, beside this script)


def peak_rss() -> int:
    """This process's peak resident bytes so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fabricate(path: Path, n: int, tokens: int, width: int, seed: int, chunk: int = 256) -> np.memmap:
    """`n` x `tokens` x `width` seeded standard-normal fp16 values written to `path` in chunks of
    `chunk` scenes (each chunk its own seed, so a split's tokens do not depend on the chunk size's
    memory), then opened read-only as the cache's entries are."""
    with open(path, "wb") as f:
        for start in range(0, n, chunk):
            rows = min(chunk, n - start)
            rng = np.random.default_rng([seed, start])
            f.write(rng.standard_normal((rows, tokens, width), dtype=np.float32).astype(np.float16).tobytes())
    return np.memmap(path, dtype=np.float16, mode="r", shape=(n, tokens, width))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="every split x S, 0 < S <= 1 [1]")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=2, help="the attention probe's epoch cap [2]")
    parser.add_argument("--memory-budget", default=None, help="the fit's budget, e.g. 1GiB [its default]")
    parser.add_argument("--out", type=Path, default=None, help="work folder (needs the cache's bytes free)")
    opts = parser.parse_args(argv)
    if not (0 < opts.scale <= 1):
        parser.exit(2, f"attention_stream.py: error: --scale must be in (0, 1], got {opts.scale}\n")
    from bench.core.errors import BenchError
    from bench.core.resources import parse_size

    try:
        budget = None if opts.memory_budget is None else parse_size(opts.memory_budget)
    except BenchError as e:
        parser.exit(2, f"attention_stream.py: error: {e}\n")
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=opts.out) as tmp:
        return run(Path(tmp), opts, budget)


def run(work: Path, opts: argparse.Namespace, budget: int | None) -> dict:
    from bench.api import generate
    from bench.core.dataset import Dataset
    from evaluators.fitting import RowReader
    from evaluators.probes.training import TrainConfig
    from evaluators.tasks.binding.columns import evaluate_binding
    from evaluators.tasks.binding.task import binding_task

    scenes = scenes_at(opts.scale)
    t0 = time.perf_counter()
    generate("colorshape", out=work / "ds", preset="balanced", workers=os.cpu_count() or 1,
             overrides={"n_train": scenes["train"], "n_val": scenes["val"], "n_test": scenes["test"]})
    task = binding_task(Dataset(work / "ds"))
    made = time.perf_counter()
    arrays = {s: fabricate(work / f"{s}.f16", n, opts.tokens, opts.width, seed=k)
              for k, (s, n) in enumerate(scenes.items())}
    on_disk = sum((work / f"{s}.f16").stat().st_size for s in scenes)
    written = time.perf_counter()
    print(f"{scenes['train']:,}/{scenes['val']:,}/{scenes['test']:,} scenes x {opts.tokens} tokens x {opts.width}: "
          f"{on_disk / 1e9:.1f} GB fp16 ({2 * on_disk / 1e9:.1f} GB as float32); codes in {made - t0:.0f} s, "
          f"tokens written in {written - made:.0f} s", flush=True)
    before = peak_rss()
    config = TrainConfig(epochs=opts.epochs, device="cpu", memory_budget=budget)
    epochs = []
    result = evaluate_binding({s: RowReader(a) for s, a in arrays.items()}, task, ["attention"], train=config,
                              progress=lambda n: epochs.append(time.perf_counter()))
    wall = time.perf_counter() - written
    after = peak_rss()
    fits = result["attention"].fits or {}
    report = {"scenes": scenes, "cache_bytes": on_disk, "fit_s": round(wall, 1), "epochs_run": len(epochs),
              "peak_rss_before_fit": before, "peak_rss": after, "budget": budget,
              "best_epochs": {k: f.best_epoch for k, f in fits.items()}}
    print(f"fit {wall:.0f} s ({wall / 60:.1f} min; {len(epochs)} epochs over its two rounds, ≤ {opts.epochs} each); peak RSS "
          f"{before / 2**30:.2f} GiB before the fit, {after / 2**30:.2f} GiB after"
          f"{'' if budget is None else f' (budget {budget / 2**30:.2f} GiB)'}", flush=True)
    return report


if __name__ == "__main__":
    main()
