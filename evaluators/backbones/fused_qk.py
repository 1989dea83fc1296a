"""Query/key projections cut out of a fused `qkv` (or `in_proj`) weight.

timm and OpenCLIP compute q, k and v with one (3D x D) matrix, and may normalise q and k
per head before the dot product. `AttentionQK` wants separate query and key modules that
map tokens (..., D) to (..., H*d_head); these slices do exactly the library's arithmetic.
"""

from __future__ import annotations

import math

import torch

from evaluators.backbones.base import AttentionQK


class HeadProjection(torch.nn.Module):
    """One third of a fused projection, then the per-head norm the library applies to it,
    times `factor` (folds an attention scale other than 1/sqrt(d_head) into the query)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, head_norm: torch.nn.Module,
                 n_heads: int, factor: float = 1.0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device)
        with torch.no_grad():
            self.linear.weight.copy_(weight)
            if bias is not None:
                self.linear.bias.copy_(bias)
        self.head_norm, self.n_heads, self.factor = head_norm, n_heads, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.head_norm(self.linear(x).unflatten(-1, (self.n_heads, -1)))
        return (h * self.factor if self.factor != 1.0 else h).flatten(-2)


def fused_attention_qk(norm: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None, n_heads: int,
                       q_norm: torch.nn.Module, k_norm: torch.nn.Module, scale: float) -> AttentionQK:
    """The AttentionQK of a block whose attention reads `norm(x)` through a fused q|k|v `weight`
    (3A x D, `bias` 3A), normalises heads with `q_norm`/`k_norm` and scales logits by `scale`."""
    a = weight.shape[0] // 3
    d_head = a // n_heads
    w, b = weight.detach().float(), None if bias is None else bias.detach().float()
    factor = float(scale) * math.sqrt(d_head)
    query = HeadProjection(w[:a], None if b is None else b[:a], q_norm, n_heads, factor)
    key = HeadProjection(w[a : 2 * a], None if b is None else b[a : 2 * a], k_norm, n_heads)
    return AttentionQK(norm, query.eval(), key.eval(), n_heads)
