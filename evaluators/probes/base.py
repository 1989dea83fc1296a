"""What every binding probe shares (`Probe`): input standardisation, the linear autoregressive
context of earlier bits, the condition, and the linear part the linear stage solves; the
zero-initialised residual (`zero_residual`) and the autoregressive mask (`strictly_lower`); and a
target's code length under a probe added to its exact prior (`anchor`, `scene_bits`)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def zero_residual(layer: nn.Linear) -> nn.Linear:
    """A layer whose output reaches the logits, initialised at zero: the probe starts at its prior."""
    nn.init.zeros_(layer.weight)
    return layer


def strictly_lower(k: int) -> torch.Tensor:
    """Mask m[k, j] = 1 iff j < k: conditional k may only see earlier bits."""
    return torch.tril(torch.ones(k, k), diagonal=-1)


class Probe(nn.Module):
    """Shared parts: input standardisation, the linear autoregressive context, conditioning."""

    spatial = False
    #: The parameters of the probe's part that is linear in z (and in t_<k and the condition):
    #: `fit_probes` fits them first, by L-BFGS along an L2 path chosen on validation (a convex
    #: problem: no learning rate to tune, and every family starts from the same tuned linear
    #: probe). Names absent from a probe (a frozen context) are skipped. None: no linear stage.
    linear_names: tuple[str, ...] | None = ("w.weight", "bias", "context", "cond.weight")

    def linear_parameters(self) -> list[nn.Parameter]:
        """The parameters of the linear part (empty when the probe has no linear stage)."""
        names = set(self.linear_names or ())
        return [p for n, p in self.named_parameters() if n in names]

    def nonlinear_parameters(self) -> list[nn.Parameter]:
        """Everything the linear stage does not fit: what gradient training adds on top of it."""
        linear = {id(p) for p in self.linear_parameters()}
        return [p for p in self.parameters() if id(p) not in linear]

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0) -> None:
        super().__init__()
        self.in_dim, self.n_bits, self.cond_dim = in_dim, n_bits, cond_dim
        self.register_buffer("mu", torch.zeros(in_dim))
        self.register_buffer("sigma", torch.ones(in_dim))
        self.register_buffer("tril", strictly_lower(n_bits))
        self.context = nn.Parameter(torch.zeros(n_bits, n_bits))
        self.bias = nn.Parameter(torch.zeros(n_bits))
        self.cond = nn.Linear(cond_dim, n_bits, bias=False) if cond_dim else None
        if self.cond is not None:
            nn.init.zeros_(self.cond.weight)

    @property
    def trains_context(self) -> bool:
        """Whether the linear context of earlier bits is fitted (an anchored probe's is a zero buffer)."""
        return isinstance(self.context, nn.Parameter)

    def linear_design(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the standardised input the linear weights `w` read, the condition `cond` reads or None):
        the linear stage solves on these directly (`evaluators.fitting.linear_solver`)."""
        return (x - self.mu) / self.sigma, (cond if self.cond is not None else None)

    @torch.no_grad()
    def set_linear(self, w: torch.Tensor, bias: torch.Tensor, context: torch.Tensor | None,
                   cond: torch.Tensor | None) -> None:
        """Load the linear stage's solution (w: K x D, bias: K, context: K x K, cond: K x C)."""
        self.w.weight.copy_(w)
        self.bias.copy_(bias)
        if context is not None:
            self.context.copy_(context * self.tril)
        if cond is not None:
            self.cond.weight.copy_(cond)

    def set_standardization(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Standardise inputs with training statistics (constant dimensions are left as is)."""
        std = np.where(std > 1e-6, std, 1.0)
        self.mu.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.sigma.copy_(torch.as_tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        """All K conditional logits, teacher-forced on `target` (B x K in {0, 1})."""
        x = (x - self.mu) / self.sigma
        t = target.to(x.dtype)
        base = t @ (self.context * self.tril).T + self.bias
        if self.cond is not None:
            base = base + self.cond(cond)
        return base + self.readout(x, t, cond)

    def readout(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


def anchor(residual: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor:
    """Logits = prior logit + residual. A prior of ±inf is a bit the prior fixes: it stays ±inf
    (the residual cannot move it) and `scene_bits` charges it nothing."""
    if prior is None:
        return residual
    return torch.where(torch.isfinite(prior), prior + residual, prior)


def scene_bits(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-log2 q(t | z) per scene: the summed per-bit cross-entropy in bits.

    Infinite logits are bits fixed by an exact prior; the target always agrees with them
    (the priors check that every scene lies in its distribution's support), so they cost 0.
    """
    logits = logits.float()
    fixed = torch.isinf(logits)
    bce = F.binary_cross_entropy_with_logits(torch.where(fixed, 0.0, logits), target.float(), reduction="none")
    return torch.where(fixed, 0.0, bce).sum(-1) / math.log(2)
