"""Backbones that need no learning: raw pixels, and oracles that read the ground truth.

Their binding information is known analytically, which makes them the probes'
calibration targets: `oracle:objects` carries all of O, `oracle:features` only F
(zero binding), `oracle:mix-q` carries O for a q fraction of scenes (β* = q), and
`oracle:patches` carries every object's attributes where it is drawn, plus a
per-patch background flag.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from bench.core.codes import FeatureSpace
from bench.core.dataset import decode_mask
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from evaluators.backbones.base import Backbone, decode_resized
from evaluators.backbones.info import (ORACLE_PATCH, VERSION, ground_truth_info, oracle_info, oracle_kind, pixels_info,
                                        pixels_patch)

def _with_cls(spatial: np.ndarray) -> torch.Tensor:
    """Prefix the CLS token (mean of the spatial tokens) to B x T x D tokens."""
    spatial = spatial.astype(np.float32, copy=False)
    return torch.from_numpy(np.concatenate([spatial.mean(axis=1, keepdims=True), spatial], axis=1))


class GroundTruthBackbone(Backbone):
    """Tokens are computed in `prepare`; the "forward pass" only hands them over (layer 0)."""

    def identity(self) -> dict[str, Any]:
        return {"family": self.info.family, "spec": self.info.spec, "version": VERSION}

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        return [inputs for _ in layers]


class PixelsBackbone(GroundTruthBackbone):
    """`pixels[:P]`: each P x P patch's RGB values (row-major, channel last) in [0, 1]; CLS = mean token."""

    def __init__(self, spec: str, patch: int) -> None:
        self.info = pixels_info(spec, patch)
        self.patch = patch

    def native_side(self, dataset_side: int) -> int:
        return dataset_side

    def prepare(self, rows: dict[str, list], side: int) -> torch.Tensor:
        x = np.stack([decode_resized(im, side, 2) for im in rows["image"]]).astype(np.float32) / 255.0
        b, p, g = x.shape[0], self.patch, side // self.patch
        patches = x.reshape(b, g, p, g, p, 3).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * g, p * p * 3)
        return _with_cls(patches)


class OracleBackbone(GroundTruthBackbone):
    """`oracle:<kind>`: tokens built from the dataset's codes and masks, not its pixels."""

    def __init__(self, spec: str, kind: str, q: float | None = None, seed: int = 0) -> None:
        self.kind, self.q, self.seed = kind, q, seed
        self.space: FeatureSpace | None = None
        self.info = oracle_info(spec, kind)
        self.columns = {"objects": ("O",), "features": ("F",), "patches": ("mask", "objects"),
                        "mix": ("scene_id", "O", "F")}[kind]

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "q": self.q, "seed": self.seed}

    def bind(self, dataset: Any) -> "OracleBackbone":
        self.space = dataset.feature_space
        s = self.space
        width = {"objects": s.n_conjunctions, "features": s.n_features, "patches": s.n_features + 1,
                 "mix": s.n_conjunctions + s.n_features + 1}[self.kind]
        self.info = ground_truth_info(self.info.spec, "oracle", self.info.patch_size, width)
        return self

    def input_side(self, dataset_side: int, resolution: str = "native", image_size: int | None = None) -> int:
        """Ground truth has no resolution: always the dataset's own pixels and masks."""
        if self.kind == "patches" and dataset_side % ORACLE_PATCH:
            raise BenchError(f"dataset: oracle:patches needs an image side that is a multiple of {ORACLE_PATCH}, "
                             f"got {dataset_side}")
        return dataset_side

    def prepare(self, rows: dict[str, list], side: int) -> torch.Tensor:
        if self.space is None:
            raise RuntimeError("oracle backbone used before bind(dataset)")
        if self.kind == "patches":
            return _with_cls(np.stack([self._patch_tokens(m, objs) for m, objs in zip(rows["mask"], rows["objects"])]))
        if self.kind == "objects":
            z = np.asarray(rows["O"], dtype=np.float32)
        elif self.kind == "features":
            z = np.asarray(rows["F"], dtype=np.float32)
        else:
            m = np.array([[self.mixed(sid)] for sid in rows["scene_id"]], dtype=np.float32)
            o, f = np.asarray(rows["O"], dtype=np.float32), np.asarray(rows["F"], dtype=np.float32)
            z = np.concatenate([o * m, f, m], axis=1)
        return torch.from_numpy(z[:, None, :])

    def mixed(self, scene_id: str) -> float:
        """1 for a q fraction of scenes, chosen by a seeded hash of the scene id."""
        u = derive_seed("oracle:mix", self.seed, scene_id) / 2.0**63
        return float(u < self.q)

    def _patch_tokens(self, mask_png: dict, objects: list[dict]) -> np.ndarray:
        """Per 16-px patch: the one-hots of the object with the most pixels there (zeros if
        none), then a flag that is 1 where background covers more of the patch than any object.

        The one-hots make every drawn object visible, however small (the binding
        calibration needs all of them). The flag is the IsSameObject label rule
        (`evaluators.tasks.issameobject.patch_labels`: background competes as one region, ties to the smaller
        id), so a pairwise probe can tell a border patch labelled background from the object
        it touches.
        """
        space = self.space
        mask = decode_mask(mask_png).astype(np.int64)
        p = ORACLE_PATCH
        gh, gw = mask.shape[0] // p, mask.shape[1] // p
        ids = mask[: gh * p, : gw * p].reshape(gh, p, gw, p).transpose(0, 2, 1, 3).reshape(gh * gw, p * p)
        n_ids = max([int(mask.max())] + [int(o["id"]) for o in objects]) + 1
        counts = np.zeros((gh * gw, n_ids), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(gh * gw), p * p), ids.ravel()), 1)
        background = counts.argmax(axis=1) == 0
        counts[:, 0] = 0
        owner = np.where(counts.max(axis=1) > 0, counts.argmax(axis=1), 0)
        onehots = np.zeros((n_ids, space.n_features), dtype=np.float32)
        for obj in objects:
            for off, v in zip(space.offsets, space.conj_values(int(obj["conj"]))):
                onehots[int(obj["id"]), off + v] = 1.0
        return np.concatenate([onehots[owner], background[:, None].astype(np.float32)], axis=1)


def mixed_share(dataset: Any, spec: str, split: str = "test") -> float:
    """The binding `oracle:mix-q` carries on a split: its mixed scenes' share of Σ H(O|F=f).

    q is that share only in expectation; calibration compares β* with the split's own draw.
    """
    oracle = parse_oracle(spec)
    if oracle.kind != "mix":
        raise BenchError(f"model: {spec!r} is not an oracle:mix-<q>")
    mixed = np.array([oracle.mixed(s) for s in dataset.table(split, ["scene_id"])["scene_id"].to_pylist()])
    h = dataset.codes(split)[2]
    return float((mixed * h).sum() / h.sum())


def parse_pixels(spec: str) -> PixelsBackbone:
    return PixelsBackbone(spec, pixels_patch(spec))


def parse_oracle(spec: str, seed: int = 0) -> OracleBackbone:
    kind, q = oracle_kind(spec)
    return OracleBackbone(spec, kind, q=q, seed=seed)
