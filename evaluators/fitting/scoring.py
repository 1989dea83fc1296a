"""Scoring fitted probes: per-scene bits of a batch and of a split, the guard that keeps a fit
only when it beats its exact prior on validation, and a failed job's record."""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
import scipy.special
import torch

from bench.core.groups import group_labels, mean_se
from evaluators.fitting.data import FitResult, ProbeJob, RowReader, piece_rows, to_device
from evaluators.probes.base import anchor, scene_bits


def guard_against_prior(job: ProbeJob, result: FitResult, prior_val: np.ndarray, prior_state: dict[str, torch.Tensor],
                        groups: np.ndarray | None, n_se: float) -> None:
    """Keep the fit only if it saves more validation bits than the exact prior by more than
    `n_se` standard errors (Student's t with G − 1 degrees of freedom at the same one-sided level,
    G the validation groups, so that a handful of F codes cannot pass a noise fit: with 16
    validation scenes a two-SE guard let fits through that read β* −0.6 on test); otherwise reset
    the probe to its prior (a zero residual). The quantile is scipy.stats' t.ppf(norm.cdf(n_se))
    computed by the special functions behind it, the same floats without importing scipy.stats
    (1.5 s of a run's start on a 2-core machine), `t_quantile`."""
    saving, se = saving_and_se(prior_val, result.val_scene_bits, groups)
    result.val_prior_bits, result.val_saving_se = float(prior_val.mean()), se
    n_groups = int(group_labels(groups, len(prior_val)).max()) + 1 if len(prior_val) else 0
    bar = n_se if not math.isfinite(n_se) or n_groups < 2 else t_quantile(scipy.special.ndtr(n_se), n_groups - 1)
    if saving > bar * se:
        result.guard = "fit"
        return
    result.guard = "prior"
    job.model.load_state_dict(prior_state)
    result.val_bits, result.val_scene_bits = float(prior_val.mean()), prior_val


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile at `p` with `df` degrees of freedom, as scipy.stats' `t.ppf`: its ends
    are −inf and +inf (`stdtrit` alone gives +inf at p = 0, which made a guard of −1e9 standard
    errors, "keep every fit", reset every fit to its prior)."""
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return float(scipy.special.stdtrit(df, p))


def saving_and_se(reference: np.ndarray, fitted: np.ndarray, groups: np.ndarray | None = None) -> tuple[float, float]:
    """Mean of reference − fitted per scene, and its standard error resampling whole groups."""
    d = np.asarray(reference, dtype=np.float64) - np.asarray(fitted, dtype=np.float64)
    return (float(d.mean()) if len(d) else 0.0), mean_se(d, groups)


def record_failure(result: FitResult, error: Exception, active: dict, name: str) -> None:
    """A job that raised: its first line of error on its result (an error row), not converged, and
    the job out of `active` (its row set's jobs still fitting), whatever stage it failed in."""
    result.error = f"{type(error).__name__}: {error}".splitlines()[0]
    result.converged = False
    active.pop(name, None)


def batch_bits(job: ProbeJob, split: str, idx: np.ndarray, x: torch.Tensor, device: str,
               amp: bool = True, held: "HeldCodes | None" = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bits per scene, logits, target) of one job on a batch, teacher-forced (bf16 autocast on CUDA
    unless `amp` is off: its family's `ProbeOptim.amp`). `held`: the job's codes of the split
    already on the device (`HeldCodes`), indexed there instead of copied from the host."""
    target, cond, prior = job_codes(job, split, idx, device, held)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp and device.startswith("cuda")):
        residual = job.model(x, target, cond)
    logits = anchor(residual.float(), prior)
    return scene_bits(logits, target), logits, target


def job_codes(job: ProbeJob, split: str, idx: np.ndarray | torch.Tensor, device: str,
              held: "HeldCodes | None" = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(target, condition or None, prior or None) of a job's rows `idx` of a split, on the device."""
    if held is not None:
        return held.rows(job.name, idx)
    target = to_device(job.targets[split][idx], device)
    cond = to_device(job.cond[split][idx], device).float() if job.cond is not None else None
    prior = to_device(job.prior[split][idx], device) if job.prior is not None else None
    return target, cond, prior


class HeldCodes:
    """Every job's targets, condition and prior of one split, moved to the device once: on a GPU a
    copy from (pageable) host memory waits for the device, and the gradient stage made three per
    job and step."""

    def __init__(self, jobs: Sequence[ProbeJob], split: str, device: str) -> None:
        def put(a: np.ndarray | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
            return None if a is None else to_device(np.ascontiguousarray(a), device).to(dtype=dtype)

        self.device = device
        self.codes = {j.name: (put(j.targets[split]), put(None if j.cond is None else j.cond[split], torch.float32),
                               put(None if j.prior is None else j.prior[split])) for j in jobs}

    def rows(self, name: str, idx: np.ndarray | torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        index = torch.as_tensor(idx, device=self.device)
        return tuple(None if t is None else t[index] for t in self.codes[name])


class HeldSplit:
    """A split's rows and its jobs' codes held on the device, read in chunks as a `RowReader` is
    (the stacked gradient stage's validation, `evaluators.fitting.stacked`): on a GPU validation
    read the split from the disk every epoch, and a spatial view's (500 scenes of 64 tokens x 768)
    cost a tenth of a second to read and copy each time. `codes`: the split's codes, which the row
    sets of a stack share (one task; held once, not once a row set)."""

    def __init__(self, reader: RowReader, codes: HeldCodes) -> None:
        self.n, self.row_shape, self.float_row_bytes = reader.n, reader.row_shape, reader.float_row_bytes
        self.rows = torch.from_numpy(reader.read_all(dtype=None)).to(codes.device)  # as stored: float16, half the bytes
        self.codes = codes

    def __len__(self) -> int:
        return self.n

    def chunks(self, size: int, bounded: bool = False, share: int = 1,
               most: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(indices on the device, float32 rows, upcast exactly) in order, `size` rows at a time (held
        on the device: nothing is read, whatever `bounded`, `share` and `most` say, `RowReader.chunks`)."""
        for start in range(0, self.n, size):
            stop = min(start + size, self.n)
            yield torch.arange(start, stop, device=self.rows.device), self.rows[start:stop].float()


#: Input bytes per chunk when a split is scored: no gradient is kept, so a pooled view's split is
#: scored in one pass, a spatial view's in chunks of this size (read in pieces where the fit's memory
#: budget holds less, `RowReader.chunks`: the same bits).
SCORE_BYTES = 64 * 2**20


@torch.no_grad()
def score_jobs(jobs: Sequence[ProbeJob], reader: RowReader, split: str, device: str,
               batch: int) -> dict[str, tuple[np.ndarray, np.ndarray] | Exception]:
    """Per-scene bits and teacher-forced correct-bit counts of every job on a split, in order;
    a job that raises gets its exception instead, and the others go on (`score_row_sets` of one)."""
    return score_row_sets([(jobs, reader)], split, device, batch)[0]


@torch.no_grad()
def score_row_sets(sets: Sequence[tuple[Sequence[ProbeJob], RowReader]], split: str, device: str,
                   batch: int) -> list[dict[str, tuple[np.ndarray, np.ndarray] | Exception]]:
    """`score_jobs` of several row sets' jobs, each on its own reader: scores stay on the device until
    every split is done and come back in one transfer, however many row sets and jobs."""
    scored: list[dict[str, tuple[list, list] | Exception]] = []
    for jobs, reader in sets:
        for j in jobs:
            j.model.eval()
        mine: dict[str, tuple[list, list] | Exception] = {j.name: ([], []) for j in jobs}
        scored.append(mine)
        if not jobs:
            continue
        chunk = max(batch, SCORE_BYTES // max(reader.float_row_bytes, 1))
        # pieces within the fit's memory budget, and on a CPU of the rows that stay in its caches
        for idx, rows in reader.chunks(chunk, bounded=True, most=piece_rows(reader.float_row_bytes, device)):
            x = torch.from_numpy(rows).to(device)
            for j in jobs:
                if isinstance(mine[j.name], Exception):
                    continue
                try:
                    b, logits, target = batch_bits(j, split, idx, x, device, j.optim.amp)
                except Exception as e:  # noqa: BLE001 — reported per job
                    mine[j.name] = e
                    continue
                mine[j.name][0].append(b.float())
                mine[j.name][1].append(((logits > 0) == (target > 0)).sum(1).float())  # exact: at most K
    parts = [torch.cat(t) for mine in scored for got in mine.values() if not isinstance(got, Exception) for t in got]
    flat = torch.cat(parts).cpu().numpy() if parts else np.zeros(0, np.float32)
    out, at = [], 0
    for mine in scored:
        out.append({})
        for name, got in mine.items():
            if isinstance(got, Exception):
                out[-1][name] = got
                continue
            n = sum(len(t) for t in got[0])
            out[-1][name] = (flat[at : at + n].copy(), flat[at + n : at + 2 * n].astype(np.int64))
            at += 2 * n
    return out
