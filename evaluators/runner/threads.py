"""How many torch threads a run uses: by default, the cores other work leaves free.

torch starts one intra-op thread per core and its threads spin while they wait for each
other, so a process whose threads outnumber the free cores loses far more than its share:
on a 2-core machine with other jobs running, a DNN probe trained for 482 s at torch's
default two threads and 55 s at one (`benchmarks/threads.py` measures it). One thread
always would be safe but wastes an idle machine's other cores on a backbone's forward
pass. So the default measures, once at start, how busy the usable cores are (their
`/proc/stat` counters over a fraction of a second, else the load average) and takes the
free ones, at least one; `--threads N` sets the number outright, up to the machine's cores
(a million made libgomp fail allocating them, exit 1, after the run's folders were made).
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from bench.core.errors import BenchError
from bench.core.numerics import mkl_is_reproducible

#: How long the busy cores are sampled (seconds): long enough to see a busy core as busy.
SAMPLE_S = 0.3
#: A core counts as free when at least this share of it is idle (0.75: one mostly idle core counts).
FREE_SHARE = 0.75


@dataclass(frozen=True)
class ThreadChoice:
    """The number of torch threads and why: printed once, on stderr, by the command that runs them."""

    threads: int
    why: str

    def describe(self) -> str:
        return f"threads: {self.threads} torch thread{'s' if self.threads != 1 else ''} ({self.why})"


def choose_threads(requested: int | None = None) -> ThreadChoice:
    """`requested` threads, or (None) the usable cores other work leaves free, at least one."""
    if requested is not None:
        return ThreadChoice(check_threads(requested), "--threads")
    cores = usable_cores()
    busy = busy_cores(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    free = max(0.0, cores - busy)
    threads = max(1, min(cores, math.floor(free + (1 - FREE_SHARE))))
    return ThreadChoice(threads, f"auto: {cores} usable core{'s' if cores != 1 else ''}, {busy:.1f} busy with other "
                                 "work; --threads N to choose")


def check_threads(requested: int) -> int:
    """`requested` threads, refused in one line unless 1 to the machine's cores: more only spin
    against each other, and torch's thread pool cannot even be allocated at a million."""
    if requested < 1:
        raise BenchError(f"threads: must be ≥ 1, got {requested}")
    cores = machine_cores()
    if requested > cores:
        raise BenchError(f"threads: at most {cores} (this machine's cores), got {requested:,}")
    return requested


def machine_cores() -> int:
    """The machine's logical cores: the most threads a run may ask for."""
    return os.cpu_count() or 1


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (containers)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def busy_cores(cpus: list[int] | None, window_s: float = SAMPLE_S) -> float:
    """How many of `cpus` (None: all) other work keeps busy: their non-idle share over `window_s`
    from /proc/stat (this process sleeps meanwhile, so the work is others'), else the 1-minute
    load average, else 0."""
    first = _cpu_times(cpus)
    if first is None:
        try:
            return float(os.getloadavg()[0])
        except (OSError, AttributeError):
            return 0.0
    time.sleep(window_s)
    second = _cpu_times(cpus)
    if second is None:
        return 0.0
    busy = 0.0
    for cpu, (idle0, total0) in first.items():
        idle1, total1 = second.get(cpu, (idle0, total0))
        if total1 > total0:
            busy += 1 - (idle1 - idle0) / (total1 - total0)
    return busy


def _cpu_times(cpus: list[int] | None) -> dict[int, tuple[int, int]] | None:
    """Per CPU: (idle + iowait, total) jiffies from /proc/stat; None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        cpu = int(name[3:])
        if cpus is None or cpu in cpus:
            values = [int(v) for v in fields[:8]]
            out[cpu] = (values[3] + values[4], sum(values))
    return out or None


@contextmanager
def chosen_threads(requested: int | None, say: Callable[[str], None] | None = None) -> Iterator[ThreadChoice]:
    """Run the block on `requested` torch threads, or (None) on the default `choose_threads`
    picks; `say` hears, once, how many and why."""
    choice = choose_threads(requested)
    if say is not None:
        say(choice.describe())
        if mkl_is_reproducible() is False:
            say("warning: MKL ran before bench could make it reproducible (import bench before running torch "
                "products): this run's numbers may depend on its thread count")
    with torch_threads(choice.threads):
        yield choice


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with `n` torch intra-op threads, then restore the number before it."""
    import torch  # here: a run that only plans (nothing owed) never loads torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
