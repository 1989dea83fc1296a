"""Extraction throughput and memory: `random:dinov2-small` at 224 px on CPU.

Compares `extract_activations` (Parquet read, PNG decode, resize, forward with all
hidden states, fp16 views of all 13 layers written to the cache) with a bare
`model(pixel_values)` loop over pre-decoded tensors, in the same process on the
same model. Target: ratio >= 0.85. Then extracts two dataset sizes, each in a
fresh process (so allocator state left by one run cannot pass for growth in the
next), and reports the peak RSS sampled during each extraction, overall and per
quarter of the run: it must not grow with the dataset (the pipeline holds O(batch)).

    .venv/bin/python benchmarks/extract.py [--n 128] [--sizes 128,512] [--batch-size 32] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from bench.core.dataset import Dataset
from evaluators.backbones import resolve_backbone
from evaluators.cache.extract import extract_activations
from generators.base import build_config, get_generator
from generators.engine import generate

SPEC, SIDE, TOKENS = "random:dinov2-small", 224, ("cls", "mean")


def make_dataset(root: Path, n: int) -> Dataset:
    out = root / f"colorshape-{n}"
    if not (out / "dataset.json").exists():
        gen = get_generator("colorshape")
        generate(gen, build_config(gen, "small", {"n_train": 0, "n_val": 0, "n_test": n}), out)
    return Dataset(out)


def bare_loop(backbone, batches: list[torch.Tensor]) -> float:
    """Images per second of model(pixel_values) on tensors decoded beforehand."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for x in batches:
            backbone.model(pixel_values=x)
    return sum(len(x) for x in batches) / (time.perf_counter() - t0)


def extraction(backbone, ds: Dataset, cache_dir: Path, batch_size: int) -> float:
    shutil.rmtree(cache_dir, ignore_errors=True)
    t0 = time.perf_counter()
    extract_activations(backbone, ds, "test", layers="all", token_choices=TOKENS, batch_size=batch_size,
                        cache_dir=cache_dir, progress=False, device="cpu")
    return ds.num_rows("test") / (time.perf_counter() - t0)


def rss_profile(fn) -> tuple[float, list[float]]:
    """(RSS before, peak RSS per quarter of the run) in MB, sampled every 20 ms while fn runs."""
    proc = psutil.Process()
    before = proc.memory_info().rss
    samples, done = [before], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            samples.append(proc.memory_info().rss)

    t = threading.Thread(target=sample)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    k = len(samples)
    return before / 2**20, [max(samples[i * k // 4:(i + 1) * k // 4 + 1]) / 2**20 for i in range(4)]


def child(data: str, cache_dir: str, batch_size: int) -> None:
    """One extraction in a fresh process; prints its RSS profile as JSON."""
    backbone = resolve_backbone(SPEC)
    ds = Dataset(data)
    before, quarters = rss_profile(lambda: extraction(backbone, ds, Path(cache_dir), batch_size))
    print(json.dumps({"before": before, "quarters": quarters}))


def throughput(root: Path, n: int, batch_size: int, rounds: int) -> None:
    ds = make_dataset(root, n)
    backbone = resolve_backbone(SPEC)
    rows = ds.table("test", ["image"]).column("image").to_pylist()
    batches = [backbone.prepare({"image": rows[i:i + batch_size]}, SIDE) for i in range(0, len(rows), batch_size)]
    bare_loop(backbone, batches[:1])  # warm-up
    bare, ours = [], []
    for _ in range(rounds):  # interleaved: drift in machine load hits both alike
        bare.append(bare_loop(backbone, batches))
        ours.append(extraction(backbone, ds, root / "cache", batch_size))
    b, e = statistics.median(bare), statistics.median(ours)
    print(f"bare model(pixel_values) loop: {b:7.2f} images/s  (rounds: {', '.join(f'{v:.2f}' for v in bare)})")
    print(f"extract_activations:           {e:7.2f} images/s  (rounds: {', '.join(f'{v:.2f}' for v in ours)})")
    print(f"ratio extract / bare: {e / b:.3f}  (target >= 0.85)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=128, help="scenes for the throughput comparison")
    ap.add_argument("--sizes", default="128,512", help="dataset sizes for the RSS check")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, metavar=("DATA", "CACHE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child, args.batch_size)
    root = Path(tempfile.mkdtemp(prefix="bench-extract-"))
    try:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {SPEC} at {SIDE} px, "
              f"batch {args.batch_size}, tokens {'+'.join(TOKENS)} of all 13 hidden states")
        if not args.skip_throughput:
            throughput(root, args.n, args.batch_size, args.rounds)
        for n in (int(s) for s in args.sizes.split(",") if s):
            data = make_dataset(root, n)
            out = subprocess.run([sys.executable, __file__, "--child", str(data.path), str(root / f"cache-{n}"),
                                  "--batch-size", str(args.batch_size)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"n={n:5d}: peak RSS {max(r['quarters']):.0f} MB (model built: {r['before']:.0f} MB); "
                  f"per quarter of the run: {', '.join(f'{q:.0f}' for q in r['quarters'])} MB")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
