"""What an intervention's hook adds to extraction (issue 58 asks ≤ 10 %).

Generates a small ColorShape split, fits a random subspace of the model's middle layer (its
width only matters), then times, in one process and on the same scenes, the extraction of every
layer's patch tokens by the base backbone and by `intervene:shuffle=0.5` of it, each into a fresh
cache (`extract_activations`, the path every task takes), best of `--repeats` runs each; and the
bare forward passes (`hidden_states`) the same way. Prints the best time of each and the ratios.

    PYTHONPATH=. .venv/bin/python benchmarks/intervention.py --model random:dinov2-small --scenes 64
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.api import generate  # noqa: E402
from bench.core.dataset import Dataset  # noqa: E402
from evaluators.backbones import resolve_backbone  # noqa: E402
from evaluators.cache.extract import dataset_side, extract_activations, resolve_device  # noqa: E402
from evaluators.interventions.fit import fit_subspace  # noqa: E402
from evaluators.interventions.subspace import save_subspace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:dinov2-small")
    parser.add_argument("--scenes", type=int, default=64, help="Test scenes extracted per timing.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="fp32")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-intervention-"))
    data = generate("colorshape", out=root / "data", preset="small", workers=1,
                    overrides={"n_train": 16, "n_val": 4, "n_test": args.scenes})
    ds = Dataset(data)
    base = resolve_backbone(args.model)
    layer = base.info.n_layers // 2
    sub = fit_subspace(base, ds, layer, kind="random", rank=16, device=args.device, progress=False)
    spec = f"intervene:shuffle=0.5,layer={layer},subspace={save_subspace(sub, root / 'sub.npz')}:{args.model}"
    backbones = {"base": base, "intervened": resolve_backbone(spec).bind(ds)}

    def extraction(name: str, run: int) -> float:
        start = time.perf_counter()
        extract_activations(backbones[name], ds, "test", layers="all", token_choices=("all",), device=args.device,
                            dtype=args.dtype, cache_dir=root / f"cache-{name}-{run}", progress=False)
        return time.perf_counter() - start

    dev = resolve_device(args.device)
    side = backbones["base"].input_side(dataset_side(ds, "test"))
    rows = ds.table("test", list(backbones["intervened"].columns)).to_pylist()[:32]
    batch = {c: [r[c] for r in rows] for c in backbones["intervened"].columns}
    inputs = {name: bb.to(dev, args.dtype).prepare(batch, side) for name, bb in backbones.items()}

    def forward(name: str, run: int) -> float:
        start = time.perf_counter()
        for _ in range(3):
            backbones[name].hidden_states(inputs[name], list(range(base.info.n_layers + 1)))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for what, timed in (("extraction", extraction), ("forward", forward)):
        timed("base", -1), timed("intervened", -1)  # warm-up: first-call costs out of the comparison
        times: dict[str, list[float]] = {name: [] for name in backbones}
        for r in range(args.repeats):  # interleaved, so a burst of load on a shared machine hits both alike
            for name in backbones:
                times[name].append(timed(name, r))
        best = {name: min(t) for name, t in times.items()}
        print(f"{what:10s} {args.model} layer {layer}: base {best['base']:.3f} s, intervened "
              f"{best['intervened']:.3f} s, ratio {best['intervened'] / best['base']:.3f}")


if __name__ == "__main__":
    main()
