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
  clevr): O is uniform over the subsets T of f's active grid (a_1 x … x a_G cells,
  which in conjunction order are the grid in lexicographic order) with k_min ≤ |T| ≤
  k_max hitting every active value. Conjunctions outside the grid are 0 with
  certainty. Inside, with the cells before position j decided, N(prefix) counts the
  completions and p(o_j = 1 | prefix) = N(prefix, 1) / N(prefix).
  - 2 groups: the row-by-row programme of `generators.priors.grid_completions` (the
    sampler's own counts). The state of a prefix ending inside row r is (rows after r,
    covered columns, cells used, whether row r has a cell yet, and how many of row r's
    undecided columns are uncovered / covered); the rest of row r is summed over how
    many of its cells fall in each kind, C(·,t)·C(·,u), then the later rows come from
    the programme. Columns are exchangeable, so these few integers are the whole state
    and the count is memoised on them.
  - 3 or more groups (and 1): inclusion–exclusion with the prefix fixed. With S the
    chosen prefix cells (x of them) and M_g the active values of group g that S does
    not hit, N = Σ_{D_g ⊆ M_g} (−1)^{Σ|D_g|} Σ_{k∈K} C(#undecided cells avoiding D, k − x).
    The undecided cells are the lexicographic suffix starting at coordinates q, and the
    number of them avoiding D depends on D only through per-group summaries (how many
    of D_g lie above q_g, whether q_g ∈ D_g, how many below); the summaries of each group
    are weighted by binomials and folded group by group from the last, carrying the
    pair (cells of the sub-grid after group g, suffix cells after group g). Memoised on
    (grid, q, x, per-group summary of M).
- **O given F, listed sets** (`ListedSets`: toys): Ω(f) is small, so it is enumerated
  and the completion counts are counts of matching codes.
"""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError
from bench.core.hashing import derive_seed, stable_json
from generators.priors import CoveringSets, ListedSets, PriorsUnavailable, coverage_count, grid_completions
from generators.sampling import choose_weighted, sample_covering_cells

#: rows handled between two progress reports.
_CHUNK = 1000


# -- rebuilding the generator from a card ----------------------------------------------------

_GENERATORS: dict[str, Any] = {}


def generator_of(card: Mapping[str, Any]):
    """The generator that wrote a card, rebuilt from its name and full config (memoised).

    Raises PriorsUnavailable when the card has no generator or config, names an unknown
    generator, was written by another version of it, or its config no longer builds or
    no longer reproduces the card's feature space and split priors.
    """
    from generators.base import get_generator

    gen_info, config = card.get("generator"), card.get("config")
    if not isinstance(gen_info, Mapping) or "name" not in gen_info or not isinstance(config, Mapping):
        raise PriorsUnavailable(
            f"dataset card: no generator config (schema {card.get('schema_version', 0)}); regenerate it with "
            "`bench generate ...`, or pass --unanchored")
    name = gen_info["name"]
    regen = f"regenerate it with `bench generate {name} ...`, or pass --unanchored"
    key = stable_json([gen_info, config, card.get("feature_space")])
    if key in _GENERATORS:
        return _GENERATORS[key]
    try:
        cls = get_generator(name)
    except BenchError:
        raise PriorsUnavailable(f"dataset card: unknown generator {name!r}; {regen}") from None
    if gen_info.get("version") != cls.version:
        raise PriorsUnavailable(f"dataset card: written by {name} v{gen_info.get('version')}, this is "
                                f"v{cls.version} (its distribution may differ); {regen}")
    try:
        gen = cls(_config(cls.config_cls, config))
    except (BenchError, TypeError, ValueError) as e:
        raise PriorsUnavailable(f"dataset card: its {name} config no longer builds here ({_one_line(e)}); "
                                f"{regen}") from None
    if "feature_space" in card and gen.feature_space != FeatureSpace.from_dict(card["feature_space"]):
        raise PriorsUnavailable(f"dataset card: its {name} config rebuilds a different feature space; {regen}")
    for split, info in card.get("splits", {}).items():
        plan = gen.plans.get(split)
        if plan is None or not _same_priors(plan.priors.to_dict(), info):
            raise PriorsUnavailable(f"dataset card: its {name} config no longer reproduces split {split!r}'s "
                                    f"priors; {regen}")
    _GENERATORS[key] = gen
    return gen


def _config(cls: type, values: Mapping[str, Any]):
    """The config dataclass from a card's dict (JSON lists back to the tuple fields)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unknown parameter(s) {', '.join(unknown)}")
    out = {}
    for k, v in values.items():
        if isinstance(v, list) and typing.get_origin(hints.get(k)) is tuple:
            v = tuple(v)
        out[k] = v
    return cls(**out)


def _same_priors(rebuilt: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    for k in ("n_F_codes", "H_O", "H_F", "H_O_given_F"):
        if k in stored and not math.isclose(float(rebuilt[k]), float(stored[k]), rel_tol=1e-12, abs_tol=1e-12):
            return False
    return True


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


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
            probs = [_row_dp_probs(a, bits, k_min, k_max) for bits in local.tolist()]
        else:
            probs = [_ie_probs(a, bits, k_min, k_max) for bits in local.tolist()]
        for r, (p, bad) in zip(rows, probs):
            if bad is not None:
                raise _outside(split, int(r), space, int(ids[bad]))
            out[r, ids] = p

    return run


# 2 groups: the row programme ---------------------------------------------------------------


@lru_cache(maxsize=None)
def row_prefix_count(rows_after: int, cols: int, covered: int, used: int, has_cell: bool,
                     free_new: int, free_old: int, k_min: int, k_max: int) -> int:
    """Completions of a 2-group grid whose current row still has `free_new` undecided cells in
    uncovered columns and `free_old` in covered ones (`covered` columns hit and `used` cells
    chosen so far, `has_cell`: the current row already has one), with `rows_after` rows to go
    and k_min ≤ total cells ≤ k_max, every row and column hit."""
    total = 0
    for t in range(free_new + 1):
        for u in range(free_old + 1):
            if not has_cell and t + u == 0:
                continue
            n = used + t + u
            if n > k_max:
                break
            later = sum(grid_completions(rows_after, cols, covered + t, n, k) for k in range(max(k_min, n), k_max + 1))
            if later:
                total += math.comb(free_new, t) * math.comb(free_old, u) * later
    return total


def _row_dp_probs(a: tuple[int, int], bits: list[int], k_min: int, k_max: int):
    """p(cell j = 1 | cells < j) along a row-major a_1 x a_2 grid; (probs, None) or (_, j of a 0-prior bit)."""
    rows, cols = a
    probs = [0.0] * (rows * cols)
    col_cov = [False] * cols  # covered by the rows before the current one
    covered = 0
    used = 0
    n = None
    j = 0
    for r in range(rows):
        rows_after = rows - r - 1
        free_new = cols - covered
        free_old = covered
        has = False
        row_new = []
        if n is None:
            n = row_prefix_count(rows_after, cols, covered, used, has, free_new, free_old, k_min, k_max)
        for c in range(cols):
            if col_cov[c]:
                free_old -= 1
                n1 = row_prefix_count(rows_after, cols, covered, used + 1, True, free_new, free_old, k_min, k_max)
            else:
                free_new -= 1
                n1 = row_prefix_count(rows_after, cols, covered + 1, used + 1, True, free_new, free_old, k_min, k_max)
            probs[j] = n1 / n
            n = _decide(n, n1, bits[j])
            if n == 0:
                return probs, j
            if bits[j]:
                used += 1
                has = True
                if not col_cov[c]:
                    covered += 1
                    row_new.append(c)
            j += 1
        for c in row_new:
            col_cov[c] = True
    return probs, None


def _decide(n: int, n1: int, bit: int) -> int:
    """Completions left once a cell is decided: `n1` of the `n` choose it, the rest leave it.
    0 means the observed bit had prior probability 0 (the walk stops there)."""
    return n1 if bit else n - n1


# 1 or ≥ 3 groups: inclusion–exclusion with a fixed prefix ------------------------------------


@lru_cache(maxsize=None)
def ie_prefix_count(a: tuple[int, ...], q: tuple[int, ...], x: int, missing: tuple[tuple[int, int, int], ...],
                    k_min: int, k_max: int) -> int:
    """Completions of the lexicographic suffix of the a-grid starting at cell q (inclusive), x
    cells already chosen, so that k_min ≤ |O| ≤ k_max and every value is hit. `missing[g]` =
    (values of group g not hit yet above q_g, whether q_g is one, how many below q_g).

    Inclusion–exclusion over the sets D_g of missing values forbidden: the cells of the suffix
    avoiding D number T = Σ_g [q_h ∉ D_h, h < g] · free_g · Π_{h>g} (a_h − |D_h|), free_g the
    values of group g after q_g (at or after, for the last group) outside D_g, so D enters only
    through per-group summaries (above, at, below), each weighted C(m_above, above)·C(m_below, below).
    Folding the groups from the last keeps {(R, T): signed weight}, R the sub-grid's cells.
    """
    G = len(a)
    states: dict[tuple[int, int], int] = {(1, 0): 1}  # (R_{g+1}, T_{g+1}) past the last group
    for g in range(G - 1, -1, -1):
        m_above, q_missing, m_below = missing[g]
        last = g == G - 1
        nxt: dict[tuple[int, int], int] = {}
        for above in range(m_above + 1):
            w_above = math.comb(m_above, above)
            for at in range(q_missing + 1):
                free = (a[g] - q[g] - above - at) if last else (a[g] - 1 - q[g] - above)
                for below in range(m_below + 1):
                    d = above + at + below
                    w = w_above * math.comb(m_below, below) * (-1 if d % 2 else 1)
                    for (r, t), ws in states.items():
                        key = ((a[g] - d) * r, free * r + (0 if at else t) if not last else free)
                        nxt[key] = nxt.get(key, 0) + w * ws
        states = nxt
    total = 0
    for (_r, t), ws in states.items():
        if ws:
            total += ws * sum(math.comb(t, k - x) for k in range(max(k_min, x), k_max + 1))
    return total


def _ie_probs(a: tuple[int, ...], bits: list[int], k_min: int, k_max: int):
    """p(cell j = 1 | cells < j) along the lexicographic a-grid, by `ie_prefix_count`."""
    G = len(a)
    m = math.prod(a)
    probs = [0.0] * m
    hit = [[False] * s for s in a]
    x = 0
    n = None
    for j in range(m):
        q = []
        rest = j
        for s in reversed(a):
            rest, v = divmod(rest, s)
            q.append(v)
        q = tuple(reversed(q))
        if n is None:
            n = ie_prefix_count(a, q, x, _missing(a, q, hit, None), k_min, k_max)
        # the prefix with cell j chosen: the suffix starts after q, and q's values are hit
        n1 = _count_after(a, j + 1, x + 1, hit, q, k_min, k_max)
        probs[j] = n1 / n
        n = _decide(n, n1, bits[j])
        if n == 0:
            return probs, j
        if bits[j]:
            x += 1
            for g in range(G):
                hit[g][q[g]] = True
    return probs, None


def _count_after(a, start, x, hit, chosen, k_min, k_max) -> int:
    """Completions when cells < `start` are decided (`chosen`'s values counted as hit too)."""
    G = len(a)
    if start == math.prod(a):  # nothing left: every value must be hit and x in range
        ok = k_min <= x <= k_max and all(all(h or v == chosen[g] for v, h in enumerate(hit[g])) for g in range(G))
        return int(ok)
    rest = start
    q = []
    for s in reversed(a):
        rest, v = divmod(rest, s)
        q.append(v)
    q = tuple(reversed(q))
    return ie_prefix_count(a, q, x, _missing(a, q, hit, chosen), k_min, k_max)


def _missing(a, q, hit, chosen) -> tuple[tuple[int, int, int], ...]:
    out = []
    for g, s in enumerate(a):
        h = hit[g]
        c = None if chosen is None else chosen[g]
        miss = [not h[v] and v != c for v in range(s)]
        out.append((sum(miss[q[g] + 1:]), int(miss[q[g]]), sum(miss[:q[g]])))
    return tuple(out)


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
