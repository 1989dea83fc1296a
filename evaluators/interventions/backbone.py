"""An intervened backbone is a backbone: a base backbone whose hidden state L is changed along a
fitted subspace by a forward hook, inside the network, so every later block sees the change.

Spec: `intervene:<kind>=<strength>,layer=<L>,subspace=<file.npz>[,seed=<S>]:<base spec>`, e.g.
`intervene:shuffle=0.5,layer=2,subspace=sub.npz:zoo:conjunctions` (the base is everything after
the first `:` that follows the options). Its rows carry their own weights fingerprint (a hash of
the base's, the kind, strength, layer, seed and the subspace's fingerprint), so the cache, resume
and the board keep every intervention apart, identity strengths included.

The hook changes the block's output in place (transformers records that very tensor as
`hidden_states[L]`; a hook that returned a new tensor would change what later blocks see but not
the recorded state): a forward hook on `blocks()[L-1]` for L ≥ 1, a forward pre-hook on
`blocks()[0]` for L = 0, registered first (`prepend`) so the extraction's own hooks see the change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bench.core.dataset import Dataset, decode_mask
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from evaluators.backbones.base import AttentionQK, Backbone
from bench.core.intervention_specs import InterventionSpec, parse_intervention
from evaluators.interventions.intervene import Intervention, apply_intervention
from evaluators.interventions.specs import intervened_revision
from evaluators.interventions.subspace import Subspace, load_subspace


def has_instance_masks(dataset: Dataset) -> bool:
    """Whether a dataset's masks are instance masks: generated ones are; an import says in its
    card's provenance (`mask`: "instance: ...", or "boxes"/"approximate" when they are not)."""
    said = (dataset.card.get("provenance") or {}).get("mask")
    return said is None or str(said).startswith("instance")


class IntervenedBackbone(Backbone):
    """`base` with its hidden state `layer` changed along `subspace` (see the module docstring)."""

    def __init__(self, spec: str, parsed: InterventionSpec, base: Backbone, subspace: Subspace) -> None:
        self.base, self.parsed, self.subspace = base, parsed, subspace
        self.intervention = Intervention(parsed.kind, parsed.strength, parsed.seed)
        info = base.info
        if not callable(getattr(base, "blocks", None)):
            raise BenchError(f"model: {spec}: {info.spec} has no transformer blocks to hook (pixels and oracles "
                             "cannot be intervened on)")
        self.hooked = base.blocks()
        if not 0 <= parsed.layer <= info.n_layers or len(self.hooked) < max(parsed.layer, 1):
            raise BenchError(f"model: {spec}: {info.spec} has hidden states 0..{info.n_layers}; no layer {parsed.layer}")
        if subspace.layer != parsed.layer:
            raise BenchError(f"model: {spec}: the subspace {parsed.subspace} was fitted at layer {subspace.layer}, "
                             f"not {parsed.layer}")
        if subspace.backbone_revision != info.revision or subspace.basis.shape[0] != info.width:
            raise BenchError(f"model: {spec}: the subspace {parsed.subspace} was fitted on {subspace.backbone} "
                             f"(weights {subspace.backbone_revision}), not {info.spec} (weights {info.revision})")
        self.info = dataclasses.replace(info, spec=spec, revision=intervened_revision(info.revision, parsed,
                                                                                       subspace.fingerprint))
        extra = ("content_hash", "mask") if parsed.kind == "inject" else ("content_hash",)
        self.columns = tuple(dict.fromkeys((*base.columns, *extra)))
        self._basis = torch.from_numpy(np.asarray(subspace.basis, np.float32))
        self._mean = torch.from_numpy(np.asarray(subspace.mean, np.float32))

    def identity(self) -> dict[str, Any]:
        p = self.parsed
        return {**self.base.identity(), "intervention": {
            "kind": p.kind, "strength": p.strength, "layer": p.layer, "seed": p.seed,
            "subspace": self.subspace.fingerprint, "base": p.base}}

    def bind(self, dataset: Any) -> "IntervenedBackbone":
        """Refuse a dataset the subspace was not fitted on, and `inject` without instance masks."""
        if isinstance(dataset, Dataset):
            if dataset.fingerprint("train") != self.subspace.dataset_fingerprint:
                raise BenchError(f"model: {self.info.spec}: the subspace {self.parsed.subspace} was fitted on "
                                 f"{self.subspace.dataset} (train fingerprint {self.subspace.dataset_fingerprint[:16]}), "
                                 f"not {dataset.name} ({dataset.fingerprint('train')[:16]})")
            if self.parsed.kind == "inject" and not has_instance_masks(dataset):
                raise BenchError(f"model: {self.info.spec}: inject reads instance masks, and {dataset.name}'s masks "
                                 f"are not ({dataset.card['provenance']['mask'].split(':')[0]})")
        self.base = self.base.bind(dataset)
        return self

    def to(self, device: torch.device, dtype: str) -> "IntervenedBackbone":
        super().to(device, dtype)
        self.base = self.base.to(device, dtype)
        self._basis, self._mean = self._basis.to(device), self._mean.to(device)
        return self

    def input_side(self, dataset_side: int, resolution: str = "native", image_size: int | None = None) -> int:
        return self.base.input_side(dataset_side, resolution, image_size)

    def native_side(self, dataset_side: int) -> int:
        return self.base.native_side(dataset_side)

    def grid(self, side: int) -> tuple[int, int] | None:
        return self.base.grid(side)

    def blocks(self) -> torch.nn.ModuleList:
        return self.hooked

    def attention_qk(self, layer: int) -> AttentionQK | None:
        return self.base.attention_qk(layer)

    def prepare(self, rows: dict[str, list], side: int) -> tuple[Any, list[int], torch.Tensor | None]:
        """(the base's inputs, each row's seed from its content hash, its patch labels for inject)."""
        from evaluators.tasks.issameobject.patch_labels import patch_labels

        seeds = [derive_seed(self.parsed.seed, "intervene", h) for h in rows["content_hash"]]
        labels = None
        if self.parsed.kind == "inject":
            grid = self.grid(side)
            labels = torch.from_numpy(np.stack([patch_labels(decode_mask(m), grid, min_share=0.0).ravel()
                                                for m in rows["mask"]]).astype(np.int64))
        return self.base.prepare(rows, side), seeds, labels

    def hidden_states(self, inputs: tuple[Any, list[int], torch.Tensor | None],
                      layers: Sequence[int]) -> list[torch.Tensor]:
        x, seeds, labels = inputs
        n_prefix, layer = self.info.n_prefix, self.parsed.layer

        def edit(tokens: torch.Tensor) -> None:
            if tokens.ndim != 3 or tokens.shape[0] != len(seeds):
                raise BenchError(f"model: {self.info.spec}: block tokens of shape {tuple(tokens.shape)} are not "
                                 f"batch-first (B x T x D, B = {len(seeds)}); interventions need batch-first blocks")
            apply_intervention(tokens[:, n_prefix:], self._basis, self._mean, self.intervention, seeds, labels)

        if layer == 0:
            handle = self.hooked[0].register_forward_pre_hook(lambda m, args: edit(_first(args)), prepend=True)
        else:
            handle = self.hooked[layer - 1].register_forward_hook(lambda m, args, y: edit(_first(y)), prepend=True)
        try:
            return self.base.hidden_states(x, layers)
        finally:
            handle.remove()


def _first(value: Any) -> torch.Tensor:
    """A block's tokens: its output (or input) itself, or the first item of a tuple of them."""
    return value[0] if isinstance(value, (tuple, list)) else value


# The registry (evaluators/backbones/__init__.py) hands its own `resolve` to the one below: this
# module is loaded by it, so it does not import it back (nor does `specs`, with its other two).


def load_intervened(spec: str, seed: int, resolve: Callable[..., Backbone]) -> IntervenedBackbone:
    """The backbone an `intervene:` spec names, its base resolved by `resolve(base, seed=seed)`."""
    parsed = parse_intervention(spec)
    subspace = load_subspace(parsed.subspace)
    return IntervenedBackbone(spec.strip(), parsed, resolve(parsed.base, seed=seed), subspace)
