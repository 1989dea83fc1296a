"""`bench site` build time on 2,000 synthetic result rows.

Writes one results folder of a realistic study's shape: two binding datasets (8 backbones x 13
layers x 7 probe columns, with per-scene bits on 400 test scenes in 100 F codes, so ranks and the
paired matrix bootstrap real arrays, and validation numbers, so layers are chosen on validation),
one IsSameObject dataset (8 backbones x 13 layers x 4 probes) and a control, then times
`bench.api.site` from reading the folder to the last page and figure, against a 60 s target.

    .venv/bin/python benchmarks/site.py [--rows 2000] [--no-figures]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import api
from bench.core.results import provenance, write_run
from bench.core.tasks import DEFAULT_TASK, TASKS

TARGET_S = 60.0
BACKBONES = [f"random:vit-{k}" for k in range(8)]
LAYERS = range(13)
BINDING_COLUMNS = [(p, t) for p in ("linear", "quadratic", "dnn") for t in ("cls", "mean")] + [("attention", "all")]
ISSAMEOBJECT_PROBES = ("linear", "quadratic", "cosine", "majority")
#: The tasks of the synthetic rows: the default (binding) and the one that reads every patch token (pairs).
BINDING = DEFAULT_TASK
PAIRS = next(name for name, task in TASKS.items() if task.fixed_tokens)
N_SCENES, N_GROUPS, H_O_GIVEN_F = 400, 100, 20.0


def _row(run: str, backbone: str, dataset: str, layer: int, probe: str, tokens: str, task: str,
         **values: Any) -> dict[str, Any]:
    return {**provenance(run, "cpu", "bench evaluate ..."), "backbone": backbone, "dataset": dataset,
            "dataset_fingerprint": dataset * 4, "split": "test", "layer": layer, "n_layers": 12, "tokens": tokens,
            "task": task, "probe": probe, "seed": 0, "status": "ok", **values}


def synthetic_rows(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """At least `n` rows: binding datasets first (with a control), IsSameObject after, cycling datasets."""
    groups = np.repeat(np.arange(N_GROUPS), N_SCENES // N_GROUPS).astype(np.int32)
    ref = np.full(N_SCENES, H_O_GIVEN_F, np.float32)
    rows: list[dict[str, Any]] = []
    k = 0
    while len(rows) < n:
        k += 1
        for b, backbone in enumerate(BACKBONES + ["control"]):
            control = "resampled-o" if backbone == "control" else None
            for layer in LAYERS:
                for probe, tokens in BINDING_COLUMNS:
                    skill = 0.0 if control else 0.1 * b + 0.3 * np.sin(layer / 4)
                    bits = np.clip(H_O_GIVEN_F * (1 - skill) + rng.normal(0, 2, N_SCENES), 0, None).astype(np.float32)
                    beta = 1 - float(bits.mean()) / H_O_GIVEN_F
                    rows.append({**_row("r-bench", BACKBONES[0] if control else backbone, f"binding-{k}", layer, probe,
                                        tokens, BINDING),
                                 "control": control, "prior": "exact", "converged": True, "n_F_eff": float(N_GROUPS),
                                 "beta_star": beta, "beta_star_lo": beta - 0.02, "beta_star_hi": beta + 0.02,
                                 "H_F": 7.0, "H_O_given_F": H_O_GIVEN_F, "L_O_given_F": float(bits.mean()),
                                 "val_L_O_given_F": float(bits.mean()) + rng.normal(0, 0.1), "val_H_O_given_F": H_O_GIVEN_F,
                                 "val_L_F": 0.0, "val_H_F": 7.0, "sensitivity": 0.8, "sensitivity_lo": 0.7,
                                 "sensitivity_hi": 0.9, "scene_bits_O_given_F": bits, "scene_ref_O_given_F": ref,
                                 "scene_groups": groups})
        if len(rows) >= n:
            break
        for b, backbone in enumerate(BACKBONES):
            for layer in LAYERS:
                for probe in ISSAMEOBJECT_PROBES:
                    acc = 0.5 if probe == "majority" else 0.6 + 0.02 * b + 0.01 * layer
                    rows.append({**_row("r-bench", backbone, f"pairs-{k}", layer, probe, "all", PAIRS),
                                 "accuracy": acc, "accuracy_lo": acc - 0.01, "accuracy_hi": acc + 0.01,
                                 "val_accuracy": acc + rng.normal(0, 0.005), "majority_accuracy": 0.5})
    return rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--no-figures", action="store_true", help="leave the per-backbone figures out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results, out = Path(tmp) / "results", Path(tmp) / "site"
        rows = synthetic_rows(args.rows, np.random.default_rng(0))
        write_run(rows, results, "r-bench")
        t0 = time.perf_counter()
        files = api.site(results, out, figures=not args.no_figures)
        dt = time.perf_counter() - t0
        pages = sum(p.suffix == ".html" for p in files)
        print(f"site: {len(rows)} rows -> {pages} pages, {len(files)} files in {dt:.1f} s "
              f"(target {TARGET_S:.0f} s: {dt / TARGET_S:.2f} of it)")


if __name__ == "__main__":
    main()
