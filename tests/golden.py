"""The golden evaluation: a fixed set of rows whose numbers a refactor must not move.

It evaluates, at small size and on one torch thread, the oracles, raw pixels and
random:dinov2-small at two layers, with cls and all tokens, every binding family, the
IsSameObject probes and a control, and keeps every row's numbers: everything but what says
when, where and by what the row was made (`VOLATILE`). tests/test_golden.py re-runs it and
asks for identical numbers.

It runs in a process of its own with the CPU's numerical libraries on their portable code paths
(`PORTABLE`), so that its numbers are those of any x86-64 machine, not of this one's vector unit.

A change that moves numbers on purpose raises `PROBE_CODE_VERSION` (or the results schema),
and then regenerates the golden file:

    PYTHONPATH=$PWD python tests/golden.py --write
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "tests" / "data" / "golden.json"
#: What says when, where and by what a row was made, not what it measured.
VOLATILE = ("run_id", "created_at", "wall_time_s", "command", "package_versions", "bench_version", "host", "device")
DATASET = dict(n_train=96, n_val=32, n_test=32, image_size=64, n_colors=3, n_shapes=3, colors_per_scene=2,
               shapes_per_scene=2, n_objects=3, object_size=12, margin=2, shard_size=64)
EPOCHS = 2
BINDING = "linear,quadratic,quadratic-shared,dnn"
#: (what, keyword arguments of `bench.api.evaluate`) per call (oracle:patches: the oracle with spatial tokens); every call writes into one results folder.
RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("pooled", dict(models=["oracle:objects", "oracle:features", "pixels"], tokens="cls", probes=BINDING)),
    ("spatial", dict(models=["oracle:patches", "pixels"], tokens="all", probes="attention")),
    ("dinov2", dict(models="random:dinov2-small", layers="6,12", tokens="cls", probes=BINDING)),
    ("dinov2-spatial", dict(models="random:dinov2-small", layers="6,12", tokens="all", probes="attention")),
    ("control", dict(models=["oracle:objects", "pixels"], tokens="cls", probes="linear,dnn", control="resampled-o")),
    ("issameobject", dict(models="random:dinov2-small", task="issameobject", layers="6",
                          probes="linear,diag-quadratic,quadratic,pointwise-identity,cosine,dot,distance,"
                                 "majority,attention-qk")),
    ("issameobject-pixels", dict(models="pixels", task="issameobject", probes="linear,quadratic,cosine")),
)


#: The numerical libraries' portable code paths, set before torch is imported. Left to choose, MKL,
#: ATen's kernels and oneDNN each take the widest vector unit the processor has and round sums in
#: its order: measured on an AVX-512 machine, the rows kept from an AVX2 one had moved by up to
#: 4 % (a bound of random:dinov2-small), a validation-chosen strength with them.
PORTABLE = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def versions() -> dict[str, int]:
    """The versions whose raise says the numbers were meant to move."""
    from bench.core.results import RESULTS_SCHEMA_VERSION
    from evaluators.planning import PROBE_CODE_VERSION

    return {"probe_code_version": PROBE_CODE_VERSION, "schema_version": RESULTS_SCHEMA_VERSION}


def _plain(value: Any) -> Any:
    """A column value as JSON keeps it exactly (NaN and infinities as strings, so JSON stays strict)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def evaluate(work: Path) -> list[dict[str, Any]]:
    """Every golden row, volatile columns left out, in key order."""
    import os

    import torch

    os.environ["BINDINGBENCH_CACHE"] = str(work / "cache")
    torch.set_num_threads(1)
    from bench import api
    from bench.core.results import KEY_COLUMNS, read_results

    data = api.generate("colorshape", out=work / "golden-data", preset="small", overrides=DATASET, workers=1)
    results = work / "results"
    for _, kwargs in RUNS:
        api.evaluate(dataset=data, epochs=EPOCHS, results=results, threads=1, **kwargs)
    rows = [{k: _plain(v) for k, v in r.items() if k not in VOLATILE} for r in read_results(results).to_pylist()]
    return sorted(rows, key=lambda r: json.dumps([r[c] for c in KEY_COLUMNS], default=str))


def golden(work: Path) -> dict[str, Any]:
    """The versions and the golden rows, measured in this process (`measure` runs it portably)."""
    return {**versions(), "rows": evaluate(work)}


def measure() -> dict[str, Any]:
    """`golden`, measured in a fresh process on the portable code paths (`PORTABLE`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "golden.json"
        path = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, **PORTABLE, "PYTHONPATH": os.pathsep.join(path)}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure-here", str(out)], env=env, check=True)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"regenerate {GOLDEN.relative_to(ROOT)}")
    parser.add_argument("--measure-here", type=Path, metavar="JSON", help=argparse.SUPPRESS)  # `measure`'s process
    args = parser.parse_args(argv)
    if args.measure_here:
        with tempfile.TemporaryDirectory() as tmp:
            args.measure_here.write_text(json.dumps(golden(Path(tmp)), allow_nan=False))
        return 0
    now = measure()
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(now, indent=1, sort_keys=True, allow_nan=False) + "\n")
        print(f"wrote {len(now['rows'])} rows to {GOLDEN}")
        return 0
    same = json.loads(GOLDEN.read_text()) == now
    print("identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
