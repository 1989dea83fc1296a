"""What CUDA's fitting path launches, counted on any machine (no GPU needed).

On a GPU the fit of small probes is bound by kernel launches, each a call from Python: an H200
sat 90 % idle. This runs the fit of linear, quadratic, dnn over the row sets of
`random:dinov2-small` through the path CUDA takes (stacked gradient stage, graphed stacks' live
mask, dense class differences), here eagerly on the CPU, and counts every tensor operation that is
not a view (a GPU launches a kernel or more for each) by stage. The steps CUDA replays from graphs
(an L-BFGS iteration of the linear stage, a stacked training step) are counted apart: CUDA
launches their operations only when it warms a graph up or captures it
(`evaluators.cuda_graphs.WARMUP` runs, then one capture per graph), and one replay per step after.
Run it for 2 and 4 row sets: a stage whose count grows with the row sets launches per row set.

    PYTHONPATH=. python benchmarks/launches.py --layers 11          # 2 row sets (cls, mean)
    PYTHONPATH=. python benchmarks/launches.py --layers 10,11       # 4 row sets
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

import evaluators.fitting as fitting  # noqa: E402
from evaluators import cuda_graphs, linear_solver  # noqa: E402
from evaluators.binding import evaluate_binding_sets  # noqa: E402
from evaluators.fitting import moments, stacked  # noqa: E402
from evaluators.training import RowReader, TrainConfig  # noqa: E402

class Launches(TorchDispatchMode):
    """Counts the operations other than views (which launch nothing), per stage (set by `tagged`)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.where = ["other"]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not func.is_view:
            self.counts[self.where[-1]] += 1
        return func(*args, **(kwargs or {}))

    def tagged(self, stage: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            self.where.append(stage)
            try:
                return fn(*args, **kwargs)
            finally:
                self.where.pop()
        return inner


def count(n_sets_layers: str, n_train: int, n_eval: int, families: list[str]) -> dict:
    """Launch counts of one fit of every (layer, cls|mean) row set of `n_sets_layers`."""
    mode = Launches()
    graphs: dict[str, Counter] = {"iteration": Counter(), "step": Counter()}  # runs per graph key

    def keyed(kind: str, key_of: Callable, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(self, *args, **kwargs):
            graphs[kind][key_of(self, *args)] += 1
            return mode.tagged(kind, fn)(self, *args, **kwargs)
        return inner

    patches = [(fitting, name, stage) for stage, name in (("linear", "_linear_stage"), ("moments", "_moment_stage"),
                                                          ("gradient", "_gradient_rounds"), ("scoring", "score_sets"))]
    patches.append((stacked, "_validate", "validation"))
    saved = [(m, n, getattr(m, n)) for m, n, _ in patches]
    saved += [(linear_solver._LBFGS, "iterate", linear_solver._LBFGS.iterate),
              (stacked._Stack, "train_eagerly", stacked._Stack.train_eagerly)]
    devices = [(stacked, "STACKED_DEVICES"), (stacked, "GRAPHED_DEVICES"), (moments, "DENSE_DEVICES")]
    saved += [(m, n, getattr(m, n)) for m, n in devices]
    try:
        for m, n, stage in patches:
            setattr(m, n, mode.tagged(stage, getattr(m, n)))
        linear_solver._LBFGS.iterate = keyed(
            "iteration", lambda s, kind: (id(s), kind), linear_solver._LBFGS.iterate)
        stacked._Stack.train_eagerly = keyed(
            "step", lambda s, x, *rest: (id(s), tuple(x.shape)), stacked._Stack.train_eagerly)
        for m, n in devices:
            setattr(m, n, ("cuda", "cpu"))
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            ds = gpu.make_dataset(root, n_train, n_eval, 64, 0)
            task = gpu.binding_task(ds)
            acts, _ = gpu.extract(gpu.MODEL, ds, n_sets_layers, ["cls", "mean"], "cpu", "fp32", root / "cache", 56)
            row_sets = [(layer, view) for layer in reversed(acts["train"].layers) for view in ("cls", "mean")]
            inputs = [{s: RowReader(a.get(layer, view)) for s, a in acts.items()} for layer, view in row_sets]
            with mode:
                evaluate_binding_sets(inputs, task, families, train=TrainConfig(device="cpu"), n_boot=50)
    finally:
        for m, n, v in saved:
            setattr(m, n, v)
    out = {"row_sets": len(row_sets), "stages": dict(mode.counts)}
    for kind, runs in graphs.items():  # on CUDA, WARMUP eager runs per graph (an iteration's: its solver and
        # penalty kind; a step's: its stack and shapes), then its capture (launched from Python, run by its replay)
        warm = set(runs)
        total = sum(runs.values())
        warmups = min(cuda_graphs.WARMUP * len(warm), total)
        per_run = mode.counts[kind] / total if total else 0
        out[kind] = {"runs": total, "graphs": len(runs), "launches_per_run": round(per_run),
                     "cuda_eager_launches": round(per_run * (warmups + len(runs))), "cuda_replays": total - warmups}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="11", help="hidden states of random:dinov2-small (each gives cls and mean)")
    ap.add_argument("--n-train", type=int, default=400)
    ap.add_argument("--n-eval", type=int, default=100)
    ap.add_argument("--families", default="linear,quadratic,dnn")
    args = ap.parse_args()
    torch.set_num_threads(1)
    got = count(args.layers, args.n_train, args.n_eval, args.families.split(","))
    stages = got["stages"]
    print(f"{got['row_sets']} row sets: operations that launch, by stage (eager on a GPU)")
    for stage in ("linear", "moments", "gradient", "validation", "scoring", "other"):
        print(f"  {stage:<11} {stages.get(stage, 0):>8,}")
    eager = sum(stages.get(s, 0) for s in ("linear", "moments", "gradient", "validation", "scoring", "other"))
    for kind in ("iteration", "step"):
        g = got[kind]
        print(f"  {kind + 's':<11} {g['runs']:>8,} runs of {g['launches_per_run']} operations, {g['graphs']} graphs: "
              f"on CUDA {g['cuda_eager_launches']:,} launched to warm up and capture, then {g['cuda_replays']:,} replays")
        eager += g["cuda_eager_launches"]
    print(f"  CUDA launches from Python, all told: ~{eager:,}")


if __name__ == "__main__":
    main()
