"""Exact p(o_j = 1 | o_<j, f) when O is uniform over covering sets (`CoveringSets`: colorshape
`balanced` and `uniform`, clevr); generators.conditionals applies it to a split's rows.

O is uniform over the subsets T of f's active grid (a_1 x … x a_G cells, which in conjunction
order are the grid in lexicographic order) with k_min ≤ |T| ≤ k_max hitting every active value.
With the cells before position j decided, N(prefix) counts the completions and
p(o_j = 1 | prefix) = N(prefix, 1) / N(prefix), a ratio of exact big integers.

- 2 groups (`row_programme_probs`): the row-by-row programme of
  `generators.priors.grid_completions` (the sampler's own counts). The state of a prefix ending
  inside row r is (rows after r, covered columns, cells used, whether row r has a cell yet, and
  how many of row r's undecided columns are uncovered / covered); the rest of row r is summed
  over how many of its cells fall in each kind, C(·,t)·C(·,u), then the later rows come from the
  programme. Columns are exchangeable, so these few integers are the whole state and the count
  is memoised on them.
- 3 or more groups (and 1) (`inclusion_exclusion_probs`): inclusion–exclusion with the prefix
  fixed. With S the chosen prefix cells (x of them) and M_g the active values of group g that S
  does not hit, N = Σ_{D_g ⊆ M_g} (−1)^{Σ|D_g|} Σ_{k∈K} C(#undecided cells avoiding D, k − x).
  The undecided cells are the lexicographic suffix starting at coordinates q, and the number of
  them avoiding D depends on D only through per-group summaries (how many of D_g lie above q_g,
  whether q_g ∈ D_g, how many below); the summaries of each group are weighted by binomials and
  folded group by group from the last, carrying the pair (cells of the sub-grid after group g,
  suffix cells after group g). Memoised on (grid, q, x, per-group summary of M).

Both walk a row's bits and return (probs, None), or (probs so far, j) when the observed bit j
had prior probability 0.
"""

from __future__ import annotations

import math
from functools import lru_cache

from generators.priors import grid_completions


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


def row_programme_probs(a: tuple[int, int], bits: list[int], k_min: int,
                        k_max: int) -> tuple[list[float], int | None]:
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


def inclusion_exclusion_probs(a: tuple[int, ...], bits: list[int], k_min: int,
                              k_max: int) -> tuple[list[float], int | None]:
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
