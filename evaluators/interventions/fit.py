"""Fitting a subspace of a backbone's layer on a dataset (`fit_subspace`): the binding subspace of
the IsSameObject quadratic pair probe, and the controls (`evaluators.interventions.subspace` says
what each is). Kept apart from the artefact itself because it extracts activations, and so reaches
the backbone registry, which loads intervened backbones through `subspace.py`."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from bench.core.dataset import Dataset, decode_mask
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from evaluators.interventions.subspace import (SUBSPACE_KINDS, Subspace, random_basis, subspace_from_quadratic,
                                               token_span)

#: The IsSameObject probe whose symmetric form is the binding subspace.
BINDING_PROBE = "quadratic"
#: Ridge penalty of the feature control's per-patch probes (on standardised tokens).
FEATURE_RIDGE = 1e-2


def fit_subspace(spec_or_backbone: Any, dataset: str | os.PathLike[str] | Dataset, layer: int, *,
                 kind: str = "binding", rank: int = 16, energy: float = 0.95, seed: int = 0, device: str = "auto",
                 dtype: str = "fp32", limit: int | None = None, progress: bool = True) -> Subspace:
    """Fit one subspace of hidden state `layer` on a dataset's train split (val: the probe's early
    stopping). `binding`: the IsSameObject quadratic pair probe (probe rank `rank`, the pairs and
    seeds its rows use) and its `energy` cut; `shuffled-labels`: the same on permuted pair labels;
    `feature`: the top-`rank` directions per-patch feature probes read (all of them when they read
    fewer: the subspace's `rank` says how many); `random`: `rank` seeded
    directions. Tokens come from `extract_activations` (cached)."""
    from evaluators.backbones import resolve_backbone
    from evaluators.cache.extract import extract_activations

    if kind not in SUBSPACE_KINDS:
        raise BenchError(f"kind: unknown subspace kind {kind!r}; allowed: {', '.join(SUBSPACE_KINDS)}")
    if rank < 1:
        raise BenchError(f"rank: must be ≥ 1, got {rank}")
    if not 0.0 < energy <= 1.0:
        raise BenchError(f"energy: must be in (0, 1], got {energy}")
    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    backbone = resolve_backbone(spec_or_backbone) if isinstance(spec_or_backbone, str) else spec_or_backbone
    info = backbone.info
    if not 0 <= int(layer) <= info.n_layers:
        raise BenchError(f"layer: {info.spec} has hidden states 0..{info.n_layers}; no layer {layer}")
    layer = int(layer)
    acts = {s: extract_activations(backbone, ds, s, layers=[layer], token_choices=("all",), device=device,
                                   dtype=dtype, progress=progress, limit=limit) for s in ("train", "val")}
    if acts["train"].grid is None:
        raise BenchError(f"subspace: {info.spec} has no spatial tokens (a subspace is fitted on patch tokens)")
    tokens = {s: np.asarray(a.get(layer, "all")[: a.n if limit is None else limit], np.float32)
              for s, a in acts.items()}
    mean = tokens["train"].reshape(-1, info.width).mean(0, dtype=np.float64)
    settings: dict[str, Any] = {"rank": rank, "seed": seed, "limit": limit, "dtype": dtype}
    if kind == "random":
        basis = random_basis(info.width, rank, seed)
    elif kind == "feature":
        basis = _feature_basis(ds, tokens, acts["train"].grid, rank, limit)
    else:
        settings["energy"] = energy
        basis = _binding_basis(ds, tokens, acts["train"].grid, rank, energy, seed, device, kind == "shuffled-labels",
                               limit)
    return Subspace(basis=basis, mean=mean, kind=kind, backbone=info.spec, backbone_revision=info.revision,
                    layer=layer, dataset=ds.name, dataset_fingerprint=ds.fingerprint("train"), settings=settings)


def _binding_basis(ds: Dataset, tokens: dict[str, np.ndarray], grid: tuple[int, int], rank: int, energy: float,
                   seed: int, device: str, shuffle_labels: bool, limit: int | None) -> np.ndarray:
    """The IsSameObject quadratic probe's subspace, fitted as its rows fit it (same pairs, seeds)."""
    from evaluators.tasks.issameobject.evaluate import layer_data, pair_configs, pair_seed
    from evaluators.tasks.issameobject.pairs import sample_pairs
    from evaluators.tasks.issameobject.patch_labels import split_patch_labels
    from evaluators.tasks.issameobject.scorers import PairTrainConfig, fit_scorer

    pc, tc = pair_configs(device, None, False, train_config=PairTrainConfig(rank=rank, seed=seed))
    data = {}
    for s, t in tokens.items():
        labels = split_patch_labels(ds, s, grid, pc.min_share, limit)
        u, ix, iy, same = layer_data(t, sample_pairs(labels, pc, pair_seed(seed, s)))
        if shuffle_labels:
            same = np.random.default_rng(derive_seed(seed, "shuffled-labels", s)).permutation(same)
        data[s] = (u, ix, iy, same)
    scorer = fit_scorer(BINDING_PROBE, data["train"], data["val"], tc)
    model = scorer.model
    return subspace_from_quadratic(model.u.detach().cpu().numpy(), model.v.detach().cpu().numpy(), scorer.std,
                                   energy, span=token_span(data["train"][0]))


def _feature_basis(ds: Dataset, tokens: dict[str, np.ndarray], grid: tuple[int, int], rank: int,
                   limit: int | None) -> np.ndarray:
    """The top-`rank` right singular vectors of the stacked weight rows, in raw token space, of
    ridge-regression probes of each object patch's feature values (one-hot per feature group:
    colour, shape on ColorShape), fitted on standardised train tokens."""
    from evaluators.tasks.issameobject.patch_labels import patch_labels

    x, values = [], []
    space = ds.feature_space
    rows = ds.table("train", ["mask", "objects"]).to_pylist()[: len(tokens["train"])]
    for t, row in zip(tokens["train"], rows):
        labels = patch_labels(decode_mask(row["mask"]), grid).ravel()
        conj = {int(o["id"]): int(o["conj"]) for o in row["objects"]}
        keep = np.flatnonzero(np.isin(labels, list(conj)))
        x.append(t[keep])
        values.extend(space.conj_values(conj[int(labels[i])]) for i in keep)
    if not values:
        raise BenchError(f"subspace: no object patches in {ds.name}'s train split to fit feature probes on")
    x_all = np.concatenate(x).astype(np.float64)
    mu, sd = x_all.mean(0), x_all.std(0)
    sd = np.where(sd > 1e-6, sd, 1.0)
    z = (x_all - mu) / sd
    v = np.asarray(values)
    targets = np.concatenate([np.eye(n)[v[:, g]] for g, n in enumerate(space.sizes)], axis=1)
    targets = targets - targets.mean(0)
    w = np.linalg.solve(z.T @ z + FEATURE_RIDGE * len(z) * np.eye(z.shape[1]), z.T @ targets)  # (D, classes)
    _, _, vt = np.linalg.svd((w / sd[:, None]).T, full_matrices=False)  # weight rows in raw space
    return vt[:rank].T  # fewer when the probes read fewer directions (2 colours x 2 shapes read 2): its rank says
