"""`bench plot ablation`: what an intervention on a subspace does to a metric, against its strength.

One line per (dataset, base backbone, intervention kind, subspace kind) and probe column, with its
interval band; each point is an intervened backbone's cell exactly as the board computes it, and
the base backbone's own cell stands at the kind's identity strength (shuffle 0, inject 1, remove
0: the unchanged network), so every line starts from what the network does untouched. The
subspace kind (binding, or a control: random, feature, shuffled-labels) is read from the
subspace file's name, which a study's sweep writes as `<backbone>-L<layer>-<kind>-...`
(`bench.studies.sweeps.subspace_name`); a file named otherwise is drawn under its own name.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from bench.core.errors import BenchError
from bench.core.intervention_specs import IDENTITY_STRENGTH, SUBSPACE_KINDS, is_intervened, parse_intervention
from bench.core.labels import drawn_as_written
from leaderboards.board import Leaderboard, build_leaderboard
from leaderboards.compare import name_of
from leaderboards.plots import FORMATS, Point, save_figure
from leaderboards.render import column_name

#: A line of the figure: (dataset, base backbone, intervention kind, subspace kind, probe column).
SeriesKey = tuple[str, str, str, str, tuple[str, str]]


def subspace_kind(path: str) -> str:
    """The subspace kind a subspace file's name says (`SUBSPACE_KINDS`, longest first), else its stem."""
    stem = Path(path).stem
    tokens = f"-{stem}-"
    return next((k for k in sorted(SUBSPACE_KINDS, key=len, reverse=True) if f"-{k}-" in tokens), stem)


def ablation_series(rows: Sequence[dict[str, Any]], *, layer: str | int = "last",
                    **selection: Any) -> tuple[Leaderboard, dict[SeriesKey, list[Point]]]:
    """The board of `rows` at `layer` and, per line, its points (strength, value, lo, hi, failed)
    sorted by strength, the base's cell at the identity strength where no intervened row is.
    BenchError when no row is an intervened backbone's."""
    specs = {r["backbone"]: r.get("spec") or r["backbone"] for r in rows}
    if not any(is_intervened(s) for s in specs.values()):
        raise BenchError("plot: no intervened backbone (intervene:...) in these results; an ablation plot draws "
                         "intervened backbones' metrics against strength")
    board = build_leaderboard(rows, layer=layer, ranked=False, **selection)
    cells = {(r.dataset, r.backbone): r.cells for r in board.rows if r.control is None}
    series: dict[SeriesKey, list[Point]] = defaultdict(list)
    for (ds, name), row_cells in cells.items():
        if not is_intervened(specs[name]):
            continue
        spec = parse_intervention(specs[name])
        base = name_of(specs, spec.base) or spec.base
        for col, c in row_cells.items():
            if c is not None and c.status == "ok":
                key = (ds, base, spec.kind, subspace_kind(spec.subspace), col)
                series[key].append((spec.strength, c.value, c.lo, c.hi, bool(c.checks)))
    for (ds, base, kind, sub, col), points in series.items():
        own = cells.get((ds, base), {}).get(col)
        if own is not None and own.status == "ok" and IDENTITY_STRENGTH[kind] not in {p[0] for p in points}:
            points.append((IDENTITY_STRENGTH[kind], own.value, own.lo, own.hi, bool(own.checks)))
    if not series:
        raise BenchError("plot: the intervened backbones have no finished value to draw for this selection")
    return board, {k: sorted(v) for k, v in sorted(series.items())}


@drawn_as_written
def ablation_curves(board: Leaderboard, series: dict[SeriesKey, list[Point]], out: str | os.PathLike,
                    formats: Sequence[str] = FORMATS) -> list[Path]:
    """`ablation_series`' lines drawn: metric vs intervention strength, a panel per base backbone
    (rows), dataset and probe column (columns), in it a line per kind (its dash) and subspace kind
    (its colour, the same in every panel) with its interval band (PNG and SVG, or the `formats`
    given). One panel a base keeps a study of many backbones legible."""
    import matplotlib.pyplot as plt
    import numpy as np

    scale = 100.0 if board.metric.unit == "%" else 1.0
    bases = sorted({k[1] for k in series})
    columns = [(ds, c) for ds in sorted({k[0] for k in series}) for c in board.columns
               if any(k[0] == ds and k[4] == c for k in series)]  # (dataset, probe column)
    fig, axes = plt.subplots(len(bases), len(columns), figsize=(3.6 * len(columns), 2.6 * len(bases)),
                             squeeze=False, sharex=True)
    subspaces = sorted({k[3] for k in series})
    cmap = plt.get_cmap("tab10")
    styles = {"shuffle": "-", "inject": "--", "remove": ":"}
    for r, base in enumerate(bases):
        for c, (ds, col) in enumerate(columns):
            ax = axes[r][c]
            for (d, b, kind, sub, cl), points in series.items():
                if (d, b, cl) != (ds, base, col):
                    continue
                x = np.array([p[0] for p in points])
                color = cmap(subspaces.index(sub) % 10)
                ax.plot(x, np.array([p[1] for p in points]) * scale, marker="o", ms=3, ls=styles.get(kind, "-."),
                        color=color, label=f"{kind} · {sub} subspace")
                if all(p[2] is not None and p[3] is not None for p in points):
                    ax.fill_between(x, [p[2] * scale for p in points], [p[3] * scale for p in points], color=color,
                                    alpha=0.12, lw=0)
            ax.set_title(f"{base} · {ds}" + (f" · {column_name(col)}" if len(board.columns) > 1 else ""), fontsize=9)
            ax.set_xlim(-0.05, 1.05)
            ax.grid(alpha=0.3)
        axes[r][0].set_ylabel(f"{board.metric.label} ({'%' if board.metric.unit == '%' else board.metric.unit})",
                              fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("strength (shuffle: share of patches; inject: α)", fontsize=8)
    fig.suptitle(f"{board.metric.label} under ablation")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    entries: dict[str, Any] = {}  # one legend for all panels (a line may be missing from some)
    for ax in axes.flat:
        entries.update({lb: h for h, lb in zip(*ax.get_legend_handles_labels()) if lb not in entries})
    fig.legend(list(entries.values()), list(entries), loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
               fontsize=8)
    return save_figure(fig, out, formats)
