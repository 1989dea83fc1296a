"""Autoregressive binding probes (docs/explanation/architecture.md §3).

Every probe models q(t | z) = Π_k q(t_k | t_<k, z) for a binary target t (the object
code O, the feature code F, or O given F) and is trained teacher-forced: the forward
pass takes the true code and returns all K conditional logits at once. Summed binary
cross-entropies are then exactly -log2 q(t | z), the code length the metrics need.

Families differ only in how a conditional reads z:
- `linear`: logit_k = w_k·z + u_k·t_<k.
- `quadratic`: adds a low-rank symmetric form x_kᵀ W_k x_k on x_k = [z, cond, t_<k],
  W_k = P_kᵀ diag(s_k) P_k.
- `quadratic-shared`: the quadratic term is bilinear in z with factors shared across
  conjunctions, W_k = U_{colour(k)}ᵀ V_{shape(k)}: a probe that can only read binding
  through colour x shape products (if it matches `quadratic`, binding is bilinear).
- `dnn`: ONE masked autoregressive network (MADE, Germain et al. 2015) computing all K
  conditionals in a single pass, plus an unmasked trunk on z that every head may read.
- `attention`: over spatial tokens; bit k's query comes from a learned bit embedding
  and t_<k, a softmax over tokens pools values, and a quadratic readout scores them.

Inputs are standardised with training-set statistics (set by the trainer), so the same
learning rate works for oracle codes and for backbone features with large norms.

A probe computes a *residual* on top of an exact prior logit that the trainer adds
(docs/explanation/architecture.md §3, prior-anchored probes): every term that reaches the output starts at zero
(`zero_residual`), so an untrained probe codes exactly the prior and a representation
that adds nothing leaves it there. Unanchored probes (the paper's estimator) use the
same modules with a prior of 0 (p = 1/2 per bit).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bench.core.errors import BenchError
from evaluators.families import BINDING_PROBES, TOKEN_VIEWS, ProbeOptim
from evaluators.token_encoder import TokenEncoder

LR_WIDTH = 64


def probe_lr(lr: float, in_dim: int) -> float:
    """`lr` for inputs of width `in_dim`. Adam moves every weight by about lr per step, so a
    unit reading in_dim standardised inputs moves its pre-activation by about lr·sqrt(in_dim):
    scaling lr by 1/sqrt(in_dim) keeps that step, and the epoch the probe peaks at, the same
    across backbones (at z = 1024 and 1e-2, probes peaked after one epoch, far from the optimum)."""
    return lr * min(1.0, math.sqrt(LR_WIDTH / in_dim))


def check_family(family: str, view: str) -> None:
    """Reject an unknown family, or a family that cannot read the given token view."""
    spatial = BINDING_PROBES.get(family).spatial
    view_spatial = TOKEN_VIEWS.get(view).spatial
    if spatial and not view_spatial:
        raise BenchError(
            f"probe: {family!r} needs spatial tokens (--tokens all); view {view!r} has none"
        )
    if not spatial and view_spatial:
        readers = [n for n, f in BINDING_PROBES.items() if f.spatial]
        pooled = [n for n, v in TOKEN_VIEWS.items() if not v.spatial]
        raise BenchError(
            f"probe: {family!r} reads one pooled vector per scene; view {view!r} is spatial "
            f"(use {', '.join(readers)} for it, or --tokens {'/'.join(pooled)})"
        )


def conjunction_factors(sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Shared-factor indices of each O bit: (first-group value, conjunction of the rest).

    With colour x shape this is (colour(k), shape(k)), the sharing `quadratic-shared` tests.
    """
    n_rest = math.prod(sizes[1:])
    conj = np.arange(math.prod(sizes))
    return conj // n_rest, conj % n_rest


def shared_factors(sizes: tuple[int, ...]) -> dict[str, Any]:
    """quadratic-shared's hook (`ProbeFamily.conjunction_args`): an O-probe shares its factors
    across the conjunctions of one first-group value and of one rest (`conjunction_factors`)."""
    return {"factors": conjunction_factors(sizes)}


def feature_members(sizes: tuple[int, ...]) -> dict[str, Any]:
    """attention's hook (`ProbeFamily.conjunction_args`): an O-probe's bit shares its query and
    readout with the feature values it is made of (`conjunction_members`)."""
    return {"members": conjunction_members(sizes)}


def conjunction_members(sizes: tuple[int, ...]) -> np.ndarray:
    """M (n_conjunctions x n_features): M[k, v] = 1 iff conjunction k has feature value v (one
    per group, group-major like F), the feature values an O bit is made of."""
    conj = np.arange(math.prod(sizes))
    members = np.zeros((len(conj), sum(sizes)), dtype=np.float32)
    offset, rest = 0, math.prod(sizes)
    for size in sizes:
        rest //= size
        members[conj, offset + (conj // rest) % size] = 1.0
        offset += size
    return members


def zero_residual(layer: nn.Linear) -> nn.Linear:
    """A layer whose output reaches the logits, initialised at zero: the probe starts at its prior."""
    nn.init.zeros_(layer.weight)
    return layer


def strictly_lower(k: int) -> torch.Tensor:
    """Mask m[k, j] = 1 iff j < k: conditional k may only see earlier bits."""
    return torch.tril(torch.ones(k, k), diagonal=-1)


class Probe(nn.Module):
    """Shared parts: input standardisation, the linear autoregressive context, conditioning."""

    spatial = False
    #: The parameters of the probe's part that is linear in z (and in t_<k and the condition):
    #: `fit_probes` fits them first, by L-BFGS along an L2 path chosen on validation (a convex
    #: problem: no learning rate to tune, and every family starts from the same tuned linear
    #: probe). Names absent from a probe (a frozen context) are skipped. None: no linear stage.
    linear_names: tuple[str, ...] | None = ("w.weight", "bias", "context", "cond.weight")

    def linear_parameters(self) -> list[nn.Parameter]:
        """The parameters of the linear part (empty when the probe has no linear stage)."""
        names = set(self.linear_names or ())
        return [p for n, p in self.named_parameters() if n in names]

    def nonlinear_parameters(self) -> list[nn.Parameter]:
        """Everything the linear stage does not fit: what gradient training adds on top of it."""
        linear = {id(p) for p in self.linear_parameters()}
        return [p for p in self.parameters() if id(p) not in linear]

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0) -> None:
        super().__init__()
        self.in_dim, self.n_bits, self.cond_dim = in_dim, n_bits, cond_dim
        self.register_buffer("mu", torch.zeros(in_dim))
        self.register_buffer("sigma", torch.ones(in_dim))
        self.register_buffer("tril", strictly_lower(n_bits))
        self.context = nn.Parameter(torch.zeros(n_bits, n_bits))
        self.bias = nn.Parameter(torch.zeros(n_bits))
        self.cond = nn.Linear(cond_dim, n_bits, bias=False) if cond_dim else None
        if self.cond is not None:
            nn.init.zeros_(self.cond.weight)

    @property
    def trains_context(self) -> bool:
        """Whether the linear context of earlier bits is fitted (an anchored probe's is a zero buffer)."""
        return isinstance(self.context, nn.Parameter)

    def linear_design(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the standardised input the linear weights `w` read, the condition `cond` reads or None):
        the linear stage solves on these directly (`evaluators.linear_solver`)."""
        return (x - self.mu) / self.sigma, (cond if self.cond is not None else None)

    @torch.no_grad()
    def set_linear(self, w: torch.Tensor, bias: torch.Tensor, context: torch.Tensor | None,
                   cond: torch.Tensor | None) -> None:
        """Load the linear stage's solution (w: K x D, bias: K, context: K x K, cond: K x C)."""
        self.w.weight.copy_(w)
        self.bias.copy_(bias)
        if context is not None:
            self.context.copy_(context * self.tril)
        if cond is not None:
            self.cond.weight.copy_(cond)

    def set_standardization(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Standardise inputs with training statistics (constant dimensions are left as is)."""
        std = np.where(std > 1e-6, std, 1.0)
        self.mu.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.sigma.copy_(torch.as_tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        """All K conditional logits, teacher-forced on `target` (B x K in {0, 1})."""
        x = (x - self.mu) / self.sigma
        t = target.to(x.dtype)
        base = t @ (self.context * self.tril).T + self.bias
        if self.cond is not None:
            base = base + self.cond(cond)
        return base + self.readout(x, t, cond)

    def readout(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class LinearProbe(Probe):
    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))

    def readout(self, x, t, cond):
        return self.w(x)


class QuadraticProbe(Probe):
    """Linear terms plus Σ_r s_kr (P_k x_k)_r² on x_k = [z, cond, t_<k] (symmetric, rank r)."""

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, rank: int = 8) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        self.rank = rank
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))
        self.pz = nn.Linear(in_dim, n_bits * rank, bias=False)
        self.pc = nn.Linear(cond_dim, n_bits * rank, bias=False) if cond_dim else None
        self.pt = nn.Parameter(torch.randn(n_bits, rank, n_bits) / math.sqrt(n_bits))
        self.s = nn.Parameter(torch.zeros(n_bits, rank))

    @torch.no_grad()
    def init_from_moments(self, directions: torch.Tensor) -> None:
        """Start each bit's projections on its most class-discriminative quadratic directions
        (K x r' x D unit vectors, `class_directions`): from random directions the quadratic
        term recovered 0 % of a planted quadratic teacher's bits at 2,000 scenes. The earlier bits'
        part of the projections starts at zero: random, it fitted training noise within two epochs
        (384-d planted teacher, 10,000 scenes: validation 6.6 -> 9.4 bits)."""
        r = min(self.rank, directions.shape[1])
        self.pz.weight.view(self.n_bits, self.rank, -1)[:, :r] = directions[:, :r]
        self.pt.zero_()

    def readout(self, x, t, cond):
        b, k, r = x.shape[0], self.n_bits, self.rank
        proj = self.pz(x).view(b, k, r)
        if self.pc is not None:
            proj = proj + self.pc(cond).view(b, k, r)
        proj = proj + torch.einsum("bj,krj->bkr", t, self.pt * self.tril[:, None, :])
        return self.w(x) + (self.s * proj.square()).sum(-1)


class SharedQuadraticProbe(Probe):
    """Linear terms plus zᵀ U_{a(k)}ᵀ V_{b(k)} z with factor tables shared across bits."""

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, rank: int = 8,
                 factors: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        a, b = factors if factors is not None else (np.arange(n_bits), np.arange(n_bits))
        self.register_buffer("fa", torch.as_tensor(np.asarray(a), dtype=torch.long))
        self.register_buffer("fb", torch.as_tensor(np.asarray(b), dtype=torch.long))
        self.n_a, self.n_b, self.rank = int(self.fa.max()) + 1, int(self.fb.max()) + 1, rank
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))
        self.u = nn.Linear(in_dim, self.n_a * rank, bias=False)
        self.v = zero_residual(nn.Linear(in_dim, self.n_b * rank, bias=False))

    @torch.no_grad()
    def init_from_moments(self, directions: torch.Tensor) -> None:
        """Start each first-group factor U_a on the leading class-discriminative directions of
        its bits (`class_directions`, K x r' x D), taken over the bits that share it; the rest of
        the factor is zero, as the quadratic family's unconfirmed directions are."""
        r = min(self.rank, directions.shape[1])
        table = self.u.weight.view(self.n_a, self.rank, -1)
        for a in range(self.n_a):
            mine = directions[self.fa == a, :r]  # bits x r x D
            flat = mine.reshape(-1, mine.shape[-1])
            _, values, vh = torch.linalg.svd(flat, full_matrices=False)
            top = vh[:r][values[:r] > 1e-6]  # none where no direction was confirmed
            table[a] = 0.0  # a factor without a direction stays off (its V starts at zero too)
            table[a, : len(top)] = top

    def readout(self, x, t, cond):
        b = x.shape[0]
        uz = self.u(x).view(b, self.n_a, self.rank)[:, self.fa]
        vz = self.v(x).view(b, self.n_b, self.rank)[:, self.fb]
        return self.w(x) + (uz * vz).sum(-1) / math.sqrt(self.rank)


class MadeProbe(Probe):
    """One masked autoregressive network for all K conditionals (MADE) on an unmasked trunk.

    The trunk reads [z, cond] (degree 0: every head may use it). A masked hidden layer
    mixes trunk features with t: unit h has degree m_h, sees t_j iff j < m_h and feeds
    head k iff m_h <= k, so head k depends on t_j only for j < k. Heads also read the
    trunk directly, so early bits (few masked units) keep the full capacity on z.
    """

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, hidden: int = 256, depth: int = 1) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        layers: list[nn.Module] = []
        width = in_dim + cond_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        self.trunk = nn.Sequential(*layers)
        self.w = zero_residual(nn.Linear(in_dim, n_bits, bias=False))  # the linear stage's part
        self.head = zero_residual(nn.Linear(hidden, n_bits, bias=False))
        degree = torch.arange(hidden) * n_bits // hidden  # 0..K-1, evenly spread
        self.register_buffer("mask_in", (torch.arange(n_bits)[None, :] < degree[:, None]).float())
        self.register_buffer("mask_out", (degree[None, :] <= torch.arange(n_bits)[:, None]).float())
        self.made_z = nn.Linear(hidden, hidden)
        self.made_t = nn.Parameter(torch.randn(hidden, n_bits) / math.sqrt(n_bits))
        self.made_out = nn.Parameter(torch.zeros(n_bits, hidden))

    def readout(self, x, t, cond):
        h = self.trunk(torch.cat([x, cond], dim=-1) if self.cond_dim else x)
        m = F.gelu(self.made_z(h) + t @ (self.made_t * self.mask_in).T)
        return self.w(x) + self.head(h) + m @ (self.made_out * self.mask_out).T


class AttentionProbe(Probe):
    """Per-bit attention over spatial tokens, after a shared per-token encoder, with a quadratic
    readout of the pooled value.

    Every token first goes through one non-linear encoder shared by all bits (h_t = GELU(E x_t)),
    and keys and values are linear maps of h_t: with keys and values linear in the raw token, as
    the paper's probe has them, raw pixels read β* 0.07 although every object's colour and shape
    is in them (oracle:patches reads 1.0); the encoder lifted that to 0.57.

    Queries and readouts are shared across the feature values a bit is made of: bit k's query
    is Σ_v M_kv Q_v over its features v (one colour and one shape for an O bit, the feature
    itself for an F bit) plus a per-bit correction, and so are its readout vector and quadratic
    directions. "Is there a red square" then reuses what "is there a red circle" learned about
    red: 0.57 → 0.73 on raw pixels. Softmax over tokens pools values; the readout scores the
    pooled value by a linear and a low-rank symmetric quadratic form.
    """

    spatial = True
    linear_names = None  # its readout is linear in pooled values, not in z: no linear stage

    def __init__(self, in_dim: int, n_bits: int, cond_dim: int = 0, heads: int = 2, key_dim: int = 32,
                 rank: int = 8, width: int = 256, members: np.ndarray | None = None) -> None:
        super().__init__(in_dim, n_bits, cond_dim)
        self.heads, self.key_dim, self.rank = heads, key_dim, rank
        hd = heads * key_dim
        self.encoder = TokenEncoder(in_dim, width)
        self.keys = nn.Linear(width, hd, bias=False)
        self.values = nn.Linear(width, hd, bias=False)
        m = torch.eye(n_bits) if members is None else torch.as_tensor(np.asarray(members), dtype=torch.float32)
        self.register_buffer("members", m)  # K x V: bit k is made of feature values v with M_kv = 1
        n_values = m.shape[1]
        self.query = nn.Parameter(torch.randn(n_values, hd) / math.sqrt(hd))
        self.query_bit = nn.Parameter(torch.zeros(n_bits, hd))
        self.query_c = nn.Linear(cond_dim, hd, bias=False) if cond_dim else None
        self.w = nn.Parameter(torch.zeros(n_values, hd))
        self.w_bit = nn.Parameter(torch.zeros(n_bits, hd))
        self.p = nn.Parameter(torch.randn(n_values, rank, hd) / math.sqrt(hd))
        self.s = nn.Parameter(torch.zeros(n_bits, rank))

    def attend(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled values B x K x heads·d, attention B x K x heads x T)."""
        b, n_tok, _ = x.shape
        h, d, k = self.heads, self.key_dim, self.n_bits
        e = F.gelu(self.encoder(x))
        keys = self.keys(e).view(b, n_tok, h, d)
        vals = self.values(e).view(b, n_tok, h, d)
        q = self.members @ self.query + self.query_bit  # K x heads·d, the same for every scene
        if self.query_c is None:
            # one (B·T x d) @ (d x K) product per head rather than a per-scene batch of small ones
            scores = torch.einsum("bthd,khd->bkht", keys, q.view(k, h, d))
        else:
            q = q + self.query_c(cond)[:, None, :]
            scores = torch.einsum("bkhd,bthd->bkht", q.view(b, k, h, d), keys)
        attn = torch.softmax(scores / math.sqrt(d), dim=-1)
        pooled = torch.einsum("bkht,bthd->bkhd", attn, vals).reshape(b, k, h * d)
        return pooled, attn

    def readout(self, x, t, cond):
        pooled, _ = self.attend(x, t, cond)
        w = self.members @ self.w + self.w_bit
        # each bit's directions first (K x r x d), then one small product per bit: contracting the
        # three factors at once let einsum build a (V·d) x (B·K) product, a third of a step
        directions = torch.einsum("kv,vrd->krd", self.members, self.p)
        proj = torch.einsum("bkd,krd->bkr", pooled, directions)
        return (pooled * w).sum(-1) + (self.s * proj.square()).sum(-1)

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of every bit's query over tokens (B x K x heads x T), teacher-forced."""
        x = (x - self.mu) / self.sigma
        return self.attend(x, target.to(x.dtype), cond)[1]


def probe_optim(family: str, in_dim: int, **overrides: Any) -> ProbeOptim:
    """The optimiser settings of a `family` probe over inputs of width `in_dim`: its entry's
    defaults (with `overrides`), the learning rate scaled by `probe_lr` unless the entry says `raw_lr`."""
    entry = BINDING_PROBES.get(family)
    params = {**entry.defaults, **overrides}
    lr = params["lr"] if entry.raw_lr else probe_lr(params["lr"], in_dim)
    return ProbeOptim(lr, params.get("weight_decay", ProbeOptim.weight_decay), params.get("ema"), entry.device_batches,
                      entry.patience, entry.lr_patience, entry.cpu_steps, entry.amp)


def build_probe(family: str, in_dim: int, n_bits: int, *, cond_dim: int = 0, seed: int = 0, anchored: bool = False,
                **hparams: Any) -> Probe:
    """A probe of `family` over inputs of width `in_dim` (per token for spatial families)
    predicting `n_bits` bits, optionally also given a `cond_dim`-bit condition (F). `hparams`
    override the entry's constructor defaults or add what its hook gives (`ProbeFamily.conjunction_args`);
    optimiser settings are not the module's (`probe_optim`).

    `anchored`: the probe will be added to an exact prior logit, so it has no linear
    context of earlier bits: the exact prior already says all that they say, and the term
    could only refit it from finite data — on calibration oracles it leaked 1.9 bits per
    scene of noise into scenes whose input carries nothing (linear probe, oracle:mix-0.5,
    2,000 scenes). The bias stays: with it a residual can set the threshold at which it
    reads an input feature (F-bits are ORs of O-bits: 2.3 bits of L_F without it).

    Its initial weights depend on `seed` alone (not on what the global RNG did before),
    so a result row is reproducible whichever other probes were built beside it.
    """
    entry = BINDING_PROBES.get(family)
    with torch.random.fork_rng(devices=[]):
        # the CPU generator only (the modules are built on the CPU): `torch.manual_seed` also
        # queues a seed for every accelerator not yet started, with a stack trace each (1.3 ms a
        # probe, ~0.5 s of a 26-row-set fit), and would reseed the user's CUDA generator
        torch.default_generator.manual_seed(seed)
        probe = entry.probe_class()(in_dim, n_bits, cond_dim, **entry.constructor_args(**hparams))
    if anchored:
        frozen = probe.context.detach()
        del probe.context
        probe.register_buffer("context", frozen)
    return probe


def anchor(residual: torch.Tensor, prior: torch.Tensor | None) -> torch.Tensor:
    """Logits = prior logit + residual. A prior of ±inf is a bit the prior fixes: it stays ±inf
    (the residual cannot move it) and `scene_bits` charges it nothing."""
    if prior is None:
        return residual
    return torch.where(torch.isfinite(prior), prior + residual, prior)


def scene_bits(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-log2 q(t | z) per scene: the summed per-bit cross-entropy in bits.

    Infinite logits are bits fixed by an exact prior; the target always agrees with them
    (the priors check that every scene lies in its distribution's support), so they cost 0.
    """
    logits = logits.float()
    fixed = torch.isinf(logits)
    bce = F.binary_cross_entropy_with_logits(torch.where(fixed, 0.0, logits), target.float(), reduction="none")
    return torch.where(fixed, 0.0, bce).sum(-1) / math.log(2)
