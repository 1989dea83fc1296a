"""ColorShape generation throughput: balanced preset, 256 px, PNG encoding and Parquet writing.

Runs in one process: a render-only baseline (scenes drawn, nothing encoded), then the
full `generate` pipeline with 1 and 2 workers; prints scenes/s, each rate as a ratio of
the baseline, and the projected time of the paper-scale dataset (39,200 / 9,800 / 9,800)
against the 60 s target.

    .venv/bin/python benchmarks/generate_colorshape.py [--scenes 6000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from generators.base import build_config, get_generator
from generators.engine import generate, scene_seed

PAPER_SCALE = 39_200 + 9_800 + 9_800
TARGET_S = 60.0


def render_only(n: int) -> float:
    """Scenes/s of drawing alone (sampling, layout, stencils), in this process."""
    gen_cls = get_generator("colorshape")
    gen = gen_cls(build_config(gen_cls, "balanced", {}))
    t0 = time.perf_counter()
    for i in range(n):
        gen.render("train", i, scene_seed(0, "train", i))
    return n / (time.perf_counter() - t0)


def pipeline(n: int, workers: int, out: Path) -> float:
    """Scenes/s of `generate` end to end (process start-up included)."""
    gen_cls = get_generator("colorshape")
    cfg = build_config(gen_cls, "balanced", {"n_train": n * 4 // 6, "n_val": n // 6, "n_test": n // 6})
    t0 = time.perf_counter()
    card = generate(gen_cls, cfg, out, workers=workers)
    total = sum(s["n"] for s in card["splits"].values())
    return total / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenes", type=int, default=6000)
    args = ap.parse_args()
    base = render_only(min(args.scenes, 2000))
    print(f"baseline render-only, 1 process: {base:7.0f} scenes/s")
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            rate = pipeline(args.scenes, workers, Path(tmp) / f"w{workers}")
            projected = PAPER_SCALE / rate
            verdict = "meets" if projected < TARGET_S else "misses"
            print(
                f"generate, {workers} worker(s):     {rate:7.0f} scenes/s  ({rate / base:.2f}x baseline)  "
                f"paper scale {PAPER_SCALE} scenes: {projected:5.1f} s ({verdict} the {TARGET_S:.0f} s target)"
            )


if __name__ == "__main__":
    main()
