"""What every backbone provides to the extractor, and its metadata record.

A backbone turns a batch of dataset rows into token sequences, one per requested
hidden-state index. Learned backbones read the image; the `pixels` and `oracle`
baselines read pixels or ground truth directly. Splitting the work into `prepare`
(CPU, runs in a loader thread: decoding, resizing) and `hidden_states` (the
forward pass) is what lets extraction overlap input work with compute.
"""

from __future__ import annotations

import copy
import io
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from bench.core.errors import BenchError
from evaluators.backbones.info import BackboneInfo

RESOLUTIONS = ("native", "match-grid")
#: `match-grid` feeds every model the dataset's 16-px patch grid (side / 16 patches per side).
MATCH_GRID_PATCH = 16


@dataclass(frozen=True)
class AttentionQK:
    """What one transformer block does to its input before the attention softmax: the
    pre-attention norm and the query/key projections (biases included), `n_heads` heads.

    `pair_scores` is the block's own attention logit between two tokens, symmetrised and
    averaged over heads: mean_h (q_h(n(x))·k_h(n(y)) + q_h(n(y))·k_h(n(x))) / 2 / sqrt(d_head).
    """

    norm: torch.nn.Module
    query: torch.nn.Module
    key: torch.nn.Module
    n_heads: int

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head queries and keys (..., H, d_head) of tokens (..., D)."""
        h = self.norm(x)
        return self.query(h).unflatten(-1, (self.n_heads, -1)), self.key(h).unflatten(-1, (self.n_heads, -1))

    def pair_scores(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Symmetrised, head-averaged attention logits of token pairs (P, D) x (P, D) -> (P,)."""
        qx, kx = self.project(x)
        qy, ky = self.project(y)
        logits = ((qx * ky).sum(-1) + (qy * kx).sum(-1)) / (2 * math.sqrt(qx.shape[-1]))
        return logits.mean(-1)

    def copy_to(self, device: torch.device | str) -> "AttentionQK":
        """A float32 copy on `device` (the backbone's own modules stay where they are)."""
        def move(m: torch.nn.Module) -> torch.nn.Module:
            return copy.deepcopy(m).to(device=device, dtype=torch.float32).eval().requires_grad_(False)

        return AttentionQK(move(self.norm), move(self.query), move(self.key), self.n_heads)


class Backbone(ABC):
    """A resolved backbone: metadata, input preparation and the forward pass."""

    info: BackboneInfo
    #: dataset columns `prepare` reads.
    columns: tuple[str, ...] = ("image",)
    device: torch.device = torch.device("cpu")
    dtype: str = "fp32"

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Everything about the backbone that changes its numbers (weights hash, preprocessing)."""

    @abstractmethod
    def prepare(self, rows: dict[str, list], side: int) -> Any:
        """Model inputs for a batch of rows (column -> values); runs off the main thread."""

    @abstractmethod
    def hidden_states(self, inputs: Any, layers: Sequence[int]) -> list[torch.Tensor]:
        """Tokens (B x T x D, prefix tokens first) of each requested hidden-state index."""

    def attention_qk(self, layer: int) -> AttentionQK | None:
        """The norm and query/key projections of block `layer`, the block that reads hidden
        state `layer` (the `attention-qk` IsSameObject baseline). None when the backbone
        exposes no such weights (pixels, oracles); a BenchError for a hidden state no block
        reads (the last one)."""
        return None

    def loaded(self) -> "Backbone":
        """The backbone that runs: itself (a `recorded.RecordedBackbone` builds its model now)."""
        return self

    def bind(self, dataset: Any) -> "Backbone":
        """Adapt to a dataset (ground-truth backbones take their width from its feature space)."""
        return self

    def to(self, device: torch.device, dtype: str) -> "Backbone":
        self.device, self.dtype = device, dtype
        return self

    def input_side(self, dataset_side: int, resolution: str = "native", image_size: int | None = None) -> int:
        """Input image side under a resolution policy (docs/explanation/architecture.md §2): native,
        explicit, or match-grid."""
        if resolution not in RESOLUTIONS:
            raise BenchError(f"resolution: unknown {resolution!r}; allowed: {', '.join(RESOLUTIONS)}")
        if image_size is not None and image_size <= 0:  # 0 would silently read as "native"
            raise BenchError(f"image_size: must be > 0 px, got {image_size}")
        patch = self.info.patch_size
        if resolution == "match-grid":
            ref = image_size or dataset_side
            if ref % MATCH_GRID_PATCH:
                raise BenchError(f"image_size: match-grid needs a multiple of {MATCH_GRID_PATCH} px, got {ref}")
            side = ref // MATCH_GRID_PATCH * (patch or MATCH_GRID_PATCH)
        else:
            side = image_size or self.native_side(dataset_side)
        if side <= 0:
            raise BenchError(f"image_size: must be > 0, got {side}")
        if patch and side % patch:
            raise BenchError(f"image_size: {side} px is not a multiple of {self.info.spec}'s patch size {patch}")
        return side

    def native_side(self, dataset_side: int) -> int:
        return self.info.input_size

    def grid(self, side: int) -> tuple[int, int] | None:
        """Spatial token grid at an input side (None when there are no spatial tokens)."""
        p = self.info.patch_size
        return (side // p, side // p) if p else None


def decode_resized(image: dict | bytes, side: int, resample: int) -> np.ndarray:
    """RGB pixels (side x side x 3 uint8) of a PNG cell, resized with a PIL filter code when needed."""
    data = image["bytes"] if isinstance(image, dict) else image
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        if im.size != (side, side):
            im = im.resize((side, side), resample=Image.Resampling(resample))
        return np.asarray(im)
