"""Exact autoregressive priors throughput: `bit_priors` on the paper-scale balanced preset.

Draws every scene's object code with the generator's own sampler (no rendering), builds
the F / O arrays and a card like the one `bench generate` writes, then times
`generators.conditionals.bit_priors` per split (39,200 / 9,800 / 9,800 scenes, 8x8
features, 6 colours, 6 shapes, 18 objects) against the 60 s target. The first split
timed pays for filling the memoised counts.

    .venv/bin/python benchmarks/priors.py [--preset balanced] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np

from bench.core.dataset import SCHEMA_VERSION
from generators.base import build_config, config_to_dict, get_generator
from generators.engine import scene_seed

TARGET_S = 60.0


def card_and_codes(preset: str, scale: float) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A `dataset.json`-like card and each split's (F, O), drawn without rendering."""
    cls = get_generator("colorshape")
    base = build_config(cls, preset, {})
    sizes = {k: int(round(getattr(base, k) * scale)) for k in ("n_train", "n_val", "n_test")}
    gen = cls(build_config(cls, preset, sizes))
    space = gen.feature_space
    codes = {}
    for split, plan in gen.plans.items():
        O = np.zeros((plan.n, space.n_conjunctions), dtype=np.uint8)
        for i in range(plan.n):
            conjs, _f = gen.sample_conjunctions(random.Random(scene_seed(gen.config.seed, split, i)), split)
            O[i, conjs] = 1
        codes[split] = (space.o_to_f(O), O)
    card = {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": gen.name, "version": gen.version},
        "config": config_to_dict(gen.config),
        "seed": gen.config.seed,
        "feature_space": space.to_dict(),
        "splits": {s: {"n": p.n, **p.priors.to_dict()} for s, p in gen.plans.items()},
    }
    return card, codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="balanced")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the preset's scene counts")
    args = ap.parse_args()
    from generators.conditionals import bit_priors

    t0 = time.perf_counter()
    card, codes = card_and_codes(args.preset, args.scale)
    n_codes = sum(len(o) for _f, o in codes.values())
    print(f"drew {n_codes} object codes in {time.perf_counter() - t0:.1f} s (not timed)")
    total_t = 0.0
    total_n = 0
    for split, (F, O) in codes.items():
        t = time.perf_counter()
        pF, pO = bit_priors(card, split, F, O)
        dt = time.perf_counter() - t
        total_t += dt
        total_n += len(O)
        bits = -(np.log2(np.where(O == 1, pO, 1 - pO))).sum(axis=1)
        print(f"{split:5s}: {len(O):6d} scenes in {dt:6.2f} s ({len(O) / dt:7.0f} scenes/s), "
              f"mean -log2 q(O|F) = {bits.mean():.4f} bits (card H(O|F) = {card['splits'][split]['H_O_given_F']:.4f})")
    verdict = "meets" if total_t < TARGET_S else "misses"
    print(f"all splits: {total_n} scenes in {total_t:.2f} s ({total_n / total_t:.0f} scenes/s), "
          f"{verdict} the {TARGET_S:.0f} s target")


if __name__ == "__main__":
    main()
