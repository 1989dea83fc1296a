"""A planted network for interventions (issue 58): width 128, five blocks, where block 2 writes a
fixed code per instance rank into a 4-dimensional subspace S and later blocks read identity only
through S. Everything else in a token is foreground and position. Loaded as a `py:` backbone:

    py:tests/planted_binding.py:planted          the network
    py:tests/planted_binding.py:planted_zeroed   its twin with S zeroed (block 2 writes nothing)

Hidden state 3 (block 2's output) holds S, so the binding subspace is fitted at layer 3. It reads
the dataset's instance masks (`columns` has "mask"): a patch's instance is the one covering most
of it at the 8 x 8 grid of a 64 px image, its rank that instance's place among the scene's ids.
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bench.core.dataset import decode_mask
from evaluators.backbones.base import Backbone, BackboneInfo
from evaluators.tasks.issameobject.patch_labels import patch_labels

WIDTH, PATCH, SIDE, N_BLOCKS, S_RANK = 128, 8, 64, 5, 4
#: One rotation of the token space: S, position, the readout, the class token. Foreground is the
#: background's code in S: a clean foreground direction outside S would let a pair probe tell
#: objects from background without S, and the four object codes alone span only three directions.
ROTATION = np.linalg.qr(np.random.default_rng(58).standard_normal((WIDTH, WIDTH)))[0]
S_BASIS = ROTATION[:, :S_RANK]
POSITION, READOUT, CLS = ROTATION[:, 5:21], ROTATION[:, 21:37], ROTATION[:, 37]
#: The code of each instance rank in S, background (rank 0) included: the five vertices of a regular
#: simplex (equal norm 3, equally far apart), so S alone tells whether two patches are the same
#: instance, and the tokens vary in all four directions of S (four codes would span only three).
#: Ranks past 4 share the last code: scenes of up to four objects (`PLANTED_SCENES`).
MAX_RANK = S_RANK
_SIMPLEX = np.eye(S_RANK + 1) - 1.0 / (S_RANK + 1)
CODES = 3.0 * np.linalg.svd(_SIMPLEX)[0][:, :S_RANK] * np.sqrt((S_RANK + 1) / S_RANK)
#: Per-patch noise in S (std per direction): the probe must read every direction of S, not
#: the two or three that already separate noiseless codes.
JITTER = 0.75
#: ColorShape scenes it is meant for: 64 px, four objects of 14 px, each several 8 px patches.
PLANTED_SCENES = dict(image_size=64, n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=4,
                      object_size=14, margin=2, val_fraction=0.25, test_fraction=0.25)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, np.float32))


class Block(nn.Module):
    """Block 2 writes the rank codes (background's too) into S; block 3 reads S (only S) into the readout dimensions;
    the others pass their tokens on."""

    def __init__(self, index: int, zero_s: bool) -> None:
        super().__init__()
        self.index, self.zero_s = index, zero_s
        self.register_buffer("s", _t(S_BASIS))
        self.register_buffer("codes", _t(CODES @ S_BASIS.T))
        self.register_buffer("mix", _t(np.random.default_rng(3).standard_normal((S_RANK, 16))))
        self.register_buffer("readout", _t(READOUT))

    def forward(self, h: torch.Tensor, ranks: torch.Tensor, jitter: torch.Tensor) -> torch.Tensor:
        h = h.clone()
        if self.index == 2 and not self.zero_s:
            h[:, 1:] += self.codes[ranks] + jitter @ self.s.T
        elif self.index == 3:
            h[:, 1:] += torch.tanh(h[:, 1:] @ self.s @ self.mix) @ self.readout.T
        return h


class PlantedNet(nn.Module):
    def __init__(self, zero_s: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(i, zero_s) for i in range(N_BLOCKS))
        # a fixed random code per patch position: position is there, but near patches are not alike,
        # so a pair probe cannot guess "same object" from proximity instead of reading S
        n_patches = (SIDE // PATCH) ** 2
        freqs = np.random.default_rng(4).standard_normal((n_patches, POSITION.shape[1]))
        self.register_buffer("position", _t(freqs @ POSITION.T))
        self.register_buffer("cls", _t(CLS))

    def forward(self, ranks: torch.Tensor, jitter: torch.Tensor) -> torch.Tensor:
        patches = self.position.expand(len(ranks), -1, -1)
        h = torch.cat([self.cls.expand(len(ranks), 1, -1), patches], 1)
        for block in self.blocks:
            h = block(h, ranks, jitter)
        return h


class PlantedBackbone(Backbone):
    """The planted network as a backbone (hooks on its blocks collect the hidden states)."""

    columns = ("image", "mask")

    def __init__(self, zero_s: bool = False) -> None:
        self.zero_s = zero_s
        self.net = PlantedNet(zero_s).eval()
        self.info = BackboneInfo(spec="planted", family="planted", revision=f"planted-zero_s={zero_s}", n_params=0,
                                 patch_size=PATCH, input_size=SIDE, n_layers=N_BLOCKS, width=WIDTH, n_prefix=1,
                                 cls_index=0)

    def identity(self) -> dict[str, Any]:
        return {"family": "planted", "zero_s": self.zero_s}

    def native_side(self, dataset_side: int) -> int:
        return SIDE

    def prepare(self, rows: dict[str, list], side: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's instance rank, and its jitter in S (seeded by the scene's mask)."""
        ranks, jitter = [], []
        for m in rows["mask"]:
            mask = decode_mask(m)
            labels = patch_labels(mask, self.grid(side), min_share=0.0).ravel()
            ids = np.unique(labels[labels > 0])
            ranks.append(np.minimum(np.searchsorted(ids, labels) + 1, MAX_RANK) * (labels > 0))
            g = np.random.default_rng(zlib.crc32(mask.tobytes()))
            jitter.append(JITTER * g.standard_normal((len(labels), S_RANK)))
        return torch.from_numpy(np.stack(ranks).astype(np.int64)), _t(np.stack(jitter))

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        blocks = self.net.blocks
        hooks = [blocks[0].register_forward_pre_hook(lambda m, args: out.__setitem__(0, args[0]))]
        hooks += [blocks[i - 1].register_forward_hook(lambda m, args, y, i=i: out.__setitem__(i, y))
                  for i in range(1, N_BLOCKS + 1)]
        try:
            with torch.inference_mode():
                self.net(*(t.to(self.device) for t in inputs))
        finally:
            for h in hooks:
                h.remove()
        return [out[i] for i in layers]

    def to(self, device: torch.device, dtype: str) -> "PlantedBackbone":
        super().to(device, dtype)
        self.net.to(device)
        return self

    def blocks(self) -> nn.ModuleList:
        return self.net.blocks


def planted() -> PlantedBackbone:
    return PlantedBackbone(zero_s=False)


def planted_zeroed() -> PlantedBackbone:
    """The same network with S zeroed: block 2 writes no codes, so nothing reads identity."""
    return PlantedBackbone(zero_s=True)
