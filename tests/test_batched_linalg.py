"""Batched eigen-solves and QR give every matrix the numbers it gets alone, wherever it lies in the
batch (on AVX-512 processors MKL rounds a matrix by its memory alignment: a row set's numbers
then depended on its place in a stack)."""

from __future__ import annotations

import pytest
import torch

from evaluators.fitting.batched_linalg import LINE, eigh, qr_q


@pytest.mark.parametrize("width", [7, 24, 89])
def test_eigh_of_each_matrix_is_its_eigh_alone(width, one_torch_thread):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(2, 3, 2 * width, width, generator=g)
    cov = x.transpose(-1, -2) @ x
    values, vectors = eigh(cov)
    assert values.shape == (2, 3, width) and vectors.shape == (2, 3, width, width)
    for i in range(2):
        for j in range(3):
            alone = torch.linalg.eigh(cov[i, j].clone())
            assert torch.equal(values[i, j], alone.eigenvalues) and torch.equal(vectors[i, j], alone.eigenvectors)


@pytest.mark.parametrize("rows,cols", [(10, 4), (89, 9), (24, 16)])
def test_qr_of_each_matrix_is_its_qr_alone(rows, cols, one_torch_thread):
    x = torch.randn(5, rows, cols, generator=torch.Generator().manual_seed(rows))
    q = qr_q(x)
    assert q.shape == (5, rows, cols)
    assert all(torch.equal(q[i], torch.linalg.qr(x[i].clone()).Q) for i in range(5))
    # (24, 16) lies on the line: one batched call, as torch makes it
    if rows * cols * 4 % LINE == 0:
        assert torch.equal(q, torch.linalg.qr(x).Q)
