"""IsSameObject scorers: the trained pair probes and the bias-only baselines, and how each is fitted
(the package docstring, `evaluators.tasks.issameobject`, says what each computes and why)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import nn
from torch.nn import functional as F

from bench.core.errors import BenchError
from evaluators.backbones.base import AttentionQK
from evaluators.fitting.early_stopping import Plateau
from evaluators.probes.families import ISSAMEOBJECT_PROBES, pair_probe_names

SAMPLINGS = ("balanced", "natural")


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
    """A trained pair probe over D-wide tokens, as its registry entry (`ISSAMEOBJECT_PROBES`) makes it."""
    entry = ISSAMEOBJECT_PROBES.get(name)
    if entry.cls is None:
        raise BenchError(f"probe: {name!r} is not a trained pair probe; trained: {', '.join(pair_probe_names(True))}")
    return entry.probe_class()(d, *(getattr(config, a) for a in entry.config_args))


def similarity(name: str, x: np.ndarray, y: np.ndarray, qk: AttentionQK | None = None) -> np.ndarray:
    """A baseline's raw similarity per pair (larger = more likely the same object), by its registry
    entry's `similarity`; `qk` is the projections of the block that reads these tokens (`reads_qk`)."""
    entry = ISSAMEOBJECT_PROBES.get(name)
    if entry.similarity is None:
        raise BenchError(f"probe: {name!r} is not a similarity baseline; baselines: "
                         f"{', '.join(n for n, p in ISSAMEOBJECT_PROBES.items() if p.similarity is not None)}")
    return entry.similarity_function()(x, y, qk)


def dot_similarity(x: np.ndarray, y: np.ndarray, qk: AttentionQK | None = None) -> np.ndarray:
    return np.einsum("pd,pd->p", x, y, dtype=np.float64)


def cosine_similarity(x: np.ndarray, y: np.ndarray, qk: AttentionQK | None = None) -> np.ndarray:
    nx, ny = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
    return np.einsum("pd,pd->p", x, y, dtype=np.float64) / np.maximum(nx * ny, 1e-12)


def distance_similarity(x: np.ndarray, y: np.ndarray, qk: AttentionQK | None = None) -> np.ndarray:
    return -np.linalg.norm(x.astype(np.float64) - y, axis=1)


def attention_qk_similarity(x: np.ndarray, y: np.ndarray, qk: AttentionQK | None = None) -> np.ndarray:
    if qk is None:
        raise BenchError("probe: attention-qk needs the query/key projections of the block that reads these "
                         "tokens, and none were given")
    return attention_qk_scores(qk, x, y)


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
    """A trained scorer: `score(x, y)` gives P(same) for raw token pairs (P, D) x (P, D).

    A trained probe also keeps its `model` (the pair probe, on standardised tokens) and the
    standardisation (`mean`, `std`, per dimension, from the training tokens), so that what it
    learned can be read back: the binding subspace is the quadratic probe's U, V in raw space
    (`evaluators.interventions.subspace`). Baselines leave them None."""

    name: str
    score_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]
    best_epoch: int = -1
    history: list | None = None
    model: nn.Module | None = None
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

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
    entry = ISSAMEOBJECT_PROBES.get(name)
    if entry.trained:
        return _fit_probe(name, train, val, config)
    if entry.similarity is None:  # the majority class
        p = float(same.mean() >= 0.5)
        return FittedScorer(name, lambda x, y: np.full(len(x), p))
    qk = qk.copy_to(config.device) if entry.reads_qk and qk is not None else None
    s = similarity(name, u[ix], u[iy], qk)
    if not np.isfinite(s).all():  # finite tokens can still overflow (float32 attention scores)
        raise FloatingPointError(f"the {name} similarities of the training pairs hold NaN or inf")
    center, scale = float(s.mean()), float(s.std()) or 1.0
    b = fit_bias((s - center) / scale, same)
    return FittedScorer(name, lambda x, y: _sigmoid((similarity(name, x, y, qk) - center) / scale + b))


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
    plateau, best_epoch, best_state, history = Plateau(math.inf, config.patience, config.min_delta), -1, None, []
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
        if plateau.improved(v):
            best_epoch, best_state = epoch, copy.deepcopy(model.state_dict())
        elif plateau.stopped:
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

    return FittedScorer(name, score, best_epoch, history, model=model, mean=mean, std=std)


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
