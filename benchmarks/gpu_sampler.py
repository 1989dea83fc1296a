"""SM utilisation while the GPU benchmark fits: `nvidia-smi dmon` read in the background, each reading
stamped with the benchmark's clock, and the mean of a phase's window (a part of `benchmarks/gpu.py`)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable, Iterator

from benchmarks import gpu_budget


def read_dmon(lines: Iterable[str]) -> Iterator[float]:
    """The 'sm' column (%) of `nvidia-smi dmon -s u` output, one value per data line; the
    column is found in the header line ('# gpu sm mem ...'), and '-' (no reading) is skipped."""
    column = None
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "#":
            if "sm" in fields[1:]:
                column = fields[1:].index("sm")
            continue
        if column is not None and column < len(fields):
            try:
                yield float(fields[column])
            except ValueError:
                continue


#: `nvidia-smi dmon`'s sampling period (s): a reading is the share of the period before it in
#: which a kernel ran.
DMON_PERIOD_S = 1


class SmSampler:
    """`nvidia-smi dmon -s u -d 1` in the background: SM utilisation with the time it was read."""

    def __init__(self) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        self.samples: list[tuple[float, float]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", str(DMON_PERIOD_S),
                                      "-i", visible if visible.isdigit() else "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for value in read_dmon(self.proc.stdout):
            self.samples.append((gpu_budget.now(), value))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.thread.join(timeout=5)

    def mean(self, start: float, stop: float) -> dict:
        """The mean of the readings whose period lies in [start, stop]: a reading taken in the window's
        first second describes mostly what ran before it (the phase before, or the gap between)."""
        values = [v for t, v in self.samples if start + DMON_PERIOD_S <= t <= stop]
        if not values:
            return {"status": "skipped", "reason": f"no whole {DMON_PERIOD_S} s reading in the window"}
        return {"status": "done", "mean_sm_pct": round(sum(values) / len(values), 1), "samples": len(values)}
