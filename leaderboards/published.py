"""The two papers' published numbers as reference rows (`data/published.json`, shipped with the
package): shown beside a user's rows so a measurement can be read against the literature, marked
published and never ranked, since they were measured on other data with other estimators.

Only numbers the papers state are rows; ranges and endpoints they give in the text are notes.
Each row keeps its source (paper, table) and estimator. A board shows the published quantity that
matches its metric (`BOARD_QUANTITY`): the binding paper's numbers come from its own estimator, a
difference of two probes that learn the prior themselves, so they sit on the `*_paper` boards and
on β_O / B_O (whose definitions, B_O = H(O) − L_O, the paper shares), never on the anchored β*."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from leaderboards.metrics import Metric

DATA = Path(__file__).with_name("data") / "published.json"

#: Board metric -> the published quantity it shows.
BOARD_QUANTITY = {
    "accuracy": "accuracy",
    "beta_star_paper": "beta_star", "B_star_paper": "B_star",
    "beta_O": "beta_O", "beta_O_paper": "beta_O", "B_O": "B_O", "B_O_paper": "B_O",
}


@dataclass(frozen=True)
class Reference:
    """One row of a published table: its numbers as printed (percent, bits) and where they come from."""

    paper: str
    cite: str
    table: str
    task: str
    backbone: str
    model: str | None
    dataset: str
    probe: str
    tokens: str
    estimator: str
    values: dict[str, float] = field(hash=False)
    H: dict[str, float] | None = field(default=None, hash=False)
    notes: str | None = None
    paper_notes: str | None = None

    @property
    def source(self) -> str:
        return f"{self.cite}, {self.table}"

    def value(self, metric: Metric) -> float | None:
        """The number a board of `metric` shows (ratios as fractions, as result rows hold them), None
        when the paper reports no such quantity."""
        quantity = BOARD_QUANTITY.get(metric.name)
        if quantity is None or quantity not in self.values or metric.task != self.task:
            return None
        v = float(self.values[quantity])
        return v / 100 if metric.unit == "%" else v


@lru_cache(maxsize=1)
def load_published() -> tuple[Reference, ...]:
    """Every published row, in the papers' order."""
    data: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    papers = data["papers"]
    return tuple(Reference(paper=r["paper"], cite=papers[r["paper"]]["cite"], table=r["table"], task=r["task"],
                           backbone=r["backbone"], model=r.get("model"), dataset=r["dataset"], probe=r["probe"],
                           tokens=r["tokens"], estimator=r["estimator"], values=dict(r["values"]), H=r.get("H"),
                           notes=r.get("notes"), paper_notes=papers[r["paper"]].get("notes"))
                 for r in data["rows"])


def none_published(metric: Metric) -> str | None:
    """Why `--reference` adds no row to a board of `metric` (None when it adds some): the metrics
    of its task that do have published rows."""
    if references_for(metric):
        return None
    shown = [name for name, quantity in BOARD_QUANTITY.items()
             if any(r.task == metric.task and quantity in r.values for r in load_published())]
    return (f"--reference: the papers publish no {metric.label} ({metric.name})"
            + (f"; their {metric.task} numbers are on --metric {', '.join(shown)}" if shown else ""))


def references_for(metric: Metric) -> list[Reference]:
    """The published rows a board of `metric` shows (none for a metric no paper reports)."""
    return [r for r in load_published() if r.value(metric) is not None]
