"""The tensor maths of an intervention on a subspace of patch tokens (no backbone knowledge).

Every kind changes only the component of each patch token in the subspace (P = B Bᵀ), so
(I − P)(h′ − h) = 0 up to float rounding, and works in place (a forward hook must change the
block's own output tensor: transformers records that object as `hidden_states[L]`).
- `shuffle` (uninformed): round(strength·N) patches of each image, drawn with a generator
  seeded by that image's seed, swap their subspace components by a random permutation.
- `inject` (informed, reads ground truth): with b = P·h, each object patch gets
  B_i = (1 − α)·(mean of b over its object's patches) + α·b_i; background (label 0) and
  ignored (−1) patches are unchanged. α = strength; α = 1 is the unchanged model.
- `remove`: h′ = h + s·P(mean − h): at s = 1 the component is the training mean's.
Identity strengths (shuffle 0, inject 1, remove 0) do nothing at all, so they are bitwise the base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from bench.core.errors import BenchError
from bench.core.intervention_specs import INTERVENTION_KINDS


@dataclass(frozen=True)
class Intervention:
    """What is done to the subspace: a kind, a strength in [0, 1] and the seed of `shuffle`'s draws."""

    kind: str
    strength: float
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in INTERVENTION_KINDS:
            raise BenchError(f"intervention: unknown kind {self.kind!r}; allowed: {', '.join(INTERVENTION_KINDS)}")
        if not (math.isfinite(self.strength) and 0.0 <= self.strength <= 1.0):
            raise BenchError(f"intervention: {self.kind} strength must be in [0, 1], got {self.strength}")

    @property
    def is_identity(self) -> bool:
        """Whether it leaves every token as it is (shuffle 0, inject 1, remove 0)."""
        return self.strength == (1.0 if self.kind == "inject" else 0.0)


def apply_intervention(patches: torch.Tensor, basis: torch.Tensor, mean: torch.Tensor, intervention: Intervention,
                       seeds: Sequence[int], labels: torch.Tensor | None = None) -> None:
    """Change patch tokens (B, N, D) in place along `basis` (D, r, orthonormal columns); `mean`
    (D,) is the subspace's training mean, `seeds` one per image, `labels` (B, N) the patches'
    instance ids (0 background, −1 ignored; `inject` needs them). Computed in float32."""
    if intervention.is_identity:
        return
    basis = basis.to(patches.device, torch.float32)
    coords = patches.float() @ basis  # (B, N, r)
    s = intervention.strength
    if intervention.kind == "shuffle":
        source = shuffle_sources(seeds, patches.shape[1], s).to(patches.device)
        delta = coords.gather(1, source[..., None].expand_as(coords)) - coords
    elif intervention.kind == "remove":
        delta = s * (mean.to(patches.device, torch.float32) @ basis - coords)
    else:
        if labels is None:
            raise BenchError("intervention: inject needs the patches' instance labels")
        delta = (1.0 - s) * (object_means(coords, labels) - coords)
        delta = delta * (labels.to(patches.device) > 0)[..., None]
    patches.add_((delta @ basis.T).to(patches.dtype))


def shuffle_sources(seeds: Sequence[int], n: int, strength: float) -> torch.Tensor:
    """(B, N) int64: the patch whose subspace component each patch takes (itself where unchosen);
    round(strength·N) chosen patches per image, permuted among themselves, seeded per image."""
    k = int(math.floor(strength * n + 0.5))
    out = torch.arange(n).repeat(len(seeds), 1)
    for row, seed in zip(out, seeds):
        g = torch.Generator().manual_seed(int(seed) % (1 << 63))
        chosen = torch.randperm(n, generator=g)[:k]
        row[chosen] = chosen[torch.randperm(k, generator=g)]
    return out


def object_means(coords: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, N, r): each patch's mean of `coords` over the patches of its image with its label.
    `labels` may stay on the host (the backbone builds them there): the number of ids is read
    from them before they move, so a device run never waits on a host read."""
    b, n, r = coords.shape
    k = int(labels.max()) + 2 if labels.numel() else 2  # ids ≥ -1, shifted by one
    labels = labels.to(coords.device)
    index = (torch.arange(b, device=coords.device)[:, None] * k + labels.long() + 1).reshape(-1)
    sums = torch.zeros(b * k, r, device=coords.device).index_add_(0, index, coords.reshape(-1, r))
    counts = torch.zeros(b * k, device=coords.device).index_add_(0, index, torch.ones_like(index, dtype=torch.float32))
    return (sums / counts.clamp(min=1.0)[:, None])[index].reshape(b, n, r)
