"""What CUDA's fitting path launches, counted on any machine (no GPU needed).

On a GPU the fit of small probes is bound by kernel launches, each a call from Python: an H200
sat 90 % idle. This runs the fit of linear, quadratic, dnn over the row sets of
`random:dinov2-small` through the path CUDA takes (stacked and graphed, dense class differences,
Gram–Schmidt), here eagerly on the CPU, and counts every tensor operation that is not a view (a GPU
launches a kernel or more for each) by stage. The steps CUDA replays from graphs
(`evaluators.fitting.cuda_graphs.GraphedStep`: the linear stage's L-BFGS iterations and each solve's start
and end, the moment stage's Gram–Schmidt, a stacked training step and validation pass) are counted apart, by the stage
that runs them: CUDA launches their operations only when it warms a graph up or captures it
(`WARMUP` runs, then one capture per graph), and one replay per run after.
Run it for 2 and 4 row sets: a stage whose count grows with the row sets launches per row set.

    PYTHONPATH=. python benchmarks/launches.py --layers 11          # 2 row sets (cls, mean)
    PYTHONPATH=. python benchmarks/launches.py --layers 10,11       # 4 row sets
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import evaluators.fitting as fitting  # noqa: E402
from benchmarks.gpu_fits import MODEL, extract, make_dataset  # noqa: E402
from evaluators.fitting import RowReader, TrainConfig, cuda_graphs, lbfgs, moments, stacked  # noqa: E402
from evaluators.fitting.stack import Stack, StepGraphs  # noqa: E402
from evaluators.tasks.binding import columns  # noqa: E402
from evaluators.tasks.binding.columns import evaluate_binding_sets  # noqa: E402
from evaluators.tasks.binding.task import binding_task  # noqa: E402

class Launches(TorchDispatchMode):
    """Counts the operations other than views (which launch nothing), per stage (set by `tagged`)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.where = ["host"]  # outside the fit: the probes built and copied for each row set, on the CPU

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
    graphs: dict[str, Counter] = {}  # per stage, runs per graph (its GraphedStep and key)
    ops: dict[str, Counter] = {}  # per stage, operations per graph, one run

    owners: dict[int, object] = {}  # every graph's owner kept alive, so that no other reuses its id

    def graphed_run(self, key, step, warm_key=None, on_fail=None):  # noqa: ANN001 — GraphedStep.run, counted
        stage, graph = mode.where[-1], (id(self), key)
        owners[id(self)] = self
        graphs.setdefault(stage, Counter())[graph] += 1
        before = mode.counts["graphed"]
        try:
            mode.tagged("graphed", step)()
        finally:
            ops.setdefault(stage, Counter())[graph] = mode.counts["graphed"] - before

    patches = [(fitting, name, stage) for stage, name in (("linear", "linear_stage"), ("moments", "moment_stage"),
                                                          ("gradient", "gradient_rounds"), ("scoring", "score_sets"))]
    patches.append((stacked, "validate_stacks", "validation"))
    patches.append((columns, "fit_row_sets", "other"))  # the fit's work outside its stages (what is outside the fit
    # runs on the host: CUDA's probes are built and copied on the CPU and moved to the device in the fit)
    saved = [(m, n, getattr(m, n)) for m, n, _ in patches] + [(cuda_graphs.GraphedStep, "run", cuda_graphs.GraphedStep.run),
                                                              (cuda_graphs.GraphedStep, "_on_side_stream",
                                                               cuda_graphs.GraphedStep._on_side_stream),
                                                              (Stack, "train_eagerly", Stack.train_eagerly),
                                                              (StepGraphs, "validation_bits",
                                                               StepGraphs.validation_bits)]
    train = Stack.train_eagerly

    def train_counted(self, x, *rest):  # noqa: ANN001 — a stack's step is graphed per batch shape on CUDA only
        graphed_run(self, tuple(x.shape), lambda: train(self, x, *rest))

    def validation_counted(self, key, bits, x):  # noqa: ANN001 — a validation chunk's pass, graphed on CUDA only
        out: list = []
        graphed_run(self, key, lambda: out.append(bits()))
        return out[0]
    devices = [(stacked, "STACKED_DEVICES"), (stacked, "GRAPHED_DEVICES"), (moments, "DENSE_DEVICES"),
               (moments, "GRAPHED_DEVICES"), (lbfgs, "GRAPHED_DEVICES")]
    saved += [(m, n, getattr(m, n)) for m, n in devices]
    try:
        for m, n, stage in patches:
            setattr(m, n, mode.tagged(stage, getattr(m, n)))
        cuda_graphs.GraphedStep.run = graphed_run
        cuda_graphs.GraphedStep._on_side_stream = lambda self, step: step()  # a warm-up (`call`'s first), here
        Stack.train_eagerly = train_counted
        StepGraphs.validation_bits = validation_counted
        for m, n in devices:
            setattr(m, n, ("cuda", "cpu"))
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            ds = make_dataset(root, n_train, n_eval, 64, 0)
            task = binding_task(ds)
            acts, _ = extract(MODEL, ds, n_sets_layers, ["cls", "mean"], "cpu", "fp32", root / "cache", 56)
            row_sets = [(layer, tokens) for layer in reversed(acts["train"].layers) for tokens in ("cls", "mean")]
            inputs = [{s: RowReader(a.get(layer, tokens)) for s, a in acts.items()} for layer, tokens in row_sets]
            with mode:
                evaluate_binding_sets(inputs, task, families, train=TrainConfig(device="cpu"), n_boot=50)
    finally:
        for m, n, v in saved:
            setattr(m, n, v)
    out = {"row_sets": len(row_sets), "stages": dict(mode.counts), "graphs": {}}
    for stage, runs in graphs.items():  # on CUDA, WARMUP eager runs per graph, then its capture (launched from
        # Python, run by its replay), then a replay per run
        total = sum(runs.values())
        warmups = sum(min(cuda_graphs.WARMUP, n) for n in runs.values())
        eager = sum(ops[stage][g] * (min(cuda_graphs.WARMUP, n) + (n > cuda_graphs.WARMUP)) for g, n in runs.items())
        out["graphs"][stage] = {"runs": total, "graphs": len(runs), "operations": sum(ops[stage].values()),
                                "cuda_eager_launches": eager, "cuda_replays": total - warmups}
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
    print(f"  (on the host, outside the fit: {stages.get('host', 0):,})")
    print("replayed from CUDA graphs, by stage:")
    for stage, g in got["graphs"].items():
        print(f"  {stage:<11} {g['runs']:>8,} runs of {g['graphs']} graphs ({g['operations']:,} operations one run "
              f"of each): on CUDA {g['cuda_eager_launches']:,} launched to warm up and capture, then "
              f"{g['cuda_replays']:,} replays")
        eager += g["cuda_eager_launches"] + g["cuda_replays"]
    print(f"CUDA launches from Python, all told: ~{eager:,}")

if __name__ == "__main__":
    main()
