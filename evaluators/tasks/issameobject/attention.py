"""IsSameObject correlation with attention: the attention weight of each pair in the block that
reads a layer, and its permutation-tested correlation with a probe's scores (package docstring,
`evaluators.tasks.issameobject`)."""

from __future__ import annotations

import math

import numpy as np
import torch

from evaluators.backbones.base import AttentionQK
from evaluators.tasks.issameobject.pairs import Pairs


@torch.no_grad()
def pair_attention(qk: AttentionQK, tokens: np.ndarray, pairs: Pairs, max_elements: int = 1 << 24) -> np.ndarray:
    """The block's attention weight of each pair, symmetrised and averaged over heads:
    (A_ij + A_ji) / 2 with A_ij = mean_h softmax_j(q_h(n(x_i))·k_h(n(x_j)) / sqrt(d_head)).

    `tokens` (N, T, D) is the cached "all" view of one split, so the softmax runs over the
    T patch tokens of the image only: prefix tokens (CLS, registers) are not cached, and
    the weights are the model's attention renormalised over the patches (exactly the
    model's probabilities restricted to patch columns, divided by their row sum). Only
    images that have pairs are projected, a few at a time (at most about `max_elements`
    attention entries per chunk), on the projections' device in float32.
    """
    out = np.zeros(len(pairs), np.float64)
    if not len(pairs):
        return out
    dev = next(qk.query.parameters()).device
    t = tokens.shape[1]
    images = np.unique(pairs.image)
    per_chunk = max(1, max_elements // (qk.n_heads * t * t))
    for s in range(0, len(images), per_chunk):
        chunk = images[s : s + per_chunk]
        x = torch.from_numpy(np.asarray(tokens[chunk], np.float32)).to(dev)  # (B, T, D)
        q, k = qk.project(x)  # (B, T, H, d)
        logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
        attn = logits.softmax(-1).mean(1)  # (B, T, T), rows sum to 1
        sym = ((attn + attn.transpose(1, 2)) / 2).cpu().double().numpy()
        sel = np.flatnonzero(np.isin(pairs.image, chunk))
        b = np.searchsorted(chunk, pairs.image[sel])
        out[sel] = sym[b, pairs.i[sel], pairs.j[sel]]
    return out


def permutation_correlation(a: np.ndarray, b: np.ndarray, n_perm: int = 1000, seed: int = 0,
                            chunk: int = 64, groups: np.ndarray | None = None) -> dict[str, float | None]:
    """Pearson r of `a` and `b` and its two-sided permutation p-value,
    p = (1 + #{|r_perm| >= |r|}) / (1 + n_perm) (seeded, so deterministic). With `groups`
    (e.g. each pair's image) entries are permuted only within their group: pairs of one
    image share its tokens, so image-level effects must not count as evidence. r and p are
    None when either vector is constant or has < 3 entries. Products are summed by numpy's own
    reduction, in a fixed order, not by BLAS, whose kernel is picked by the processor: r moved in
    its 8th digit between OpenBLAS's Haswell and SkylakeX kernels."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return {"r": None, "p": None}
    za, zb = (a - a.mean()) / a.std(), (b - b.mean()) / b.std()
    r = float(np.clip(np.add.reduce(za * zb) / len(a), -1.0, 1.0))  # not BLAS's dot: see the docstring
    group = np.zeros(len(a)) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1].astype(np.float64)
    by_group = np.argsort(group, kind="stable")
    rng = np.random.default_rng(seed)
    hits = 0
    for s in range(0, n_perm, chunk):
        c = min(chunk, n_perm - s)
        shuffled = np.argsort(group + rng.random((c, len(a))), axis=1)  # by group, random within
        perms = np.empty_like(shuffled)
        perms[:, by_group] = shuffled
        r_perm = np.add.reduce(za[perms] * zb, axis=1) / len(a)
        hits += int((np.abs(r_perm) >= abs(r) - 1e-12).sum())
    return {"r": r, "p": (1 + hits) / (1 + n_perm)}


def attention_correlation(qk: AttentionQK, tokens: np.ndarray, pairs: Pairs, scores: np.ndarray,
                          n_perm: int = 1000, seed: int = 0,
                          attention: np.ndarray | None = None) -> dict[str, float | None]:
    """Pearson r (and permutation p) between the attention of the block that reads these
    tokens (`pair_attention`, over the cached patch tokens of each image) and a probe's
    scores of the same pairs. `attention` reuses precomputed `pair_attention` values."""
    att = pair_attention(qk, tokens, pairs) if attention is None else attention
    return permutation_correlation(att, scores, n_perm=n_perm, seed=seed, groups=pairs.image)
