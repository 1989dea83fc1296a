"""Batched LAPACK solves in which every matrix gets the numbers it gets alone.

A row set's numbers must not depend on its batch-mates (resume, Ray and skipped rows fit subsets
of a stack), but the CPU's LAPACK (MKL on AVX-512 processors) rounds a matrix by where it lies in
memory: torch copies a batch into one buffer, matrix i at i x (its size) from an aligned start,
and a matrix whose start is not on a 64-byte line takes another code path (`eigh` of odd widths,
`qr` of widths that are not a multiple of 16 floats: ~1e-7 apart, enough for an L-BFGS path to
part). Alone, a matrix starts the buffer, on the line. So where the matrices' size is not a
multiple of 64 bytes, each is solved alone; on CUDA and where the size is, the batch is one call.
"""

from __future__ import annotations

from typing import Callable

import torch

#: The memory line (bytes) a matrix must start on for LAPACK to round it as it rounds it alone.
LINE = 64


def eigh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.linalg.eigh` (eigenvalues, eigenvectors) of a batch (... x m x m)."""
    values, vectors = _alone(lambda a: tuple(torch.linalg.eigh(a)), x)
    return values, vectors


def qr_q(x: torch.Tensor) -> torch.Tensor:
    """The reduced Q of `torch.linalg.qr` of a batch (... x m x w)."""
    return _alone(lambda a: (torch.linalg.qr(a).Q,), x)[0]


def _alone(solve: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`solve(x)`, in one call where every matrix of the batch starts on a line (or off the CPU),
    else matrix by matrix and stacked."""
    if x.device.type != "cpu" or x.dim() < 3 or (x.shape[-2] * x.shape[-1] * x.element_size()) % LINE == 0:
        return solve(x)
    flat = x.reshape(-1, *x.shape[-2:])
    parts = [solve(m) for m in flat]
    return tuple(torch.stack(out).reshape(*x.shape[:-2], *out[0].shape) for out in zip(*parts))
