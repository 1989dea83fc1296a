"""The binding families that read one pooled vector per scene: `linear`, `quadratic`,
`quadratic-shared` and `dnn` (MADE), and quadratic-shared's hook (`shared_factors`). The package's
docstring says how each reads z."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from evaluators.probes.base import Probe, zero_residual


def conjunction_factors(sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Shared-factor indices of each O bit: (first-group value, conjunction of the rest).

    With colour x shape this is (colour(k), shape(k)), the sharing `quadratic-shared` tests.
    """
    n_rest = math.prod(sizes[1:])
    conj = np.arange(math.prod(sizes))
    return conj // n_rest, conj % n_rest


def shared_factors(sizes: tuple[int, ...]) -> dict[str, Any]:
    """quadratic-shared's hook (`ProbeFamily.conjunction_args`): an O-probe shares its factors
    across the conjunctions of one first-group value and of one rest (`conjunction_factors`)."""
    return {"factors": conjunction_factors(sizes)}


class LinearProbe(Probe):
    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))

    def readout(self, x, t, cond):
        return self.w(x)


class QuadraticProbe(Probe):
    """Linear terms plus Σ_r s_kr (P_k x_k)_r² on x_k = [z, cond, t_<k] (symmetric, rank r)."""

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, rank: int = 8) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        self.rank = rank
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))
        self.pz = nn.Linear(in_dim, n_bits * rank, bias=False)
        self.pc = nn.Linear(cond_dim, n_bits * rank, bias=False) if cond_dim else None
        self.pt = nn.Parameter(torch.randn(n_bits, rank, n_bits) / math.sqrt(n_bits))
        self.s = nn.Parameter(torch.zeros(n_bits, rank))

    @torch.no_grad()
    def init_from_moments(self, directions: torch.Tensor) -> None:
        """Start each bit's projections on its most class-discriminative quadratic directions
        (K x r' x D unit vectors, `class_directions`): from random directions the quadratic
        term recovered 0 % of a planted quadratic teacher's bits at 2,000 scenes. The earlier bits'
        part of the projections starts at zero: random, it fitted training noise within two epochs
        (384-d planted teacher, 10,000 scenes: validation 6.6 -> 9.4 bits)."""
        r = min(self.rank, directions.shape[1])
        self.pz.weight.view(self.n_bits, self.rank, -1)[:, :r] = directions[:, :r]
        self.pt.zero_()

    def readout(self, x, t, cond):
        b, k, r = x.shape[0], self.n_bits, self.rank
        proj = self.pz(x).view(b, k, r)
        if self.pc is not None:
            proj = proj + self.pc(cond).view(b, k, r)
        proj = proj + torch.einsum("bj,krj->bkr", t, self.pt * self.tril[:, None, :])
        return self.w(x) + (self.s * proj.square()).sum(-1)


class SharedQuadraticProbe(Probe):
    """Linear terms plus zᵀ U_{a(k)}ᵀ V_{b(k)} z with factor tables shared across bits."""

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, rank: int = 8,
                 factors: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        a, b = factors if factors is not None else (np.arange(n_bits), np.arange(n_bits))
        self.register_buffer("fa", torch.as_tensor(np.asarray(a), dtype=torch.long))
        self.register_buffer("fb", torch.as_tensor(np.asarray(b), dtype=torch.long))
        self.n_a, self.n_b, self.rank = int(self.fa.max()) + 1, int(self.fb.max()) + 1, rank
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))
        self.u = nn.Linear(in_dim, self.n_a * rank, bias=False)
        self.v = zero_residual(nn.Linear(in_dim, self.n_b * rank, bias=False))

    @torch.no_grad()
    def init_from_moments(self, directions: torch.Tensor) -> None:
        """Start each first-group factor U_a on the leading class-discriminative directions of
        its bits (`class_directions`, K x r' x D), taken over the bits that share it; the rest of
        the factor is zero, as the quadratic family's unconfirmed directions are."""
        r = min(self.rank, directions.shape[1])
        table = self.u.weight.view(self.n_a, self.rank, -1)
        for a in range(self.n_a):
            mine = directions[self.fa == a, :r]  # bits x r x D
            flat = mine.reshape(-1, mine.shape[-1])
            _, values, vh = torch.linalg.svd(flat, full_matrices=False)
            top = vh[:r][values[:r] > 1e-6]  # none where no direction was confirmed
            table[a] = 0.0  # a factor without a direction stays off (its V starts at zero too)
            table[a, : len(top)] = top

    def readout(self, x, t, cond):
        b = x.shape[0]
        uz = self.u(x).view(b, self.n_a, self.rank)[:, self.fa]
        vz = self.v(x).view(b, self.n_b, self.rank)[:, self.fb]
        return self.w(x) + (uz * vz).sum(-1) / math.sqrt(self.rank)


class MadeProbe(Probe):
    """One masked autoregressive network for all K conditionals (MADE) on an unmasked trunk.

    The trunk reads [z, cond] (degree 0: every head may use it). A masked hidden layer
    mixes trunk features with t: unit h has degree m_h, sees t_j iff j < m_h and feeds
    head k iff m_h <= k, so head k depends on t_j only for j < k. Heads also read the
    trunk directly, so early bits (few masked units) keep the full capacity on z.
    """

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, hidden: int = 256, depth: int = 1) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        layers: list[nn.Module] = []
        width = in_dim + cond_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        self.trunk = nn.Sequential(*layers)
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))  # the linear stage's part
        self.head = zero_residual(nn.Linear(hidden, n_bits, bias=False))
        degree = torch.arange(hidden) * n_bits // hidden  # 0..K-1, evenly spread
        self.register_buffer("mask_in", (torch.arange(n_bits)[None, :] < degree[:, None]).float())
        self.register_buffer("mask_out", (degree[None, :] <= torch.arange(n_bits)[:, None]).float())
        self.made_z = nn.Linear(hidden, hidden)
        self.made_t = nn.Parameter(torch.randn(hidden, n_bits) / math.sqrt(n_bits))
        self.made_out = nn.Parameter(torch.zeros(n_bits, hidden))

    def readout(self, x, t, cond):
        h = self.trunk(torch.cat([x, cond], dim=-1) if self.cond_dim else x)
        m = F.gelu(self.made_z(h) + t @ (self.made_t * self.mask_in).T)
        return self.w(x) + self.head(h) + m @ (self.made_out * self.mask_out).T
