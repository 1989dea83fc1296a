"""How this process's numerical libraries round: set before any of them runs.

torch's matrix products on a CPU are MKL's. Left to itself, MKL picks its kernels by the
processor and, on AVX-512 processors, splits a product between threads (and by the memory
alignment of its operands) in ways that round it differently: a DINOv2 forward pass on one
thread and on two gave activations that differed in ~29,000 of 30,000 values of its last layer
(measured on an Intel Xeon with AVX-512), so a stack fitted in a worker process, or a rerun on
another thread count, moved a row's numbers. MKL's conditional numerical reproducibility in its
strict mode (`MKL_CBWR=AUTO,STRICT`) keeps the kernels chosen for this processor (about 10 % slower
than unpinned, measured on that machine) and gives the same bits whatever the thread count and the
alignment. MKL reads the variable when it first runs, so it is set when `bench` (or any of its
layers) is imported, before torch is used; a value the user set is kept.

What it cannot pin is the processor: another vector unit still rounds differently, as every
floating-point library does. The numbers a fit's discrete choices then amplify are named, with the
tolerance the golden test allows them, in tests/golden.py and docs/explanation/same-numbers.md.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

#: MKL's reproducible mode on this processor's own kernels (see the module's docstring).
MKL_REPRODUCIBLE = "AUTO,STRICT"


def reproducible_numerics() -> None:
    """Ask MKL for its strict reproducible mode in this process and the processes it starts, unless
    the user chose a mode (`MKL_CBWR`). Cheap and torch-free, so every layer's import can call it."""
    os.environ.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)


#: `mkl_cbwr_get`'s answer for strict mode (MKL_CBWR_STRICT), and its question for the whole setting.
_STRICT, _ALL = 0x10000, -1


def mkl_is_reproducible() -> bool | None:
    """Whether the MKL inside torch runs in strict reproducible mode: None where torch is not
    imported yet or has no MKL (its CPU products are then not MKL's). False where MKL began before
    `reproducible_numerics` set its variable: a program that ran a torch product before importing
    bench, whose numbers may then depend on its thread count."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    return bool(get(_ALL) & _STRICT)
