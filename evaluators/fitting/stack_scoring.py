"""Scoring stacks: every stacked job's bits per scene on a split, the same job of every row set in
one vmap'd forward (`score_stacks` for the fit's scoring, `stack_bits` for the gradient stage's
validation), chunk by chunk (`stacked_chunks`), and the results on the host in one transfer
(`on_host`): each read from a GPU waits for it."""

from __future__ import annotations

from functools import partial
from typing import Iterator, Sequence

import numpy as np
import torch

from evaluators.fitting.data import ProbeJob, RowReader, to_device
from evaluators.fitting.scoring import SCORE_BYTES, HeldCodes, HeldSplit, job_codes
from evaluators.fitting.stack import Stack, stacked_bits, stacked_tensors


def job_shapes(job: ProbeJob) -> tuple:
    """What the same job of several row sets must share to be scored as one: its name, and every
    tensor's name, shape and type."""
    model = job.model
    return (job.name, tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()))


def score_stacks(stacks: list[list[tuple[int, ProbeJob]]], readers: Sequence[RowReader], split: str, device: str,
                  batch: int) -> list[tuple[np.ndarray, np.ndarray] | Exception]:
    """Per stack, its row sets' (bits per scene, correct bits) on the split (row sets x scenes), or
    the exception its forward raised; chunk by chunk, the stacks that read the same row sets in
    the same pass over them, and one transfer for all."""
    parts: list[list[torch.Tensor] | Exception] = [[] for _ in stacks]
    by_sets: dict[tuple[int, ...], list[int]] = {}
    for a, members in enumerate(stacks):
        by_sets.setdefault(tuple(i for i, _ in members), []).append(a)
    for sets, mine in by_sets.items():
        tensors: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        for idx, x in stacked_chunks([readers[i] for i in sets], batch, device):
            for a in mine:
                if isinstance(parts[a], Exception):
                    continue
                job = stacks[a][0][1]
                try:
                    if a not in tensors:
                        tensors[a] = stacked_tensors([j.model for _, j in stacks[a]])
                    target, cond, prior = job_codes(job, split, idx, device)
                    bits, logits = stacked_bits(job.model, job.optim.amp, *tensors[a], x, target, cond, prior, device)
                except Exception as e:  # noqa: BLE001 — its jobs are scored one by one
                    parts[a] = e
                    continue
                parts[a] += [bits.float(), ((logits > 0) == (target > 0)).sum(-1).float()]
    both = on_host([p if isinstance(p, Exception) else torch.stack([torch.cat(p[0::2], 1), torch.cat(p[1::2], 1)])
                     for p in parts])
    return [b if isinstance(b, Exception) else (b[0], b[1]) for b in both]


def stack_bits(stacks: list[Stack], val: Sequence[RowReader | HeldSplit], batch: int, device: str,
                chunks: dict[tuple[int, ...], list] | None = None, extra: Sequence[torch.Tensor] = ()
                ) -> list[np.ndarray | Exception]:
    """Per stack, its row sets' bits per validation scene (row sets x scenes), or the exception its
    forward pass raised: one vmap'd pass per stack and chunk, and one transfer for all of them.
    Scored probe by probe, the 26 row sets' 15 probes of dinov2-small launched ~16,000 small
    kernels an epoch (2.6 s of a 22 s fit on an H200). Where the split is held on the device
    (`HeldSplit`), its chunks are stacked once in `chunks` (the stage's) and a graphed stack's
    passes are replayed from graphs (`StepGraphs.validation_bits`). `extra` float tensors come back
    in the same transfer, after the stacks' bits."""
    mine: dict[tuple[int, ...], list] = {}  # most stacks hold the same row sets: their rows stacked once
    parts: list[torch.Tensor | Exception] = []
    for s in stacks:
        sets = tuple(s.sets)
        try:
            held = val[sets[0]].codes if isinstance(val[sets[0]], HeldSplit) else None
            kept = chunks is not None and all(isinstance(val[i], HeldSplit) for i in sets)
            stacked = chunks if kept else mine
            if sets not in stacked:
                stacked[sets] = list(stacked_chunks([val[i] for i in sets], batch, device))
            pieces = []
            for c, (idx, x) in enumerate(stacked[sets]):
                bits = partial(chunk_bits, s, x, idx, device, held)
                pieces.append(s.graphs.validation_bits(c, bits, x) if kept and s.graphs is not None else bits())
            parts.append(torch.cat(pieces, dim=1).float())
        except Exception as e:  # noqa: BLE001 — the stack's row sets fail, the others go on
            parts.append(e)
    return on_host(parts + list(extra))


def chunk_bits(s: Stack, x: torch.Tensor, idx: np.ndarray | torch.Tensor, device: str,
                held: HeldCodes | None) -> torch.Tensor:
    """A stack's row sets' bits per scene on a validation chunk (rows `idx`, stacked inputs `x`)."""
    return s.scene_bits(x, *job_codes(s.jobs[0], "val", idx, device, held), device)


def on_host(parts: Sequence[torch.Tensor | Exception]) -> list[np.ndarray | Exception]:
    """Float tensors on the host, each its own shape, in one transfer for all (each read waits for
    the device); an exception in their place stays where it is."""
    done = [p for p in parts if not isinstance(p, Exception)]
    flat = torch.cat([p.reshape(-1) for p in done]).cpu().numpy() if done else np.zeros(0, np.float32)
    out: list[np.ndarray | Exception] = []
    at = 0
    for p in parts:
        if isinstance(p, Exception):
            out.append(p)
            continue
        out.append(flat[at : at + p.numel()].reshape(p.shape))
        at += p.numel()
    return out


def stacked_chunks(readers: Sequence[RowReader | HeldSplit], batch: int, device: str
                    ) -> Iterator[tuple[np.ndarray | torch.Tensor, torch.Tensor]]:
    """(indices, rows of every reader stacked: readers x chunk x ...) over a split, in chunks of
    `SCORE_BYTES` of input at most (at least `batch` rows), each read in pieces within the fit's memory
    budget (`RowReader.chunks`)."""
    size = max(batch, SCORE_BYTES // max(len(readers) * readers[0].float_row_bytes, 1))
    for parts in zip(*(r.chunks(size, bounded=True, share=len(readers)) for r in readers)):
        idx = parts[0][0]
        rows = [x if isinstance(x, torch.Tensor) else to_device(x, device) for _, x in parts]
        yield idx, torch.stack(rows)
