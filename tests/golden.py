"""The golden evaluation: a fixed set of rows whose numbers a refactor must not move.

It evaluates, at small size and on one torch thread, the oracles, raw pixels and
random:dinov2-small at two layers, with cls and all tokens, every binding family, the
IsSameObject probes and a control, and keeps every row's numbers: everything but what says
when, where and by what the row was made (`VOLATILE`). tests/test_golden.py re-runs it.

It runs in a process of its own with the CPU's numerical libraries on their portable code paths
(`PORTABLE`: MKL's AVX2 branch in its strict mode, ATen's and oneDNN's baseline kernels), so that
every processor of the writer's vendor gives the same bits (on MKL's compatible branch two Intel
Xeons did, one of them with AVX-512). Every number is then compared exactly.

A processor of another vendor still rounds a few sums differently on those paths (an AMD EPYC's
golden rows and an Intel Xeon's differed in 26 of 40 rows; MKL's branches are its vendor's), and at
this size (96 training scenes, 2 epochs) a fit's discrete choices — the strength validation picks,
the guard's fit-or-prior, the best epoch — amplify a last bit into a visible move. Those cells
cannot be made the same, so the writer also measures the rows with the libraries forced onto other
kernels (`ROUNDINGS`) and records, per cell, how far any of them moved it (`calibrate`); on another
vendor's processor a cell is compared within `SPREAD_FACTOR` times that spread (at least
`FLOOR`), and every other number to `FLOOR`. The README lists the columns that moved.

A change that moves numbers on purpose raises `PROBE_CODE_VERSION` (or the results schema),
and then regenerates the golden file (about 4 measurements; ~10 minutes on 2 cores):

    PYTHONPATH=$PWD python tests/golden.py --write
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
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
#: 4 % (a bound of random:dinov2-small), a validation-chosen strength with them. MKL's AVX2 branch
#: gives the same bits on every Intel processor that has AVX2 (MKL's promise; its compatible
#: branch does too, on every processor, but took 4.5 times as long: 287 s for this test), and its
#: strict mode makes them independent of the operands' memory alignment.
PORTABLE = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
#: Other kernels the writer forces the libraries onto, one at a time over `PORTABLE`, to find the
#: cells a processor's rounding moves (`calibrate`): MKL's compatible and AVX-512 branches and
#: ATen's vectorised kernels.
ROUNDINGS = ({"MKL_CBWR": "COMPATIBLE,STRICT"}, {"MKL_CBWR": "AVX512,STRICT"}, {"ATEN_CPU_CAPABILITY": "avx2"})
#: On another vendor's processor, a cell that a rounding moved is compared within this many times
#: its spread, and every number within `FLOOR` (relative, at least `FLOOR` absolute).
SPREAD_FACTOR = 2.0
FLOOR = 1e-6


def versions() -> dict[str, int]:
    """The versions whose raise says the numbers were meant to move."""
    from bench.core.results import RESULTS_SCHEMA_VERSION
    from evaluators.runner.planning import PROBE_CODE_VERSION

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


def vendor() -> str:
    """The processor's vendor (`GenuineIntel`, `AuthenticAMD`, ...): a processor of the writer's
    vendor gives the golden rows' bits on the portable paths, one of another does not."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def measure(rounding: dict[str, str] | None = None) -> dict[str, Any]:
    """`golden`, measured in a fresh process on the portable code paths (`PORTABLE`), with
    `rounding`'s variables over them (`ROUNDINGS`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "golden.json"
        path = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, **PORTABLE, **(rounding or {}), "PYTHONPATH": os.pathsep.join(path)}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure-here", str(out)], env=env, check=True)
        return json.loads(out.read_text())


def _distance(a: Any, b: Any) -> float | None:
    """How far two cells are apart: the largest absolute difference of their numbers (floats, or
    lists of them), 0 if equal, None if they differ otherwise (a string, a count, a choice)."""
    if a == b:
        return 0.0
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and all(
            isinstance(x, float) and isinstance(y, float) for x, y in zip(a, b)):
        return max(abs(x - y) for x, y in zip(a, b))
    return None


def calibrate(rows: list[dict[str, Any]], others: list[list[dict[str, Any]]]) -> dict[str, dict[str, float | bool]]:
    """Per row (its index, as a string) and cell, how far the rows measured under other kernels
    (`ROUNDINGS`) moved it: the largest distance, or True where a non-number moved."""
    spread: dict[str, dict[str, float | bool]] = {}
    for i, row in enumerate(rows):
        for other in others:
            for column, value in row.items():
                d = _distance(value, other[i].get(column))
                if d == 0.0:
                    continue
                mine = spread.setdefault(str(i), {})
                if d is None or mine.get(column) is True:
                    mine[column] = True
                else:
                    mine[column] = max(d, mine.get(column, 0.0))
    return spread


def moved(kept: dict[str, Any], now: dict[str, Any], exact: bool) -> list[str]:
    """The cells of `now`'s rows that moved from `kept`'s, each named with its values: every cell
    compared exactly where `exact`, else within the tolerance the writer's spread gives it (the
    module's docstring)."""
    out = []
    for i, (old, new) in enumerate(zip(kept["rows"], now["rows"])):
        spread = kept.get("spread", {}).get(str(i), {})
        for column in sorted(old.keys() | new.keys()):
            a, b = old.get(column), new.get(column)
            if a == b:
                continue
            allowed = spread.get(column, 0.0)
            d = _distance(a, b)
            if not exact and allowed is True:
                continue  # a choice that the writer's own roundings flipped: its numbers are compared instead
            if not exact and d is not None:
                scale = max((abs(x) for x in (a if isinstance(a, list) else [a])), default=0.0)
                if d <= max(SPREAD_FACTOR * allowed, FLOOR * scale, FLOOR):
                    continue
            where = f"{old['backbone']} {old['task']} layer {old['layer']} {old['tokens']} {old['probe']}"
            out.append(f"{where}: {column} {_short(a)} -> {_short(b)}"
                       + ("" if exact else f" (allowed {SPREAD_FACTOR} x {allowed} or {FLOOR} relative)"))
    return out


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        others = [measure(rounding)["rows"] for rounding in ROUNDINGS]
        kept = {**now, "vendor": vendor(), "spread": calibrate(now["rows"], others)}
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(kept, indent=1, sort_keys=True, allow_nan=False) + "\n")
        cells = sum(len(c) for c in kept["spread"].values())
        print(f"wrote {len(now['rows'])} rows to {GOLDEN} ({cells} cells that another kernel moved)")
        return 0
    kept = json.loads(GOLDEN.read_text())
    diff = moved(kept, now, exact=kept.get("vendor") == vendor())
    print("\n".join(diff) if diff else "identical")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
