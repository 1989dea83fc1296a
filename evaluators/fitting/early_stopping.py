"""Early stopping on a validation loss and a warmed-up moving average of weights: the one helper
behind both gradient-trained probes, the binding probes' gradient stage (`evaluators.fitting`)
and the IsSameObject pair probes (`evaluators.tasks.issameobject.scorers`). The zoo's fixed-step
training (`evaluators.zoo`) stops at its step budget and needs neither."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch


class Plateau:
    """The best validation loss so far and how many epochs have passed without beating it by
    `min_delta`; training stops once that count reaches `patience`."""

    def __init__(self, best: float, patience: int, min_delta: float) -> None:
        self.best, self.patience, self.min_delta, self.stale = best, patience, min_delta, 0

    def improved(self, loss: float) -> bool:
        """Count one epoch's `loss`: True when it is the new best (the caller keeps those weights)."""
        if loss < self.best - self.min_delta:
            self.best, self.stale = loss, 0
            return True
        self.stale += 1
        return False

    @property
    def stopped(self) -> bool:
        return self.stale >= self.patience


class WeightAverage:
    """An exponential moving average of `params`, warmed up as TensorFlow's moving averages are:
    step n averages with decay min(`decay`, (1 + n) / (10 + n)), so early on the average follows
    the weights instead of lagging ~1/(1 - decay) steps behind them.

    Not `torch.optim.swa_utils.AveragedModel` with `get_ema_multi_avg_fn`: that one's decay is
    fixed (no warm-up), its first update copies the weights where this average starts from the
    weights before the first step, and it keeps a deep copy of the whole module, a frozen
    shared encoder included, per probe; the numbers of every row already measured with this
    average (attention probes) would move."""

    def __init__(self, params: Iterable[torch.nn.Parameter], decay: float) -> None:
        self.params = list(params)
        self.decay, self.steps = decay, 0
        self.average = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """Fold in the weights after one optimiser step."""
        self.steps += 1
        decay = min(self.decay, (1 + self.steps) / (10 + self.steps))
        for e, p in zip(self.average, self.params):
            e.lerp_(p, 1 - decay)

    @torch.no_grad()
    def fold(self, weight: torch.Tensor) -> None:
        """Fold in the weights after one step with the average's `weight` (1 − decay) given as a
        tensor: a stacked step counts its steps on the device, where a captured step can read them."""
        for e, p in zip(self.average, self.params):
            e.lerp_(p, weight)

    def select(self, params: Iterable[torch.nn.Parameter], index: torch.Tensor) -> None:
        """Follow `params`, the entries `index` of the tensors averaged so far along their first
        dimension (a stack of row sets some of which stopped, `evaluators.fitting.stacked`)."""
        self.params = list(params)
        self.average = [e[index] for e in self.average]

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in place of the raw ones (to validate or keep them); the raw ones,
        which training goes on from, come back afterwards."""
        raw = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for e, p in zip(self.average, self.params):
                p.copy_(e)
        try:
            yield
        finally:
            with torch.no_grad():
                for r, p in zip(raw, self.params):
                    p.copy_(r)
