"""What fitting the binding probes of a backbone costs: one row set, then every row set.

Generates the balanced small preset (2,000/500/500 scenes by default), extracts a backbone's
activations once (cached), and times `evaluate_binding` — every requested family fitted
together, as `bench evaluate` fits them — first on one row set (the last layer, cls), then on
every (layer, tokens) row set of `--layers`/`--tokens` in the stacks `bench evaluate` makes
(`evaluate_binding_sets`, `row_sets_per_stack`: one row set per stack on a CPU; `--stack`: all
of them as one; row set after row set on a checkout from before stacks). It uses only functions that every
checkout since 48c4706 has, so two checkouts compare side by side on one machine:

    PYTHONPATH=OTHER_CHECKOUT .venv/bin/python benchmarks/fit.py --one-only
    .venv/bin/python benchmarks/fit.py

Prints CPU and wall seconds per row set with each family's β*, and peak RSS. One torch thread
unless `--threads`.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

# After PYTHONPATH's entries, so that `PYTHONPATH=OTHER_CHECKOUT` times that checkout's probes.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.core.dataset import Dataset  # noqa: E402
from benchmarks.older_layouts import (RowReader, TrainConfig, binding_task, evaluate_binding,  # noqa: E402
                                      evaluate_binding_sets, extract_activations,
                                      row_sets_per_stack)  # wherever the checkout timed keeps them
from evaluators.backbones import resolve_backbone  # noqa: E402
from generators.base import build_config, get_generator  # noqa: E402
from generators.engine import generate  # noqa: E402

SPLITS = ("train", "val", "test")


def dataset(root: Path, n_train: int, n_eval: int, seed: int) -> Dataset:
    """The small preset at `n_train`/`n_eval`/`n_eval` scenes (made once per root)."""
    path = root / f"small-{n_train}-{n_eval}-{seed}"
    if not (path / "dataset.json").exists():
        gen = get_generator("colorshape")
        generate(gen, build_config(gen, "small", {"n_train": n_train, "n_val": n_eval, "n_test": n_eval, "seed": seed}),
                 path)
    return Dataset(path)


def fit(acts: dict, task, layer: int, tokens: str, families: list[str]) -> tuple[float, float, dict]:
    """(CPU s, wall s, β* per family) of one row set."""
    inputs = {s: RowReader(a.get(layer, tokens)) for s, a in acts.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    res = evaluate_binding(inputs, task, families, train=TrainConfig(), n_boot=200)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    return cpu, wall, {f: r.metrics.get("beta_star", float("nan")) for f, r in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:dinov2-small")
    ap.add_argument("--image-size", type=int, default=56)
    ap.add_argument("--families", default="linear,quadratic,dnn")
    ap.add_argument("--layers", default="all")
    ap.add_argument("--tokens", default="cls,mean")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one-only", action="store_true", help="time the single row set only")
    ap.add_argument("--stack", action="store_true", help="fit every row set as one stack, whatever the device")
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "bench-fit"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    families = args.families.split(",")
    token_choices = args.tokens.split(",")
    ds = dataset(Path(args.root), args.n_train, args.n_eval, args.seed)
    backbone = resolve_backbone(args.model, image_size=args.image_size) if args.image_size else args.model
    acts = {s: extract_activations(backbone, ds, s, layers=args.layers, token_choices=token_choices, progress=False)
            for s in SPLITS}
    task = binding_task(ds)
    layers = list(acts["train"].layers)
    print(f"{args.model} at {args.image_size or 'native'} px, {args.n_train}/{args.n_eval}/{args.n_eval} scenes, "
          f"families {args.families}, {args.threads} thread(s)")
    cpu, wall, beta = fit(acts, task, layers[-1], token_choices[0], families)
    print(f"one row set (layer {layers[-1]}, {token_choices[0]}): {cpu:.1f} s CPU, {wall:.1f} s wall; β* "
          + ", ".join(f"{f} {b:.4f}" for f, b in beta.items()), flush=True)
    if not args.one_only and evaluate_binding_sets is not None:
        row_sets = [(layer, tokens) for layer in layers for tokens in token_choices]
        inputs = [{s: RowReader(a.get(layer, tokens)) for s, a in acts.items()} for layer, tokens in row_sets]
        train = inputs[0]["train"]
        per_stack = len(row_sets) if args.stack else \
            row_sets_per_stack(len(train), train.row_shape, task.codes["train"][1].shape[1], "cpu")
        t0, c0 = time.perf_counter(), time.process_time()
        results = [r for i in range(0, len(inputs), per_stack)
                   for r in evaluate_binding_sets(inputs[i : i + per_stack], task, families, train=TrainConfig(),
                                                  n_boot=200)]
        total_cpu, total_wall = time.process_time() - c0, time.perf_counter() - t0
        for (layer, tokens), res in zip(row_sets, results):
            print(f"  layer {layer:2d} {tokens:4s}  β* "
                  + ", ".join(f"{f} {r.metrics.get('beta_star', float('nan')):.4f}" for f, r in res.items()),
                  flush=True)
        print(f"all {len(row_sets)} row sets, {per_stack} per stack: {total_cpu:.1f} s CPU, {total_wall:.1f} s wall "
              f"({total_cpu / cpu:.1f}x one row set)")
    elif not args.one_only:  # a checkout from before stacking: one row set after another
        total_cpu, total_wall = 0.0, 0.0
        for layer in layers:
            for tokens in token_choices:
                c, w, beta = fit(acts, task, layer, tokens, families)
                total_cpu, total_wall = total_cpu + c, total_wall + w
                print(f"  layer {layer:2d} {tokens:4s} {c:6.1f} s CPU  β* "
                      + ", ".join(f"{f} {b:.4f}" for f, b in beta.items()), flush=True)
        print(f"all {len(layers) * len(token_choices)} row sets: {total_cpu:.1f} s CPU, {total_wall:.1f} s wall "
              f"({total_cpu / cpu:.1f}x one row set)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
