"""The same rows whatever kernels the processor's numerical libraries pick (issue 56): numpy's
OpenBLAS picks its kernels by the processor (SkylakeX on an AVX-512 Xeon, Haswell on an AVX2
machine), so nothing a row reports may pass through it; MKL's own choice is pinned by
`bench.core.numerics`, and a sum in a fixed order is the same bits on any of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.golden import VOLATILE
from tests.helpers import TINY_SCENES, make_dataset

ROOT = Path(__file__).resolve().parents[1]

#: Runs `bench` with the arguments given after printing the kernel numpy's OpenBLAS runs (from
#: threadpoolctl, so that a core type the library ignored cannot pass for a forced one).
_EVALUATE = """
import json, sys, numpy, threadpoolctl
blas = [i for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas" and "numpy" in i["filepath"]]
print(json.dumps(blas[0]["architecture"]), file=sys.stderr)
from bench.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _core_types() -> tuple[str, str]:
    """Two OpenBLAS core types this processor runs: AVX-512's and AVX2's where it has AVX-512."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return ("SkylakeX", "Haswell") if " avx512f" in flags else ("Haswell", "Sandybridge")


def _rows(results: Path) -> list[dict]:
    rows = [r for path in sorted(results.glob("*.parquet")) for r in pq.read_table(path).to_pylist()]
    return sorted(({k: v for k, v in r.items() if k not in VOLATILE} for r in rows),
                  key=lambda r: json.dumps([r["task"], r["layer"], r["tokens"], r["probe"]]))


def test_fixed_order_sums_add_in_index_order():
    """The bootstrap's weighted sums: each output is its products added in index order, the bits a
    plain loop gives (a BLAS product adds them in its kernel's order)."""
    from evaluators.tasks.binding.metrics import _fixed_order_sums

    rng = np.random.default_rng(0)
    weights = rng.integers(0, 4, (37, 300)).astype(np.float64)
    values = rng.random((300, 5)) * 30
    got = _fixed_order_sums(weights, values, block_bytes=4096)  # several blocks of rows
    for i in (0, 17, 36):
        for j in range(values.shape[1]):
            total = 0.0
            for g in range(values.shape[0]):
                total += weights[i, g] * values[g, j]
            assert got[i, j] == total


@pytest.mark.slow
def test_rows_are_the_same_under_both_openblas_core_types(tmp_path):
    """`bench evaluate` in a plain environment (nothing pinned but what bench pins itself) writes
    the same rows whichever kernels numpy's OpenBLAS runs: the binding task's intervals (the
    bootstrap) and IsSameObject's attention correlation, which read numpy's BLAS before."""
    data = make_dataset(tmp_path / "ds", n_train=48, n_val=16, n_test=16, **TINY_SCENES)
    runs = {}
    for core in _core_types():
        results = tmp_path / f"results-{core}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "MKL_", "ATEN_", "ONEDNN_"))}
        env.update(OPENBLAS_CORETYPE=core, BINDINGBENCH_CACHE=str(tmp_path / f"cache-{core}"),
                   PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        for task, probes in (("binding", "linear"), ("issameobject", "linear,cosine")):
            proc = subprocess.run([sys.executable, "-c", _EVALUATE, "evaluate", "--model", "random:dinov2-small",
                                   "--image-size", "28", "--dataset", str(data), "--task", task, "--layers", "6",
                                   "--probes", probes, "--epochs", "2", "--threads", "1", "--results", str(results)],
                                  capture_output=True, text=True, env=env, timeout=1800)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert json.loads(proc.stderr.splitlines()[0]).lower() == core.lower(), proc.stderr.splitlines()[0]
        runs[core] = _rows(results)
    first, second = runs.values()
    assert len(first) == 3 and any(r["attention_r"] is not None for r in first)  # binding linear; linear, cosine
    for a, b in zip(first, second):
        assert a == b, sorted(k for k in a if a[k] != b.get(k))
