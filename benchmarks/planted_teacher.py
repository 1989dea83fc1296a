"""Benchmark: how close each probe family trains to a planted teacher's exact H(O|Z).

A fixed random teacher draws K target bits autoregressively from z ~ N(0, I_d):
logit_k = c_k + g_k(z) + u_k·o_<k, o_k ~ Bernoulli(σ(logit_k)). Along each sampled path
Σ_k h(σ(logit_k)) is exactly the teacher's conditional entropy of that path's bits, so its
test-set mean is H(O|Z) (up to the same sampling noise as the probes' test bits). The
excess L − H(O|Z) of a probe that can represent the teacher is then pure estimation and
optimisation error: 2,000 training scenes bound it from below, under-training adds to it.

Teachers (g_k is scaled so that it has standard deviation `--scale` over z):
- `linear`:    g_k = a_k·z — representable by every pooled family.
- `quadratic`: g_k = a_k·z + Σ_r s_kr (p_kr·z)², rank 2 — by quadratic and quadratic-shared.
- `mlp`:       g_k = v_k·gelu(W z + b), 32 hidden units — by the dnn (its trunk and head).
- `attention`: z is read as T tokens of d/T dims; g_k = w_k·Σ_t softmax_t(q_k·z_t) z_t — by
  the attention probe (a query per bit, softmax pooling, linear readout).

Probes are anchored on the teacher's marginal per-bit prior (estimated on 20,000 extra
draws), so "prior" (epoch 0, the untrained probe) is the reference a fit has to beat.
Reports, per (d, teacher, family): best epoch / epochs run, test bits L, H(O|Z), the gap
in bits and per bit, whether the fit converged, and wall time, with the evaluator's
default training settings (`TrainConfig()`, per-family learning rates from `evaluators.probes.families`).

    .venv/bin/python benchmarks/planted_teacher.py [--dims 64,1024] [--bits 32] [--n-train 2000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.probes.families import BINDING_PROBES  # noqa: E402
from evaluators.probes.build import build_probe, probe_optim  # noqa: E402
from evaluators.fitting import ProbeJob, RowReader, TrainConfig, fit_probes  # noqa: E402

#: Which families can represent each teacher (the ones trained on it).
TEACHERS = {
    "linear": ("linear", "quadratic", "quadratic-shared", "dnn"),
    "quadratic": ("quadratic", "quadratic-shared", "dnn"),
    "mlp": ("dnn",),
    "attention": ("attention",),
}


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class Teacher:
    """A fixed random autoregressive teacher of K bits given z (see the module docstring)."""

    def __init__(self, kind: str, d: int, k: int, tokens: int, scale: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.kind, self.d, self.k, self.tokens = kind, d, k, tokens
        self.c = rng.normal(0.0, 1.0, k)
        self.u = rng.normal(0.0, 1.0 / math.sqrt(k), (k, k)) * np.tril(np.ones((k, k)), -1)
        if kind in ("linear", "quadratic"):
            self.a = rng.normal(size=(k, d)) / math.sqrt(d)
        if kind == "quadratic":
            self.p = rng.normal(size=(k, 2, d)) / math.sqrt(d)
            self.s = rng.choice([-1.0, 1.0], (k, 2))
        if kind == "mlp":
            self.w, self.b = rng.normal(size=(32, d)) * 2 / math.sqrt(d), rng.normal(size=32)
            self.v = rng.normal(size=(k, 32)) / math.sqrt(32)
        if kind == "attention":
            dt = d // tokens
            self.q = rng.normal(size=(k, dt)) * 2 / math.sqrt(dt)
            self.wt = rng.normal(size=(k, dt)) / math.sqrt(dt)
        self.g_std = float(self.g(rng.normal(size=(5000, d))).std(0).mean()) / scale

    def g(self, z: np.ndarray) -> np.ndarray:
        """The z-dependent part of every bit's logit, N x K (before scaling)."""
        if self.kind == "linear":
            return z @ self.a.T
        if self.kind == "quadratic":
            return z @ self.a.T + np.einsum("kr,nkr->nk", self.s, np.einsum("krd,nd->nkr", self.p, z) ** 2 - 1.0)
        if self.kind == "mlp":
            return gelu(z @ self.w.T + self.b) @ self.v.T
        tok = z.reshape(len(z), self.tokens, -1)
        logits = np.einsum("ntd,kd->nkt", tok, self.q)
        attn = np.exp(logits - logits.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        return np.einsum("nkt,ntd,kd->nk", attn, tok, self.wt)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(z N x d, o N x K, exact conditional entropy in bits of each scene's path)."""
        z = rng.normal(size=(n, self.d))
        base = self.c + self.g(z) / self.g_std
        o = np.zeros((n, self.k))
        h = np.zeros(n)
        for j in range(self.k):
            p = 1.0 / (1.0 + np.exp(-(base[:, j] + o @ self.u[j])))
            o[:, j] = rng.random(n) < p
            pc = np.clip(p, 1e-12, 1 - 1e-12)
            h -= pc * np.log2(pc) + (1 - pc) * np.log2(1 - pc)
        return z.astype(np.float32), o.astype(np.uint8), h


def run(teacher: Teacher, families: tuple[str, ...], sizes: dict[str, int], config: TrainConfig, seed: int,
        reference: bool) -> None:
    """Train each family on the teacher's draws; print its recovered share of the recoverable bits,
    (prior − L) / (prior − H(O|Z)) on test, beside scikit-learn's tuned logistic regression."""
    rng = np.random.default_rng(seed + 1)
    data = {s: teacher.sample(n, rng) for s, n in sizes.items()}
    marginal = teacher.sample(20_000, rng)[1].mean(0).clip(1e-4, 1 - 1e-4)
    prior_logit = np.log(marginal / (1 - marginal)).astype(np.float32)
    spatial = {s: z.reshape(len(z), teacher.tokens, -1) for s, (z, _, _) in data.items()}
    targets = {s: o for s, (_, o, _) in data.items()}
    prior = {s: np.broadcast_to(prior_logit, o.shape).copy() for s, o in targets.items()}
    h_test = float(data["test"][2].mean())
    prior_bits = _bits(prior["test"], targets["test"])
    k = teacher.k

    def line(name: str, L: float, extra: str) -> None:
        share = (prior_bits - L) / (prior_bits - h_test)
        print(f"  {name:22s} {L:8.2f} {100 * share:7.1f}%  {extra}", flush=True)

    print(f"  {'prior (untrained)':22s} {prior_bits:8.2f} {0.0:7.1f}%  H(O|Z) = {h_test:.2f} bits")
    for fam in families:
        arrays = spatial if BINDING_PROBES.get(fam).spatial else {s: z for s, (z, _, _) in data.items()}
        inputs = {s: RowReader(a) for s, a in arrays.items()}
        model = build_probe(fam, arrays["train"].shape[-1], k, seed=seed)
        t0 = time.perf_counter()
        job = ProbeJob(fam, model, targets, prior=prior, optim=probe_optim(fam, arrays["train"].shape[-1]))
        r = fit_probes([job], inputs, config)[fam]
        wall = time.perf_counter() - t0
        assert r.error is None, r.error
        chosen = ", ".join(f"{key} {v:g}" if isinstance(v, float) else f"{key} {v}" for key, v in r.setting.items())
        line(fam, float(r.scene_bits.mean()), f"{wall:6.1f} s  epoch {r.best_epoch}; {chosen}")
    if reference and teacher.kind == "linear":
        t0 = time.perf_counter()
        L = sklearn_reference(data)
        line("sklearn LR (C on val)", L, f"{time.perf_counter() - t0:6.1f} s")


#: The reference's C grid (inverse L2 strength), chosen per bit on validation.
SKLEARN_CS = tuple(10.0 ** (e / 2) for e in range(-8, 9))


def sklearn_reference(data: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> float:
    """Mean test bits of scikit-learn's L2 logistic regression (L-BFGS), one per bit on
    [z, o_<k] (the teacher's own inputs), C chosen per bit on validation: the tuned
    reference a careful user would fit by hand."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scale = StandardScaler().fit(data["train"][0])
    z = {s: scale.transform(x) for s, (x, _, _) in data.items()}
    o = {s: y for s, (_, y, _) in data.items()}
    total = np.zeros(len(o["test"]))
    for j in range(o["train"].shape[1]):
        x = {s: np.concatenate([z[s], o[s][:, :j]], axis=1) for s in z}
        y = {s: o[s][:, j] for s in o}
        best = (math.inf, None)
        clf = LogisticRegression(max_iter=2000, warm_start=True)
        for c in SKLEARN_CS:
            clf.set_params(C=c).fit(x["train"], y["train"])
            val = _logloss_bits(clf.predict_proba(x["val"])[:, 1], y["val"]).mean()
            if val < best[0]:
                best = (val, _logloss_bits(clf.predict_proba(x["test"])[:, 1], y["test"]))
        total += best[1]
    return float(total.mean())


def _logloss_bits(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    return -np.log2(np.clip(np.where(y > 0, p, 1.0 - p), 1e-12, 1.0))


def _bits(logits: np.ndarray, o: np.ndarray) -> float:
    """Mean code length in bits per scene of independent-bit logits."""
    lp = -np.logaddexp(0.0, np.where(o > 0, -logits, logits))
    return float(-lp.sum(1).mean() / math.log(2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,1024")
    ap.add_argument("--bits", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16, help="tokens the attention teacher splits z into")
    ap.add_argument("--teachers", default=",".join(TEACHERS))
    ap.add_argument("--families", default=None, help="restrict to these families")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-val", type=int, default=500)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--scale", type=float, default=2.0, help="std of the z-dependent logit term")
    ap.add_argument("--epochs", type=int, default=None, help="override the epoch budget")
    ap.add_argument("--lr", type=float, default=None, help="override every family's learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-reference", action="store_true", help="skip scikit-learn's tuned logistic regression")
    args = ap.parse_args()
    torch.set_num_threads(1)  # probes are small: one thread, and timings that do not depend on the machine's load
    config = TrainConfig(lr=args.lr)
    if args.epochs is not None:
        config = replace(config, epochs=args.epochs)
    sizes = {"train": args.n_train, "val": args.n_val, "test": args.n_test}
    only = set(args.families.split(",")) if args.families else None
    print(f"planted teacher: K={args.bits} bits, {args.n_train}/{args.n_val}/{args.n_test} scenes, logit scale "
          f"{args.scale}, budget {config.epochs} epochs, torch threads {torch.get_num_threads()}")
    for d in (int(x) for x in args.dims.split(",")):
        for kind in args.teachers.split(","):
            fams = tuple(f for f in TEACHERS[kind] if only is None or f in only)
            if not fams:
                continue
            teacher = Teacher(kind, d, args.bits, args.tokens, args.scale, args.seed)
            print(f"\nd={d} teacher={kind}" + (f" ({args.tokens} tokens x {d // args.tokens})" if kind == "attention"
                                               else ""))
            print(f"  {'family':22s} {'L bits':>8s} {'share':>8s}  wall, settings chosen on validation")
            run(teacher, fams, sizes, config, args.seed, not args.no_reference)


if __name__ == "__main__":
    main()
