"""Calibration table: β* (anchored chain rule) beside β*_paper (the paper's two unanchored
probes) for backbones whose binding information is known, at two training-set sizes.

The truth is known for the oracles (oracle:features 0, oracle:objects 1, oracle:mix-q the
test split's mixed share of H(O|F), q in expectation)
and the controls carry none worth reading (pixels, random:dinov2-small): the table shows
how far each estimator sits from it, per probe family, with 95% intervals over test F
codes. The zero of β* must not move with the training-set size; β*_paper's does.

    .venv/bin/python benchmarks/calibration.py [--sizes 500,2000] [--families linear,quadratic,quadratic-shared,dnn]
        [--models oracle:features,oracle:objects,oracle:mix-0.5,pixels,random:dinov2-small] [--out DIR]
        [--control | --only-control] [--attention pixels,oracle:patches]

`--control` adds every backbone under the control null (each scene's O redrawn from p(O|F): truth 0
for any backbone), `--only-control` measures it alone; `--attention` measures those backbones' patch tokens with the attention family.
Each row also gives the probe's sensitivity (the share of a planted binding it recovers).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.core.dataset import Dataset  # noqa: E402
from evaluators.backbones.ground_truth import mixed_share  # noqa: E402
from evaluators.cache.extract import extract_activations  # noqa: E402
from evaluators.tasks.binding.metrics import metric_checks  # noqa: E402
from evaluators.tasks.binding.columns import evaluate_binding  # noqa: E402
from evaluators.tasks.binding.task import SPLITS, binding_task  # noqa: E402
from evaluators.fitting import RowReader, TrainConfig  # noqa: E402
from generators.base import build_config, get_generator  # noqa: E402
from generators.engine import generate  # noqa: E402

TRUTH = {"oracle:features": 0.0, "oracle:objects": 1.0}


def _interval(m: dict, key: str) -> str:
    if m.get(key) is None:
        return "—"
    flag = " ‡" if metric_checks(m, key) else ""
    return f"{100 * m[key]:+.1f} [{100 * m[f'{key}_lo']:+.1f}, {100 * m[f'{key}_hi']:+.1f}]{flag}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="500,2000")
    ap.add_argument("--families", default="linear,quadratic,quadratic-shared,dnn")
    ap.add_argument("--models", default="oracle:features,oracle:objects,oracle:mix-0.5,pixels,random:dinov2-small")
    ap.add_argument("--out", type=Path, default=None, help="keep the dataset here (default: a temp dir)")
    ap.add_argument("--control", action="store_true", help="also measure every backbone under the control null")
    ap.add_argument("--only-control", action="store_true", help="measure every backbone under the control null only")
    ap.add_argument("--attention", default="", help="backbones whose patch tokens the attention family reads")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    families = args.families.split(",")
    torch.set_num_threads(1)
    root = args.out or Path(tempfile.mkdtemp(prefix="bindingbench-calibration-"))
    data = root / "balanced"
    if not (data / "dataset.json").exists():
        gen = get_generator("colorshape")
        generate(gen, build_config(gen, "balanced", dict(n_train=max(sizes), n_val=500, n_test=500, image_size=128)),
                 data)
    ds = Dataset(data)
    tasks = {None: binding_task(ds)}
    full = tasks[None]
    if args.control or args.only_control:
        tasks["resampled-o"] = binding_task(ds, control="resampled-o")
    if args.only_control:
        del tasks[None]
    print(f"balanced preset at 128 px, test {len(full.codes['test'][0])} scenes, "
          f"n_F_eff {full.n_F_eff:.0f}, H(O|F) {full.ref_O_given_F.mean():.2f} bits\n")
    print("| backbone | control | truth % | n_train | probe | β* % [95% CI] | β*_paper % [95% CI] | sensitivity % | "
          "β_F % | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    runs = [(spec, "cls", families) for spec in args.models.split(",")]
    runs += [(spec, "all", ["attention"]) for spec in (args.attention.split(",") if args.attention else [])]
    for spec, tokens, fams in runs:
        acts = {s: extract_activations(spec, ds, s, layers="last", token_choices=(tokens,), progress=False)
                for s in SPLITS}
        for control, whole in tasks.items():
            for n in sizes:
                task = whole.first_train(n)
                inputs = {s: RowReader(a.get(a.layers[0], tokens), n if s == "train" else None)
                          for s, a in acts.items()}
                t0 = time.perf_counter()
                results = evaluate_binding(inputs, task, fams, train=TrainConfig(), n_boot=1000)
                wall = time.perf_counter() - t0
                truth = 0.0 if control else TRUTH.get(spec, mixed_share(ds, spec) if spec.startswith("oracle:mix-")
                                                      else None)
                for fam, r in results.items():
                    m = r.metrics
                    sens = "—" if m.get("sensitivity") is None else \
                        f"{100 * m['sensitivity']:.0f} [{100 * m['sensitivity_lo']:.0f}, {100 * m['sensitivity_hi']:.0f}]"
                    print(f"| {spec} ({tokens}) | {control or '—'} | "
                          f"{'—' if truth is None else f'{100 * truth:.1f}'} | "
                          f"{n} | {fam} | {_interval(m, 'beta_star')} | {_interval(m, 'beta_star_paper')} | {sens} | "
                          f"{100 * m['beta_F']:.1f} | {wall / len(fams):.0f} |", flush=True)

if __name__ == "__main__":
    main()
