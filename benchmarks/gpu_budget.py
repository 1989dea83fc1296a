"""The GPU benchmark's time: its one clock, its budget split into the fitting phases' shares, and the
deadline that stops a fit at the end of its share (a part of `benchmarks/gpu.py`)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

#: The benchmark's one clock: every time it reports and every budget decision (a phase's share, the
#: next row set, a stop) reads it, in every module of the benchmark, as `gpu_budget.now()` (never a
#: copy of the name, which a test's clock would not replace). Tests put a fake clock here, advanced
#: by fake fits, to check that logic without waiting on real time. (`deadline`'s alarm is the
#: kernel's real timer.)
now = time.perf_counter

#: Weights of the fitting phases in the time left after extraction; a phase gets
#: left × its weight / the weights of the phases still to run, so time one leaves passes on.
SHARES = {"fit_device": 0.35, "fit_device_again": 0.15, "attention_device": 0.2, "power": 0.15, "fit_cpu": 0.2,
          "attention_cpu": 0.1, "profile": 0.35}


class OutOfBudget(BaseException):
    """A fit ran past its phase's share. A BaseException: the evaluator turns an Exception
    inside a fit into an error row and goes on, and this must end the phase instead."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise OutOfBudget in the main thread once `seconds` have passed."""
    def _alarm(signum, frame):
        raise OutOfBudget

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Clock:
    """The run's budget: what is left, and each fitting phase's share of it."""

    def __init__(self, budget: float, phases: Iterable[str] = SHARES) -> None:
        self.budget, self.t0 = budget, now()
        self.pending = {phase: SHARES[phase] for phase in phases}

    def elapsed(self) -> float:
        return now() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    def share(self, phase: str) -> float:
        weight = self.pending.pop(phase)
        return self.left() * weight / (weight + sum(self.pending.values()))
