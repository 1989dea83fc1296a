"""Benchmarks of the probes: what each family costs to fit, the one-pass `dnn` against one MLP
per bit, and memory that does not grow with the data.

Family costs: every family fitted as `bench evaluate` fits it (all its probes, the evaluator's
default settings, one torch thread) on the cached activations of one backbone; run it on two
checkouts to compare them (`PYTHONPATH=OTHER_CHECKOUT python benchmarks/probes.py --costs-only`):
it uses only the evaluator's public functions.

The one-pass dnn against the reference:

The reference is the design the paper's code uses: K separate MLPs (same hidden width
and depth), bit k reading [z, o_<k]. Both train through the same loop on the same
cached `oracle:objects` activations of a paper-shaped balanced ColorShape dataset
(8 colours x 8 shapes, K = 64 bits), with the evaluator's default training settings.

Reports scenes/s per epoch, the speed-up (target >= 10x) and final test bits (target:
dnn <= reference + 1 bit). Then trains the dnn probe on synthetic memmapped
activations of two sizes (4x apart), each in a fresh process, and reports their peak
RSS (target: no growth with dataset size).

    .venv/bin/python benchmarks/probes.py [--n-train 4000] [--epochs 20] [--hidden 256] [--costs-only]
        [--cost-models oracle:objects,pixels] [--cost-train 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

# After PYTHONPATH's entries, so that `PYTHONPATH=OTHER_CHECKOUT` times that checkout's probes.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                str(Path(__file__).resolve().parents[1]))

from bench.core.dataset import Dataset  # noqa: E402
from benchmarks.older_layouts import (MadeProbe, Probe, ProbeJob, RowReader, TrainConfig,  # noqa: E402
                                      extract_activations, fit_probes)  # wherever the checkout timed keeps them
from generators.base import build_config, get_generator  # noqa: E402
from generators.engine import generate  # noqa: E402


class PerBitMLP(Probe):
    """Reference: one MLP per bit on [z, o_<k] (K forward passes, K sets of weights)."""

    def __init__(self, in_dim: int, n_bits: int, hidden: int) -> None:
        super().__init__(in_dim, n_bits)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(in_dim + n_bits, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                          nn.Linear(hidden, 1))
            for _ in range(n_bits)
        )

    def readout(self, x, t, cond):
        return torch.cat([mlp(torch.cat([x, t * self.tril[k]], dim=-1)) for k, mlp in enumerate(self.mlps)], dim=-1)


def dataset(root: Path, n_train: int) -> Dataset:
    gen = get_generator("colorshape")
    cfg = build_config(gen, "balanced", {"n_train": n_train, "n_val": n_train // 4, "n_test": n_train // 4})
    generate(gen, cfg, root / "balanced", workers=2)
    return Dataset(root / "balanced")


def train(model: Probe, inputs: dict, targets: dict, epochs: int) -> tuple[float, float, int]:
    """(median seconds per epoch incl. validation, mean test bits at the best epoch, epochs run)
    with the evaluator's default training settings for the epochs."""
    stamps = [time.perf_counter()]
    # one L2 strength and a short solve for the linear stage: it is not what is compared (the
    # epochs are), and along the whole path it took the reference's 64 MLPs over 45 minutes
    config = TrainConfig(epochs=epochs, l2_path=(1e-3,), l1_path=(), linear_iterations=20)
    res = fit_probes([ProbeJob("p", model, targets)], inputs, config,
                     progress=lambda _: stamps.append(time.perf_counter()))["p"]
    return float(np.median(np.diff(stamps[1:]) if len(stamps) > 2 else np.diff(stamps))), float(res.scene_bits.mean()), len(stamps) - 1


def rss_child(path: str, epochs: int) -> None:
    """Train the dnn probe on a memmapped array; print peak RSS (MiB) as JSON."""
    x = np.load(path, mmap_mode="r")
    n = len(x)
    rng = np.random.default_rng(0)
    targets = {s: (rng.random((n, 16)) < 0.3).astype(np.uint8) for s in ("train", "val", "test")}
    inputs = {s: RowReader(x) for s in targets}
    fit_probes([ProbeJob("p", MadeProbe(x.shape[1], 16, hidden=64), targets)], inputs,
               TrainConfig(epochs=epochs, batch_size=256))
    print(json.dumps({"n": n, "peak_rss_mib": peak_rss_mib()}))


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM). Unlike ru_maxrss it starts afresh at exec,
    so a child does not inherit the peak of the parent it was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_by_size(root: Path, sizes: tuple[int, ...], dim: int) -> list[dict]:
    out = []
    for n in sizes:
        path = root / f"acts-{n}.npy"
        arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, dim))
        for start in range(0, n, 8192):
            stop = min(start + 8192, n)
            arr[start:stop] = np.random.default_rng(start).normal(size=(stop - start, dim))
        del arr
        proc = subprocess.run([sys.executable, __file__, "--rss-child", str(path)], capture_output=True, text=True,
                              check=True)
        out.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "file_mib": path.stat().st_size / 2**20})
        path.unlink()
    return out


def family_costs(root: Path, models: list[str], n_train: int, families: tuple[str, ...]) -> None:
    """Seconds to fit each family (all of its probes) on each backbone's cls activations, and on
    pixels' patch tokens for the attention family, at one torch thread: CPU seconds (what a
    comparison of two checkouts reads, even on a busy machine) beside wall seconds."""
    from benchmarks.older_layouts import BINDING_PROBES, SPLITS, binding_task, evaluate_binding

    torch.set_num_threads(1)
    gen = get_generator("colorshape")
    generate(gen, build_config(gen, "small", {"n_train": n_train, "image_size": 128}), root / "small")
    ds = Dataset(root / "small")
    task = binding_task(ds)
    print(f"family costs: balanced small preset at 128 px, {n_train}/500/500 scenes, one torch thread")
    for spec in models:
        spatial = {f for f in families if BINDING_PROBES.get(f).spatial}
        for tokens, chosen in (("cls", tuple(f for f in families if f not in spatial)),
                           ("all", tuple(f for f in families if f in spatial))):
            if not chosen or (tokens == "all" and spec.startswith("oracle:") and spec != "oracle:patches"):
                continue
            acts = {s: extract_activations(spec, ds, s, layers="last", token_choices=(tokens,), progress=False)
                    for s in SPLITS}
            inputs = {s: RowReader(a.get(a.layers[0], tokens)) for s, a in acts.items()}
            for fam in chosen:
                t0, c0 = time.perf_counter(), time.process_time()
                r = evaluate_binding(inputs, task, [fam], train=TrainConfig(), n_boot=200)[fam]
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                print(f"  {spec:16s} {tokens:4s} {fam:17s} {cpu:7.1f} s CPU {wall:7.1f} s wall   "
                      f"beta* {r.metrics.get('beta_star', float('nan')):+.4f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rss-dim", type=int, default=1024)
    ap.add_argument("--rss-rows", type=int, default=50_000)
    ap.add_argument("--rss-child")
    ap.add_argument("--costs-only", action="store_true", help="only time each family's fit")
    ap.add_argument("--cost-models", default="oracle:objects,pixels")
    ap.add_argument("--cost-train", type=int, default=2000)
    ap.add_argument("--families", default="linear,quadratic,quadratic-shared,dnn,attention")
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child, 1)
        return
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BINDINGBENCH_CACHE"] = str(Path(tmp) / "cache")
        family_costs(Path(tmp), args.cost_models.split(","), args.cost_train, tuple(args.families.split(",")))
    if args.costs_only:
        return
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["BINDINGBENCH_CACHE"] = str(root / "cache")
        ds = dataset(root, args.n_train)
        acts = {s: extract_activations("oracle:objects", ds, s, layers="last", token_choices=("cls",), progress=False)
                for s in ("train", "val", "test")}
        inputs = {s: RowReader(a.get(a.layers[0], "cls")) for s, a in acts.items()}
        targets = {s: ds.codes(s)[1] for s in inputs}
        d, k = inputs["train"].row_shape[-1], targets["train"].shape[1]
        n = len(inputs["train"])
        dnn_s, dnn_bits, dnn_epochs = train(MadeProbe(d, k, hidden=args.hidden), inputs, targets, args.epochs)
        ref_s, ref_bits, ref_epochs = train(PerBitMLP(d, k, args.hidden), inputs, targets, args.epochs)
        print(f"oracle:objects activations: {n} train scenes, D={d}, K={k} bits, hidden {args.hidden}, "
              f"at most {args.epochs} epochs (early stopping on val bits), torch threads {torch.get_num_threads()}")
        print(f"dnn (one masked network): {n / dnn_s:9.0f} scenes/s per epoch, test bits {dnn_bits:.3f} "
              f"({dnn_epochs} epochs)")
        print(f"reference (MLP per bit):  {n / ref_s:9.0f} scenes/s per epoch, test bits {ref_bits:.3f} "
              f"({ref_epochs} epochs)")
        print(f"speed-up {ref_s / dnn_s:.1f}x (target >= 10x); test bits dnn - reference = "
              f"{dnn_bits - ref_bits:+.3f} (target <= +1)")
        rows = rss_by_size(root, (args.rss_rows, 4 * args.rss_rows), args.rss_dim)
        for r in rows:
            print(f"dnn on {r['n']:>7} x {args.rss_dim} fp16 memmap ({r['file_mib']:.0f} MiB): "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB")
        print(f"peak RSS ratio (4x data) {rows[1]['peak_rss_mib'] / rows[0]['peak_rss_mib']:.2f} (target ~1.0)")


if __name__ == "__main__":
    main()
