"""Exact autoregressive priors: p(f_k = 1 | f_<k) and p(o_k = 1 | o_<k, f) (docs/explanation/architecture.md §3).

Probes factor q(t) = Π_k q(t_k | t_<k) over the bits of F and of O in index order and
add a residual to the exact prior's logit, so the prior has to be evaluated at every
scene's own true prefix. Everything is a ratio of exact big-integer counts; floats
appear only in the final division (Python's int / int is correctly rounded), so a
scene's −Σ_k log2 p(observed bit) reproduces its −log2 P(f) and log2 |Ω(f)| to
round-off, and bits the prior fixes get probability exactly 0 or 1.

Methods:

- **F**: the split's F support (at most a few ten thousand codes) with exact integer
  weights (`SceneGenerator.f_support`). Every prefix of every code accumulates the
  weight of its codes; p(f_k = 1 | f_<k) = W(f_<k 1) / W(f_<k). Computed once per
  distinct F code of the rows.
- **O given F, covering sets** (`CoveringSets`: colorshape `balanced` and `uniform`,
  clevr): O is uniform over the subsets of f's active grid that hit every active value, with
  k_min..k_max cells; conjunctions outside the grid are 0 with certainty, and inside it
  p(o_j = 1 | prefix) is a ratio of completion counts (generators.covering_conditionals: a
  row programme for 2 groups, inclusion–exclusion with the prefix fixed otherwise).
- **O given F, listed sets** (`ListedSets`: toys): Ω(f) is small, so it is enumerated
  and the completion counts are counts of matching codes.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed
from generators.covering_conditionals import inclusion_exclusion_probs, row_programme_probs
from generators.from_card import generator_of
from generators.priors import CoveringSets, ListedSets, PriorsUnavailable, coverage_count
from generators.sampling import choose_weighted, sample_covering_cells

#: rows handled between two progress reports.
_CHUNK = 1000


# -- public API ------------------------------------------------------------------------------


def bit_priors(card: Mapping[str, Any], split: str, F: np.ndarray, O: np.ndarray,
               progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(pF, pO): float64 arrays N x n_F and N x n_O of p(bit = 1 | the row's own true prefix [, its f]).

    Raises PriorsUnavailable when the card lacks what is needed (no `generator`/`config`, unknown
    generator name, config that no longer builds) and BenchError naming the scene row when a row lies
    outside its split's support (an F code not in the split, or an O whose own observed bit has prior
    probability 0). `progress(n)` is called as rows are done (n rows at a time).
    """
    gen = generator_of(card)
    if split not in gen.plans:
        raise BenchError(f"split: {split!r} not in dataset; available: {', '.join(gen.plans)}")
    space = gen.feature_space
    F = np.asarray(F)
    O = np.asarray(O)
    if F.ndim != 2 or F.shape[1] != space.n_features or O.ndim != 2 or O.shape[1] != space.n_conjunctions \
            or len(F) != len(O):
        raise BenchError(f"codes: expected N x {space.n_features} F and N x {space.n_conjunctions} O, "
                         f"got {F.shape} and {O.shape}")
    F = (F != 0).astype(np.uint8)
    O = (O != 0).astype(np.uint8)
    bad = np.flatnonzero((space.o_to_f(O) != F).any(axis=1)) if len(O) else []
    if len(bad):
        raise BenchError(f"split {split!r} row {int(bad[0])}: its F is not the F of its O ({len(bad)} such rows)")
    pF = _f_priors(gen, split, F)
    pO = _o_priors(gen, split, F, O, progress)
    return pF, pO


def resample_o(card: Mapping[str, Any], F: np.ndarray, keys: Sequence[str], seed: int = 0) -> np.ndarray:
    """Object codes drawn afresh from the generator's exact p(O | F = f), one per row, independent
    of everything else about the scene (N x n_O uint8).

    The control null of a binding evaluation: with each scene's O replaced by such a draw, the
    image says nothing about O beyond its F, so every backbone's true β* is exactly 0, in its own
    representation space and at any width. Row i's draw depends only on (`seed`, `keys[i]`, its
    F), so it is the same whichever rows are drawn beside it. Raises PriorsUnavailable as
    `bit_priors` does.
    """
    gen = generator_of(card)
    space = gen.feature_space
    F = (np.asarray(F) != 0).astype(np.uint8)
    if F.ndim != 2 or F.shape[1] != space.n_features or len(F) != len(keys):
        raise BenchError(f"codes: expected {len(keys)} x {space.n_features} F, got {F.shape}")
    draw = _o_sampler(space, gen.o_given_f())
    out = np.zeros((len(F), space.n_conjunctions), dtype=np.uint8)
    for i, (f, key) in enumerate(zip(F, keys)):
        rng = random.Random(derive_seed("resampled-o", seed, key))
        out[i, draw(f, rng)] = 1
    return out


def _o_sampler(space: FeatureSpace, model: CoveringSets | ListedSets) -> Callable[[np.ndarray, random.Random], list[int]]:
    """A function drawing the conjunction ids of one O uniformly from Ω(f), for a generator's model."""
    if isinstance(model, CoveringSets):
        def covering(f: np.ndarray, rng: random.Random) -> list[int]:
            a, ids = _active_grid(space, f)
            ks = list(range(model.k_min, model.k_max + 1))
            k = ks[choose_weighted(rng, [coverage_count(k, a) for k in ks])]
            return [int(ids[np.ravel_multi_index(cell, a)]) for cell in sample_covering_cells(rng, a, k)]

        return covering
    by_f: dict[bytes, list[tuple[int, ...]]] = {}
    for s in model.sets:
        by_f.setdefault(space.o_to_f(space.encode_o(s)).tobytes(), []).append(tuple(s))

    def listed(f: np.ndarray, rng: random.Random) -> list[int]:
        return list(rng.choice(by_f[np.asarray(f, dtype=np.uint8).tobytes()]))

    return listed


def effective_f_codes(card: Mapping[str, Any], split: str) -> float:
    """1 / Σ_f P(f)^2 over the split's F distribution (the number of equally likely codes with the
    same concentration): intervals resample F codes, so this is their effective sample size.

    Read from the card's `n_F_eff` when it has one; older cards rebuild the split's plan.
    """
    stored = card.get("splits", {}).get(split, {})
    if isinstance(stored, Mapping) and "n_F_eff" in stored:
        return float(stored["n_F_eff"])
    gen = generator_of(card)
    if split not in gen.plans:
        raise BenchError(f"split: {split!r} not in dataset; available: {', '.join(gen.plans)}")
    weights = [w for _f, w in gen.f_support(split)]
    total = sum(weights)
    return total * total / sum(w * w for w in weights)


# -- F -----------------------------------------------------------------------------------------


def _f_priors(gen, split: str, F: np.ndarray) -> np.ndarray:
    space = gen.feature_space
    tree = _prefix_weights(gen, split)
    n_f = space.n_features
    if len(F) == 0:
        return np.zeros(F.shape, dtype=np.float64)
    uniq, inverse = np.unique(F, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    rows = np.empty((len(uniq), n_f), dtype=np.float64)
    for i, code in enumerate(uniq):
        bits = code.tolist()
        key = 0
        w = tree[0][0]
        if bits_key(bits) not in tree[n_f]:
            row = int(np.flatnonzero(inverse == i)[0])
            raise BenchError(f"split {split!r} row {row}: F code {space.f_key(code)} is not in the split's support")
        for k, b in enumerate(bits):
            w1 = tree[k + 1].get(2 * key + 1, 0)
            rows[i, k] = w1 / w
            key = 2 * key + b
            w = w1 if b else w - w1
    return rows[inverse]


def bits_key(bits: Sequence[int]) -> int:
    k = 0
    for b in bits:
        k = 2 * k + int(b)
    return k


_PREFIX_WEIGHTS: dict[tuple[int, str], list[dict[int, int]]] = {}


def _prefix_weights(gen, split: str) -> list[dict[int, int]]:
    """tree[k][prefix as an integer] = total weight of the support's codes with that k-bit prefix."""
    key = (id(gen), split)
    if key in _PREFIX_WEIGHTS:
        return _PREFIX_WEIGHTS[key]
    space = gen.feature_space
    n_f = space.n_features
    tree: list[dict[int, int]] = [dict() for _ in range(n_f + 1)]
    for code, w in gen.f_support(split):
        bits = [0] * n_f
        for off, vals in zip(space.offsets, code):
            for v in vals:
                bits[off + v] = 1
        full = bits_key(bits)
        for k in range(n_f + 1):
            p = full >> (n_f - k)
            tree[k][p] = tree[k].get(p, 0) + w
    _PREFIX_WEIGHTS[key] = tree
    return tree


# -- O given F ---------------------------------------------------------------------------------


def _o_priors(gen, split: str, F: np.ndarray, O: np.ndarray, progress) -> np.ndarray:
    space = gen.feature_space
    model = gen.o_given_f()
    out = np.zeros(O.shape, dtype=np.float64)
    if isinstance(model, CoveringSets):
        row_fn = _covering_rows(space, model)
    elif isinstance(model, ListedSets):
        row_fn = _listed_rows(space, model)
    else:  # pragma: no cover - a generator returning something new
        raise PriorsUnavailable(f"generator: {gen.name}'s O-given-F description {type(model).__name__} is not "
                                "supported; evaluate with --unanchored")
    # group rows by F: the active grid (and listed codes) are shared
    if len(F) == 0:
        return out
    uniq, inverse = np.unique(F, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    for i, f in enumerate(uniq):
        rows = order[bounds[i]:bounds[i + 1]]
        for start in range(0, len(rows), _CHUNK):
            chunk = rows[start:start + _CHUNK]
            row_fn(f, O, chunk, out, split)
            if progress is not None:
                progress(len(chunk))
    return out


def _outside(split: str, row: int, space: FeatureSpace, conj: int) -> BenchError:
    name = " ".join(space.conj_names(conj))
    return BenchError(f"split {split!r} row {row}: O bit {conj} ({name}) has prior probability 0 given its F "
                      "(the scene lies outside the split's support)")


def _active_grid(space: FeatureSpace, f: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """Active counts a and the conjunction ids of f's active grid, in lexicographic (= id) order."""
    active = [np.flatnonzero(f[off:off + s]) for off, s in zip(space.offsets, space.sizes)]
    ids = np.zeros(1, dtype=np.int64)
    for vals, s in zip(active, space.sizes):
        ids = (ids[:, None] * s + vals[None, :]).reshape(-1)
    return tuple(len(v) for v in active), ids


def _covering_rows(space: FeatureSpace, model: CoveringSets):
    k_min, k_max = model.k_min, model.k_max

    def run(f, O, rows, out, split):
        a, ids = _active_grid(space, f)
        local = O[np.ix_(rows, ids)]
        if len(a) == 2:
            probs = [row_programme_probs(a, bits, k_min, k_max) for bits in local.tolist()]
        else:
            probs = [inclusion_exclusion_probs(a, bits, k_min, k_max) for bits in local.tolist()]
        for r, (p, bad) in zip(rows, probs):
            if bad is not None:
                raise _outside(split, int(r), space, int(ids[bad]))
            out[r, ids] = p

    return run


# listed sets (toys): enumeration -------------------------------------------------------------


def _listed_rows(space: FeatureSpace, model: ListedSets):
    by_f: dict[bytes, np.ndarray] = {}
    for s in model.sets:
        o = space.encode_o(s)
        by_f.setdefault(space.o_to_f(o).tobytes(), []).append(o)
    codes = {k: np.stack(v) for k, v in by_f.items()}

    def run(f, O, rows, out, split):
        omega = codes.get(np.asarray(f, dtype=np.uint8).tobytes())
        if omega is None:  # pragma: no cover - F support and listed sets agree by construction
            raise BenchError(f"split {split!r} row {int(rows[0])}: F code {space.f_key(f)} has no object codes")
        n_o = O.shape[1]
        for r in rows:
            o = O[r]
            match = np.cumprod(omega == o[None, :], axis=1)  # code agrees with o on bits ≤ k
            prefix = np.ones((len(omega), n_o), dtype=np.int64)
            prefix[:, 1:] = match[:, :-1]
            n = prefix.sum(axis=0)
            n1 = (prefix * omega).sum(axis=0)
            if not match[:, -1].any():
                k = int(np.flatnonzero(match.sum(axis=0) == 0)[0])
                raise _outside(split, int(r), space, k)
            out[r] = n1 / n

    return run
