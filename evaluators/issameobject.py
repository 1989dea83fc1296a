"""IsSameObject (docs/ARCHITECTURE.md §3; Li et al., NeurIPS 2025): is "these two patches belong to the
same object" decodable from a layer's patch tokens?

Pairs. Patch labels come from the instance masks at the backbone's grid
(`evaluators.patch_labels`); background is one region, so two background patches are a
"same" pair unless `exclude_background` drops background patches altogether. Pairs are
drawn per image, never across images, from distinct valid patches (i < j):
- `balanced` (default, used for train, val and test): a quarter of `pairs_per_image`
  from each pair kind — same object, background-background (both "same"), two
  different objects, object-background (both "different") — without replacement.
  Drawn uniformly instead, background pairs swamp both classes and a probe scores
  well by finding the background alone, never telling two objects apart. With
  `exclude_background` the two object kinds get half each. An image short of a kind
  contributes what it has, so the mix is near, not exactly, 50/50; the majority
  baseline reports the residual imbalance.
- `natural`: up to `pairs_per_image` pairs uniformly among all pairs of the image, so
  the classes keep their natural (mostly "same background") proportion.

Scorers, all symmetric in their two inputs by construction (score(x, y) = score(y, x)):
- probes trained with binary cross-entropy on standardised tokens, AdamW, early
  stopping on validation loss: `linear` σ(w·x + w·y + b); `diag-quadratic`
  σ(xᵀdiag(v)y + w·(x + y) + b); `quadratic` σ(xᵀWy + w·(x + y) + b),
  W = (UᵀV + VᵀU)/2 of rank r. The quadratic forms keep the linear term, so each
  family contains the one before it (as the binding probes do): without it a pure
  bilinear form cannot say "both patches are background" when background tokens are
  near zero (oracle:patches), and trains badly from a small start;
  `pointwise-identity` σ(a·⟨p(x), p(y)⟩ + b) with p a softmax over K instance slots
  (each patch names its object; two patches agree when their slot distributions do).
- bias-only baselines on the raw tokens, σ((s - μ_s)/σ_s + b) with only b learned (μ_s,
  σ_s the similarity's training mean and spread, so the sign is fixed and nothing but a
  threshold is fitted):
  `cosine`, `dot`, `distance` (s = -‖x - y‖), `attention-qk` (the attention logit of
  the block that reads the layer, symmetrised and averaged over heads:
  s = mean_h (q_h(n(x))·k_h(n(y)) + q_h(n(y))·k_h(n(x))) / 2 / sqrt(d_head), n that
  block's pre-attention norm, q and k its query/key projections with their biases;
  computed from the cached tokens and the backbone's weights, `Backbone.attention_qk`),
  and `majority` (the training majority class). `attention-qk` needs a backbone that
  exposes those projections (Hugging Face, timm and OpenCLIP ViTs whose logits depend on
  the two tokens alone, `random:` presets included); asking it of any other is an error.
  The last hidden state feeds no block, so there is no attention-qk row for it (a run
  says so in one line).

Metrics on test pairs: accuracy (threshold 0.5), balanced accuracy, AUROC (exact, ties
count one half), majority-baseline accuracy, each with a percentile bootstrap interval
over test *images* (pairs of one image are not independent). Accuracy, balanced accuracy
and AUROC are also measured on the validation pairs (`val_*` columns): a leaderboard's
`best` layer is chosen there, so the test number it reports is not the luckiest of several.

Correlation with attention (trained probes; backbones that expose query/key projections,
layers a block reads, i.e. not the last hidden state): `attention_r` is the Pearson r,
over test pairs, between the probe's scores and the attention weights of the block
that reads the layer, symmetrised and averaged over heads, (A_ij + A_ji) / 2 with
A_ij = mean_h softmax_j(q_h(n(x_i))·k_h(n(x_j)) / sqrt(d_head)). The softmax runs over
the tokens the cache holds for the image, its patch tokens: prefix tokens (CLS,
registers) are not cached, so A is the model's attention renormalised over the patches.
`attention_p` is a two-sided permutation p-value, (1 + #{|r_perm| ≥ |r|}) / (1 + n),
1000 seeded permutations of the pairs within their images. Both are null elsewhere.
"""

from __future__ import annotations

import copy
import json
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import nn
from torch.nn import functional as F

from bench.console import progress_bar
from bench.dataset import Dataset
from bench.errors import BenchError, ConfigError
from bench.hashing import config_hash, derive_seed
from evaluators.backbones.base import AttentionQK
from evaluators.families import DEFAULT_PROBES, PAIR_PROBES, pair_probe_names
from evaluators.patch_labels import BACKGROUND, DEFAULT_MIN_SHARE, IGNORE, split_patch_labels
from evaluators.training import resolve_device

SAMPLINGS = ("balanced", "natural")


@dataclass(frozen=True)
class PairConfig:
    """How pairs are drawn from each image (see the module docstring)."""

    pairs_per_image: int = 64
    sampling: str = "balanced"
    min_share: float = DEFAULT_MIN_SHARE
    exclude_background: bool = False

    def validate(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ConfigError("sampling", f"unknown {self.sampling!r}; allowed: {', '.join(SAMPLINGS)}")
        if self.pairs_per_image < 2:
            raise ConfigError("pairs_per_image", f"must be ≥ 2, got {self.pairs_per_image}")


@dataclass(frozen=True)
class PairTrainConfig:
    """Optimiser and probe sizes. Defaults: rank 16, 16 slots, at most 30 epochs, patience 5.

    Batches shrink below `batch_size` on small pair sets so every epoch takes at least
    `min_steps` optimiser steps (a few thousand pairs would otherwise train for a
    handful of steps in all).
    """

    epochs: int = 30
    batch_size: int = 512
    #: None = 1e-2 · sqrt(16 / D), at most 1e-2: a bilinear logit sums D products, so a
    #: fixed Adam step moves it further the wider the tokens (measured: 1e-2 suits 16-d
    #: one-hots; 384-d DINOv2 tokens early-stop within 3 epochs at 1e-2 and do best near 1e-3).
    lr: float | None = None
    weight_decay: float = 1e-4
    patience: int = 5
    min_delta: float = 1e-4
    min_steps: int = 16
    rank: int = 16
    slots: int = 16
    seed: int = 0
    device: str = "cpu"


@dataclass
class Pairs:
    """Patch pairs: image index, the two patch indices (row-major over the grid), and the label."""

    image: np.ndarray
    i: np.ndarray
    j: np.ndarray
    same: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.same)


def valid_patches(labels: np.ndarray, exclude_background: bool) -> np.ndarray:
    """Boolean mask of patches that may appear in a pair."""
    ok = labels != IGNORE
    return ok & (labels != BACKGROUND) if exclude_background else ok


def pair_kind(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """0 same object, 1 background-background, 2 two different objects, 3 object-background."""
    bg_a, bg_b = a == BACKGROUND, b == BACKGROUND
    return np.where(bg_a & bg_b, 1, np.where(bg_a | bg_b, 3, np.where(a == b, 0, 2)))


def sample_pairs(labels: np.ndarray, config: PairConfig, seed: int) -> Pairs:
    """Pairs from every image of an (N, T) label array; deterministic given `seed`."""
    config.validate()
    rng = np.random.default_rng(seed)
    parts: list[tuple[np.ndarray, ...]] = []
    for n, row in enumerate(labels):
        idx = np.flatnonzero(valid_patches(row, config.exclude_background))
        a, b = np.triu_indices(len(idx), k=1)
        if not len(a):
            continue
        a, b = idx[a], idx[b]
        same = row[a] == row[b]
        if config.sampling == "natural":
            take = rng.choice(len(a), min(config.pairs_per_image, len(a)), replace=False)
        else:
            kind = pair_kind(row[a], row[b])
            quota = config.pairs_per_image // (2 if config.exclude_background else 4)
            take = np.concatenate([
                rng.choice(sel, min(quota, len(sel)), replace=False)
                for sel in (np.flatnonzero(kind == k) for k in range(4))
            ])
        take = np.sort(take)
        parts.append((np.full(len(take), n), a[take], b[take], same[take]))
    if not parts:
        return Pairs(*(np.zeros(0, np.int64) for _ in range(3)), np.zeros(0, bool))
    image, i, j, same = (np.concatenate(p) for p in zip(*parts))
    return Pairs(image.astype(np.int64), i.astype(np.int64), j.astype(np.int64), same.astype(bool))


def gather_tokens(tokens: np.ndarray, pairs: Pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(U, ix, iy): the distinct tokens the pairs use as float32, and each pair's two rows of U.

    Reading only the used tokens keeps memory at pairs x D, not images x patches x D.
    """
    n, t, d = tokens.shape
    flat_x, flat_y = pairs.image * t + pairs.i, pairs.image * t + pairs.j
    used, inverse = np.unique(np.concatenate([flat_x, flat_y]), return_inverse=True)
    u = np.asarray(tokens.reshape(n * t, d)[used], dtype=np.float32)
    return u, inverse[: len(pairs)], inverse[len(pairs) :]


# ---------------------------------------------------------------- scorers


class PairProbe(nn.Module):
    """A symmetric pairwise scorer: logits for batches of token pairs (B, D), (B, D)."""

    def pair_logits(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.pair_logits(x, y)


class LinearPair(PairProbe):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d))
        self.b = nn.Parameter(torch.zeros(()))

    def pair_logits(self, x, y):
        return (x + y) @ self.w + self.b


class DiagQuadraticPair(LinearPair):
    """The linear term plus xᵀdiag(w)y."""

    def __init__(self, d: int) -> None:
        super().__init__(d)
        self.diag = nn.Parameter(torch.full((d,), 1.0 / d))

    def pair_logits(self, x, y):
        return super().pair_logits(x, y) + (x * y) @ self.diag


class QuadraticPair(LinearPair):
    """The linear term plus xᵀWy, W = (UᵀV + VᵀU)/2, computed as ((Ux)·(Vy) + (Vx)·(Uy)) / 2 in O(rD)."""

    def __init__(self, d: int, rank: int) -> None:
        super().__init__(d)
        # small start: initial logits near 0 (a unit-scale start gives |logit| ~ sqrt(rank))
        self.u = nn.Parameter(0.3 * torch.randn(rank, d) / math.sqrt(d))
        self.v = nn.Parameter(0.3 * torch.randn(rank, d) / math.sqrt(d))

    def pair_logits(self, x, y):
        ux, vx, uy, vy = x @ self.u.T, x @ self.v.T, y @ self.u.T, y @ self.v.T
        return super().pair_logits(x, y) + 0.5 * ((ux * vy).sum(-1) + (vx * uy).sum(-1))


class PointwiseIdentityPair(PairProbe):
    """Each patch gets a distribution over K instance slots; pairs agree by inner product."""

    def __init__(self, d: int, slots: int) -> None:
        super().__init__()
        self.slot = nn.Linear(d, slots)
        self.a = nn.Parameter(torch.tensor(8.0))
        self.b = nn.Parameter(torch.tensor(-4.0))

    def pair_logits(self, x, y):
        agree = (F.softmax(self.slot(x), -1) * F.softmax(self.slot(y), -1)).sum(-1)
        return self.a * agree + self.b


def build_probe(name: str, d: int, config: PairTrainConfig) -> PairProbe:
    if name == "linear":
        return LinearPair(d)
    if name == "diag-quadratic":
        return DiagQuadraticPair(d)
    if name == "quadratic":
        return QuadraticPair(d, config.rank)
    if name == "pointwise-identity":
        return PointwiseIdentityPair(d, config.slots)
    raise PAIR_PROBES.unknown(name)


def similarity(name: str, x: np.ndarray, y: np.ndarray, qk: AttentionQK | None = None) -> np.ndarray:
    """A baseline's raw similarity per pair (larger = more likely the same object).

    `attention-qk` needs `qk`, the projections of the block that reads these tokens.
    """
    if name == "attention-qk":
        if qk is None:
            raise BenchError("probe: attention-qk needs the query/key projections of the block that reads these "
                             "tokens, and none were given")
        return attention_qk_scores(qk, x, y)
    if name == "dot":
        return np.einsum("pd,pd->p", x, y, dtype=np.float64)
    if name == "cosine":
        nx, ny = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
        return np.einsum("pd,pd->p", x, y, dtype=np.float64) / np.maximum(nx * ny, 1e-12)
    if name == "distance":
        return -np.linalg.norm(x.astype(np.float64) - y, axis=1)
    raise BenchError(f"probe: unknown baseline {name!r}; allowed: {', '.join(pair_probe_names(False))}")


@torch.no_grad()
def attention_qk_scores(qk: AttentionQK, x: np.ndarray, y: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """`AttentionQK.pair_scores` of token pairs (P, D) x (P, D), in float32 on the projections' device."""
    dev = next(qk.query.parameters()).device
    out = [
        qk.pair_scores(*(torch.from_numpy(np.asarray(a[s : s + chunk], np.float32)).to(dev) for a in (x, y))).cpu()
        for s in range(0, len(x), chunk)
    ]
    return torch.cat(out).double().numpy() if out else np.zeros(0)


@dataclass
class FittedScorer:
    """A trained scorer: `score(x, y)` gives P(same) for raw token pairs (P, D) x (P, D)."""

    name: str
    score_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]
    best_epoch: int = -1
    history: list | None = None

    def score(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.score_fn(np.asarray(x, np.float32), np.asarray(y, np.float32))


def fit_bias(z: np.ndarray, same: np.ndarray) -> float:
    """Maximum-likelihood bias b of σ(z + b): a 1-D convex problem, solved by bounded
    minimisation (plain Newton steps diverge when z saturates the sigmoid)."""
    y = same.astype(np.float64)

    def loss(b: float) -> float:
        t = z + b
        return float(np.mean(np.logaddexp(0.0, t) - y * t))

    lo, hi = -float(z.max()) - 50.0, -float(z.min()) + 50.0
    return float(minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-8}).x)


def fit_scorer(
    name: str,
    train: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    config: PairTrainConfig = PairTrainConfig(),
    qk: AttentionQK | None = None,
) -> FittedScorer:
    """Fit one scorer. `train`/`val` are (U, ix, iy, same): distinct tokens and pair rows into them.

    `qk` (for `attention-qk` only) is the block that reads these tokens; it is copied to
    `config.device` in float32.
    """
    u, ix, iy, same = train
    if len(same) == 0:
        raise BenchError("issameobject: no training pairs (no image has two valid patches)")
    if name == "majority":
        p = float(same.mean() >= 0.5)
        return FittedScorer(name, lambda x, y: np.full(len(x), p))
    if name in pair_probe_names(False):
        qk = qk.copy_to(config.device) if name == "attention-qk" and qk is not None else None
        s = similarity(name, u[ix], u[iy], qk)
        center, scale = float(s.mean()), float(s.std()) or 1.0
        b = fit_bias((s - center) / scale, same)
        return FittedScorer(name, lambda x, y: _sigmoid((similarity(name, x, y, qk) - center) / scale + b))
    return _fit_probe(name, train, val, config)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))


def _fit_probe(name, train, val, config: PairTrainConfig) -> FittedScorer:
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    u, ix, iy, same = train
    mean, std = u.mean(0), u.std(0)
    std = np.where(std > 1e-6, std, 1.0).astype(np.float32)
    dev = config.device

    def standardized(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((a - mean) / std).astype(np.float32)).to(dev)

    tu, vu = standardized(u), standardized(val[0])
    y_train = torch.from_numpy(same.astype(np.float32)).to(dev)
    y_val = torch.from_numpy(val[3].astype(np.float32)).to(dev)
    model = build_probe(name, u.shape[1], config).to(dev)
    lr = config.lr if config.lr is not None else 1e-2 * min(1.0, math.sqrt(16 / u.shape[1]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=config.weight_decay)
    best, best_epoch, best_state, stale, history = math.inf, -1, None, 0, []
    batch = max(1, min(config.batch_size, math.ceil(len(same) / config.min_steps)))
    tix, tiy = torch.from_numpy(ix).to(dev), torch.from_numpy(iy).to(dev)
    for epoch in range(config.epochs):
        model.train()
        perm = torch.from_numpy(rng.permutation(len(same))).to(dev)
        total = 0.0
        for start in range(0, len(perm), batch):
            b = perm[start : start + batch]
            loss = F.binary_cross_entropy_with_logits(model(tu[tix[b]], tu[tiy[b]]), y_train[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(b)
        v = _val_loss(model, vu, val[1], val[2], y_val, config.batch_size)
        history.append((total / len(same), v))
        if not math.isfinite(v):
            raise FloatingPointError(f"validation loss is {v} at epoch {epoch}")
        if v < best - config.min_delta:
            best, best_epoch, best_state, stale = v, epoch, copy.deepcopy(model.state_dict()), 0
        else:
            stale += 1
            if stale >= config.patience:
                break
    model.load_state_dict(best_state)
    model.eval()

    @torch.no_grad()
    def score(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = [
            torch.sigmoid(model(standardized(x[s : s + 8192]), standardized(y[s : s + 8192]))).cpu().numpy()
            for s in range(0, len(x), 8192)
        ]
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)

    return FittedScorer(name, score, best_epoch, history)


@torch.no_grad()
def _val_loss(model, vu, ix, iy, y, batch) -> float:
    model.eval()
    if len(y) == 0:
        return float("nan")
    total = 0.0
    for s in range(0, len(y), 4 * batch):
        logits = model(vu[ix[s : s + 4 * batch]], vu[iy[s : s + 4 * batch]])
        total += F.binary_cross_entropy_with_logits(logits, y[s : s + 4 * batch], reduction="sum").item()
    return total / len(y)


# ---------------------------------------------------------------- metrics


def weighted_auroc(scores: np.ndarray, same: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC (ties count 1/2) under pair weights; `weights` is (P,) or (B, P) -> scalar or (B,).

    P(score_pos > score_neg) + P(tie)/2 with positives and negatives weighted: the exact
    Mann-Whitney statistic, vectorised over bootstrap replicates.
    """
    w = np.atleast_2d(weights).astype(np.float64)
    order = np.argsort(scores, kind="stable")
    s, y, w = scores[order], same[order], w[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    pos = np.add.reduceat(np.where(y, w, 0.0), starts, axis=1)
    neg = np.add.reduceat(np.where(y, 0.0, w), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (pos * (below + 0.5 * neg)).sum(1) / (pos.sum(1) * neg.sum(1))
    return auc if np.ndim(weights) == 2 else auc[0]


def _pair_stats(scores, same, majority, w) -> dict[str, np.ndarray]:
    """Each metric under pair weights w (B, P)."""
    pred = scores >= 0.5
    tot = w.sum(1)
    pos, neg = (w * same).sum(1), (w * ~same).sum(1)
    tp, tn = (w * (pred & same)).sum(1), (w * (~pred & ~same)).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "accuracy": (tp + tn) / tot,
            "balanced_accuracy": 0.5 * (tp / pos + tn / neg),
            "auroc": weighted_auroc(scores, same, w),
            "majority_accuracy": (pos if majority else neg) / tot,
        }


def pair_metrics(
    scores: np.ndarray,
    same: np.ndarray,
    images: np.ndarray,
    majority: bool,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, float | None]:
    """accuracy, balanced_accuracy, auroc, majority_accuracy (+ `_lo`/`_hi`) of test pairs.

    `majority` is the training majority class (True = "same"). Intervals resample test
    images with replacement (all pairs of a drawn image come along). Metrics a sample
    cannot define (one class absent) are None.
    """
    scores = np.asarray(scores, np.float64)
    same = np.asarray(same, bool)
    _, img = np.unique(images, return_inverse=True)
    point = _pair_stats(scores, same, majority, np.ones((1, len(same))))
    rng = np.random.default_rng(seed)
    n_img = int(img.max()) + 1 if len(img) else 0
    samples: dict[str, list[np.ndarray]] = {k: [] for k in point}
    for start in range(0, n_boot, 128):
        counts = rng.multinomial(n_img, np.full(n_img, 1.0 / n_img), size=min(128, n_boot - start))
        for k, v in _pair_stats(scores, same, majority, counts[:, img].astype(np.float64)).items():
            samples[k].append(v)
    tail = (1 - level) / 2 * 100
    out: dict[str, float | None] = {}
    for k, v in point.items():
        out[k] = _finite(v[0])
        boot = np.concatenate(samples[k])
        boot = boot[np.isfinite(boot)]
        out[f"{k}_lo"] = float(np.percentile(boot, tail)) if len(boot) else None
        out[f"{k}_hi"] = float(np.percentile(boot, 100 - tail)) if len(boot) else None
    return out


#: The metrics a row also keeps on validation pairs, as `val_<name>`: layers are chosen on them.
VALIDATION_METRICS = ("accuracy", "balanced_accuracy", "auroc")


def validation_metrics(scores: np.ndarray, same: np.ndarray, majority: bool) -> dict[str, float | None]:
    """`val_accuracy`, `val_balanced_accuracy` and `val_auroc` of the validation pairs (point values:
    they choose a layer, they are not reported)."""
    point = _pair_stats(np.asarray(scores, np.float64), np.asarray(same, bool), majority, np.ones((1, len(same))))
    return {f"val_{k}": _finite(point[k][0]) for k in VALIDATION_METRICS}


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


# ---------------------------------------------------------------- correlation with attention


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
    None when either vector is constant or has < 3 entries."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return {"r": None, "p": None}
    za, zb = (a - a.mean()) / a.std(), (b - b.mean()) / b.std()
    r = float(np.clip(za @ zb / len(a), -1.0, 1.0))
    group = np.zeros(len(a)) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1].astype(np.float64)
    by_group = np.argsort(group, kind="stable")
    rng = np.random.default_rng(seed)
    hits = 0
    for s in range(0, n_perm, chunk):
        c = min(chunk, n_perm - s)
        shuffled = np.argsort(group + rng.random((c, len(a))), axis=1)  # by group, random within
        perms = np.empty_like(shuffled)
        perms[:, by_group] = shuffled
        r_perm = za[perms] @ zb / len(a)
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


# ---------------------------------------------------------------- evaluation


def layer_data(tokens: np.ndarray, pairs: Pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(U, ix, iy, same) of one split at one layer, the form `fit_scorer` takes."""
    u, ix, iy = gather_tokens(tokens, pairs)
    return u, ix, iy, pairs.same


def evaluate_layer(
    tokens: dict[str, np.ndarray],
    pairs: dict[str, Pairs],
    probes: Sequence[str],
    config: PairTrainConfig,
    n_boot: int = 1000,
    progress: Callable[[int], None] | None = None,
    qk: AttentionQK | None = None,
    attention_perms: int = 1000,
) -> list[dict[str, Any]]:
    """Fit and score every probe at one layer; one metrics dict per probe (errors kept as rows).

    `qk` is the block that reads this layer (for `attention-qk`; None gives an error row).
    With `qk`, every trained probe row also gets `attention_r`/`attention_p`: the Pearson
    correlation, over test pairs, of its scores with that block's attention weights
    (`attention_correlation`, `attention_perms` permutations); None without `qk`."""
    data = {s: layer_data(tokens[s], pairs[s]) for s in ("train", "val", "test")}
    u, ix, iy, same = data["test"]
    vu, vix, viy, vsame = data["val"]
    majority = bool(data["train"][3].mean() >= 0.5)
    attention: np.ndarray | None = None  # the test pairs' attention weights, computed once per layer
    out = []
    for name in probes:
        start = time.perf_counter()
        row: dict[str, Any] = {"probe": name, "n_train": len(pairs["train"]), "n_test": len(pairs["test"])}
        try:
            scorer = fit_scorer(name, data["train"], data["val"], config, qk=qk)
            scores = scorer.score(u[ix], u[iy])
            row.update(pair_metrics(scores, same, pairs["test"].image, majority, n_boot=n_boot, seed=config.seed))
            row.update(validation_metrics(scorer.score(vu[vix], vu[viy]), vsame, majority))
            if qk is not None and name in pair_probe_names(True):
                if attention is None:
                    attention = pair_attention(qk.copy_to(config.device), tokens["test"], pairs["test"])
                corr = attention_correlation(qk, tokens["test"], pairs["test"], scores, n_perm=attention_perms,
                                             seed=config.seed, attention=attention)
                row.update(attention_r=corr["r"], attention_p=corr["p"])
            row.update(status="ok", error=None, best_epoch=scorer.best_epoch)
        except (BenchError, FloatingPointError, RuntimeError) as e:
            row.update(status="error", error=f"{type(e).__name__}: {e}".splitlines()[0])
        row["wall_time_s"] = time.perf_counter() - start
        out.append(row)
        if progress:
            progress(1)
    return out


def check_probes(probes: Sequence[str]) -> None:
    """Raise a one-line BenchError for the first name that is no IsSameObject probe."""
    PAIR_PROBES.check(probes)


def check_attention_qk(backbone: Any, probes: Sequence[str]) -> None:
    """A one-line error, before any extraction, when `attention-qk` is asked of a backbone
    that exposes no query/key projections."""
    if "attention-qk" in probes and (not backbone.info.n_layers or backbone.attention_qk(0) is None):
        raise BenchError(f"probe: attention-qk needs a backbone that exposes its blocks' query/key projections "
                         f"(ViTs from Hugging Face, timm or OpenCLIP, not rotary-position ones); {backbone.info.spec} "
                         "has none")


#: The baselines that read the attention of the block that reads a layer: none for the last hidden state.
ATTENTION_BASELINES = ("attention-qk",)


def read_by_a_block(layer: int, n_layers: int) -> bool:
    """Whether some block reads hidden state `layer` (every one but the last; pixels and oracles have none)."""
    return 0 <= layer < n_layers


def layer_probes(probes: Sequence[str], layer: int, n_layers: int) -> list[str]:
    """The probes that run at `layer`: the attention baselines only where a block reads it."""
    return [p for p in probes if p not in ATTENTION_BASELINES or read_by_a_block(layer, n_layers)]


def wants_qk(probes: Sequence[str], attention_corr: bool = True) -> bool:
    """The run needs the backbone's query/key projections (the model, not only its cached tokens)."""
    return "attention-qk" in probes or (attention_corr and any(p in pair_probe_names(True) for p in probes))


def pair_configs(device: str, epochs: int | None, exclude_background: bool, pair_config: PairConfig | None = None,
                 train_config: PairTrainConfig | None = None) -> tuple[PairConfig, PairTrainConfig]:
    """The pair sampling and probe training settings of a run, validated (every executor's)."""
    pc = pair_config or PairConfig()
    pc = replace(pc, exclude_background=exclude_background or pc.exclude_background)
    pc.validate()
    tc = replace(train_config or PairTrainConfig(), device=resolve_device(device))
    if epochs is not None:
        tc = replace(tc, epochs=epochs)
    return pc, tc


def evaluate_issameobject(
    spec: str | Any,
    dataset: Path | Dataset,
    *,
    layers: str | Sequence[int] = "all",
    probes: Sequence[str] = DEFAULT_PROBES["issameobject"],
    seeds: Sequence[int] = (0,),
    device: str = "auto",
    dtype: str = "fp32",
    epochs: int | None = None,
    exclude_background: bool = False,
    limit: int | None = None,
    progress: bool = True,
    pair_config: PairConfig | None = None,
    train_config: PairTrainConfig | None = None,
    n_boot: int = 1000,
    attention_corr: bool = True,
    attention_perms: int = 1000,
) -> list[dict[str, Any]]:
    """IsSameObject result rows (task "issameobject", tokens "all"): one per (layer, probe, seed).

    `spec` is a backbone spec or an already resolved Backbone. With `attention_corr`,
    trained probe rows of layers a block reads, on backbones exposing query/key
    projections, get `attention_r`/`attention_p` (`attention_correlation`).
    Activations of every split come from `evaluators.extract.extract_activations` (one
    forward pass for all layers, cached). Provenance columns are left to the caller.
    """
    from evaluators.backbones import resolve_backbone
    from evaluators.extract import extract_activations  # the extraction stage is only needed here

    check_probes(probes)
    want_qk = wants_qk(probes, attention_corr)
    if want_qk:  # needs the model's weights as well as its cached tokens
        spec = resolve_backbone(spec) if isinstance(spec, str) else spec
        check_attention_qk(spec, probes)
    ds = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
    pc, tc = pair_configs(device, epochs, exclude_background, pair_config, train_config)
    acts = {
        s: extract_activations(spec, ds, s, layers=layers, views=("all",), device=device, dtype=dtype, progress=progress,
                               limit=limit)
        for s in ("train", "val", "test")
    }
    return evaluate_activations(
        acts, ds, probes=probes, seeds=seeds, pair_config=pc, train_config=tc, limit=limit, progress=progress,
        n_boot=n_boot, extra_config={"dtype": dtype},
        attention_qk=spec.attention_qk if want_qk else None, attention_perms=attention_perms,
    )


def evaluate_activations(
    acts: dict[str, Any],
    ds: Dataset,
    *,
    probes: Sequence[str] = DEFAULT_PROBES["issameobject"],
    seeds: Sequence[int] = (0,),
    pair_config: PairConfig = PairConfig(),
    train_config: PairTrainConfig = PairTrainConfig(),
    limit: int | None = None,
    progress: bool = True,
    n_boot: int = 1000,
    extra_config: dict[str, Any] | None = None,
    attention_qk: Callable[[int], AttentionQK | None] | None = None,
    attention_perms: int = 1000,
) -> list[dict[str, Any]]:
    """The rows of `evaluate_issameobject` from per-split `Activations` (anything with
    `.info`, `.layers`, `.grid` and `.get(layer, "all")`).

    `attention_qk` (layer -> the block that reads it, `Backbone.attention_qk`) is needed
    for the `attention-qk` baseline, which has no row at a layer no block reads (the last).
    Given, it also adds `attention_r`/`attention_p` to trained probe rows where a block
    reads the layer (`evaluate_layer`)."""
    check_probes(probes)
    if "attention-qk" in probes and attention_qk is None:
        raise BenchError("probe: attention-qk needs the backbone's query/key projections, not only its activations "
                         "(pass attention_qk=backbone.attention_qk)")
    test = acts["test"]
    if test.grid is None:
        raise BenchError(f"issameobject: backbone {test.info.spec!r} has no spatial tokens (it needs a patch grid)")
    labels = {s: split_patch_labels(ds, s, test.grid, pair_config.min_share, limit) for s in acts}
    info = test.info
    rows = []
    total = sum(len(layer_probes(probes, layer, info.n_layers)) for layer in test.layers) * len(seeds)
    with maybe_progress(progress, f"issameobject {info.spec}", total) as bar:
        for seed in seeds:
            pairs = {s: sample_pairs(labels[s], pair_config, derive_seed(seed, "issameobject", s)) for s in labels}
            config = replace(train_config, seed=int(seed))
            for layer in test.layers:
                here = layer_probes(probes, layer, info.n_layers)
                if not here:
                    continue
                tokens = {s: _limited(acts[s].get(layer, "all"), limit) for s in acts}
                qk = _reading_block(attention_qk, layer, info.n_layers, strict="attention-qk" in here)
                for r in evaluate_layer(tokens, pairs, here, config, n_boot, bar.advance if bar else None, qk=qk,
                                        attention_perms=attention_perms):
                    cfg = {
                        "task": "issameobject", "probe": r["probe"], "layer": int(layer), "seed": int(seed),
                        "pairs": asdict(pair_config), "train": {k: v for k, v in asdict(config).items() if k != "device"},
                        "limit": limit, **(extra_config or {}),
                    }
                    rows.append({
                        "backbone": info.spec, "backbone_family": info.family, "backbone_revision": info.revision,
                        "dataset": ds.name, "dataset_fingerprint": ds.fingerprint("test"), "split": "test",
                        "layer": int(layer), "n_layers": int(info.n_layers), "tokens": "all",
                        "task": "issameobject", "seed": int(seed),
                        "config": json.dumps(cfg, sort_keys=True), "config_hash": config_hash(cfg), **r,
                    })
    return rows


def _reading_block(attention_qk: Callable[[int], AttentionQK | None] | None, layer: int, n_layers: int,
                   strict: bool) -> AttentionQK | None:
    """The block that reads hidden state `layer`, or None (no block reads it, or no projections).
    Only the `attention-qk` baseline (`strict`) lets a failure to find them stop the run."""
    if attention_qk is None or not read_by_a_block(layer, n_layers):
        return None
    try:
        return attention_qk(layer)
    except BenchError:
        if strict:
            raise
        return None


def _limited(tokens: np.ndarray, limit: int | None) -> np.ndarray:
    return tokens if limit is None else tokens[:limit]


def maybe_progress(enabled: bool, description: str, total: int):
    """A progress bar (its handle has `advance`), or a context yielding None when disabled."""
    return progress_bar(description, total) if enabled else nullcontext(None)
