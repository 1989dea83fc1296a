"""What probe fitting reads and returns: the training settings, activation rows read without
mapping them into memory, the jobs to fit and their results (`evaluators.fitting`)."""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from bench.core.errors import BenchError
from bench.core.resources import available_memory
from evaluators.probes.base import Probe
from evaluators.probes.families import ProbeOptim
from evaluators.probes.training import TrainConfig

#: The CPU's memory budget for what one fit holds at once (`stack_budget`): the moment stage's chunks.
STACK_BYTES = 1 << 30

#: The share of the machine's available memory (MemAvailable) a fit's rows may take when
#: `TrainConfig.memory_budget` is not given (`memory_budget`).
MEMORY_SHARE = 0.5

#: The fewest rows a bounded read splits a chunk into (`read_spans`): on a CPU a matrix product of
#: fewer than 16 rows takes another kernel (MKL's), whose rows differ in the last bits from those of
#: the same rows among more; pieces of at least 16 rows give each row the bits of the whole chunk.
LEAST_ROWS = 16

#: The float32 input bytes a CPU puts through a probe at once (`piece_rows`): a step's batch or a
#: scored chunk of wider rows goes through in pieces. One thread stepping the attention probe on
#: dinov2-small's 257 tokens x 384 took 3.6 ms a row in batches of 128 rows (50 MB of float32
#: tokens) and 2.0 ms in pieces of 32 (12 MB: the encoder's products stay in the caches); 16 to 43
#: rows read alike, and so did 16 to 32 rows of 768-d tokens (3.5 ms against 4.6 whole).
PIECE_BYTES = 12 * 2**20

#: Bytes a value costs while `feature_stats` reads it: as stored (float16: 2), as float32 (4), as
#: float64 (8) and squared (8).
STATS_VALUE_BYTES = 22


def memory_budget(config: TrainConfig) -> int:
    """The host bytes one fit may hold of activation rows at once: `config.memory_budget`, else
    `MEMORY_SHARE` of the memory available now (`bench.core.resources.available_memory`). A fit
    resolves it once, when it starts (`fit_row_sets`)."""
    if config.memory_budget is not None:
        return config.memory_budget
    return int(available_memory() * MEMORY_SHARE)


def bounded_row_sets(row_sets: Sequence[tuple[Any, dict[str, "RowReader"]]], config: TrainConfig, holds: bool
                     ) -> list[tuple[Any, dict[str, "RowReader"]]]:
    """The row sets, their readers' `read_bytes` set so that their bulk reads keep `config.memory_budget`
    (resolved, `memory_budget`; the same readers: a fit sets them at its start): all of it, or, where the fit `holds` splits in host memory for the stage (CUDA, `_read_once`),
    what half of it leaves. A budget whose reads cannot hold one training batch of rows (at least
    2 x `LEAST_ROWS`), or one row as `feature_stats` reads it, is a `BenchError`."""
    budget = memory_budget(config)
    reads = budget - budget // 2 if holds else budget
    rows = max(config.batch_size or 0, 2 * LEAST_ROWS)
    need, shape = 0, ()
    for _, inputs in row_sets:
        for r in inputs.values():
            if max(rows * r.read_row_bytes, STATS_VALUE_BYTES * r.values) > need:
                need, shape = max(rows * r.read_row_bytes, STATS_VALUE_BYTES * r.values), r.row_shape
    if reads < need:
        least = need if not holds else 2 * need
        raise BenchError(f"memory budget: {_size(budget)} cannot read one batch of rows ({rows} rows of "
                         f"{' x '.join(map(str, shape))} values{', half the budget held' if holds else ''}); "
                         f"give at least {_size(least)}")
    for _, inputs in row_sets:
        for r in inputs.values():
            r.read_bytes = reads
    return list(row_sets)


def held_bytes(config: TrainConfig) -> int:
    """The host bytes a fit may keep its splits in for a stage (`bounded_row_sets`: half the budget)."""
    return memory_budget(config) // 2


def _size(n: int) -> str:
    """Bytes as the budget's messages show them, in the largest binary unit under them."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB"]
    k = min(max(int(math.log(max(n, 1), 1024)), 0), len(units) - 1)
    return f"{n} bytes" if k == 0 else f"{n / 1024 ** k:,.1f} {units[k]}"


def read_spans(n: int, chunk: int, cap: int | None) -> Iterator[tuple[int, int]]:
    """[start, stop) of rows 0..n in chunks of `chunk` rows, each split into even pieces of at most
    `cap` rows (`cap` ≥ 2 x `LEAST_ROWS`, or None: unsplit) and of at least `LEAST_ROWS`: a chunk
    scored in pieces gives each row the bits it gets scored whole, so that a fit's numbers do not
    depend on its memory budget (a chunk of fewer rows stays whole)."""
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        pieces = 1 if cap is None or stop - start <= cap else -(-(stop - start) // cap)
        bounds = np.linspace(start, stop, pieces + 1).round().astype(int)
        yield from zip(bounds[:-1].tolist(), bounds[1:].tolist())


def piece_rows(float_row_bytes: int, device: str) -> int | None:
    """The most rows a CPU puts through a probe at once (`PIECE_BYTES` of float32 inputs, at least
    2 x `LEAST_ROWS` so that even pieces keep each row's bits, `read_spans`); None on CUDA, where a
    launch per piece would cost what the caches save. A function of the row's size alone, so that
    the same config and seed give the same bytes on any machine."""
    if device.startswith("cuda"):
        return None
    return max(2 * LEAST_ROWS, PIECE_BYTES // max(float_row_bytes, 1))


def stack_budget(config: TrainConfig, device: str) -> int:
    """The bytes a stack of row sets may take: `config.stack_bytes`, else `STACK_BYTES` on a CPU and
    a quarter of the GPU's free memory on CUDA."""
    if config.stack_bytes is not None:
        return config.stack_bytes
    return torch.cuda.mem_get_info()[0] // 4 if device.startswith("cuda") else STACK_BYTES


def stacks_row_sets(device: str, budget: int | None) -> bool:
    """Whether a backbone's row sets share stacks: on CUDA, or wherever a stack budget is given."""
    return device.startswith("cuda") or budget is not None


def row_sets_per_stack(n_rows: int, row_shape: tuple[int, ...], n_bits: int, device: str,
                       budget: int | None = None) -> int:
    """How many row sets of `n_rows` training and validation rows fit one batched linear solve
    within `budget` bytes (at least one): each holds its inputs three times (as read, standardised,
    rotated) and about six float32 values per scene and bit (logits, probabilities, residuals,
    curvature) in float32. A row set's numbers do not depend on how many share its stack, so the
    budget is the machine's to choose.

    No `budget` on a CPU: one row set per stack. A CPU gains nothing from fewer launches, and a
    stack's inputs outgrow its caches: four row sets of dinov2-small (2,000 scenes, one thread)
    took 124 s as one stack and 108 s one after another."""
    if not stacks_row_sets(device, budget):
        return 1
    budget = budget if budget is not None else stack_budget(TrainConfig(), device)
    return max(1, int(budget // max(row_set_bytes(n_rows, row_shape, n_bits), 1)))


def row_set_bytes(n_rows: int, row_shape: tuple[int, ...], n_bits: int) -> int:
    """About the bytes a row set's batched linear solve holds (`row_sets_per_stack`)."""
    return 4 * n_rows * (3 * int(np.prod(row_shape)) + 6 * n_bits)


def auto_batch_size(n_train: int, device: str = "cpu", steps: int = ProbeOptim.cpu_steps) -> int:
    """Rows per optimiser step: about `steps` steps an epoch (the family's `cpu_steps`), between 16
    and 128 rows, on a CPU; a quarter of the training split (128 to 4,096 rows) on CUDA, for the
    families that take it (`ProbeFamily.device_batches`).

    Plateau stopping counts epochs, so an epoch must hold enough steps for a probe to move: a
    probe that learns from scratch, as the attention probe does, takes 64; before the pooled
    families started from the linear stage's solution, a quadratic-shared probe on oracle:objects
    stalled at β* 0.91 at 16 steps where 64 reached 0.98, and since then 16 (batches of 125 at
    2,000 scenes) read what 64 did on every oracle and control. On a GPU every step is a
    train of small kernels whatever its rows: at batches of 32 the probes of one row set kept an
    H200 15 % busy for 30 s, at 512 they trained in 2.2 s to the same β* (0.0567 against 0.0565,
    random:dinov2-small, 2,000 scenes) and sensitivity (0.957 both)."""
    if device.startswith("cuda"):
        return max(128, min(4096, n_train // 4))
    return max(16, min(128, n_train // steps))


class RowReader:
    """Rows of an N x ... array by index, as float32 (or as stored), without mapping the file into RSS.

    A C-contiguous np.memmap is read with os.pread (runs of consecutive rows coalesced);
    anything else (an in-memory array) is indexed directly. `n` limits the rows used.
    `read_bytes`: the host bytes one bounded read may take (`chunks`, `feature_stats`; None: any).
    """

    def __init__(self, array: np.ndarray, n: int | None = None, read_bytes: int | None = None) -> None:
        self.array = array
        self.n = len(array) if n is None else min(n, len(array))
        self.read_bytes = read_bytes
        self.row_shape = tuple(array.shape[1:])
        self.dtype = array.dtype
        self.values = int(np.prod(self.row_shape, dtype=np.int64))
        self.row_bytes = self.values * array.dtype.itemsize
        #: A row's bytes once read (as float32), what it takes in memory on the fitting device.
        self.float_row_bytes = self.values * 4
        #: A row's host bytes while it is read as float32: as read (stored) and as float32.
        self.read_row_bytes = self.row_bytes + self.float_row_bytes
        filename = getattr(array, "filename", None)
        self._fd = None
        if isinstance(array, np.memmap) and filename and array.flags.c_contiguous:
            self._fd = os.open(filename, os.O_RDONLY)
            self._offset = int(array.offset)
            # closed when the reader goes, or at exit before modules are torn down (a `__del__` that
            # ran then found `os` gone and printed an AttributeError after every benchmark)
            weakref.finalize(self, os.close, self._fd)

    def __len__(self) -> int:
        return self.n

    def rows_per_read(self, row_cost: int, share: int = 1) -> int | None:
        """The rows one read may hold where a row costs `row_cost` bytes and `share` readers read
        at once (None: unbounded)."""
        return None if self.read_bytes is None else max(1, self.read_bytes // max(share * row_cost, 1))

    def take(self, idx: np.ndarray, dtype: np.dtype | type | None = np.float32) -> np.ndarray:
        """Rows `idx` (sorted ascending for speed) as a `dtype` array (None: as stored, e.g. float16,
        which upcasts to float32 exactly wherever it is used)."""
        idx = np.asarray(idx, dtype=np.int64)
        dtype = self.dtype if dtype is None else dtype
        if self._fd is None:
            return np.asarray(self.array[idx], dtype=dtype)
        buf = bytearray(len(idx) * self.row_bytes)
        view = memoryview(buf)
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        pos = 0
        for run in np.split(idx, breaks):
            size = len(run) * self.row_bytes
            got = os.preadv(self._fd, [view[pos : pos + size]], self._offset + int(run[0]) * self.row_bytes)
            if got != size:
                raise OSError(f"short read from {self.array.filename}: {got} of {size} bytes")
            pos += size
        rows = np.frombuffer(buf, dtype=self.dtype).reshape(len(idx), *self.row_shape)
        return rows if rows.dtype == dtype else rows.astype(dtype)

    def read_all(self, dtype: np.dtype | type | None = np.float32) -> np.ndarray:
        """Every row (the first `n`) as one `dtype` array (None: as stored)."""
        return self.take(np.arange(self.n), dtype)

    def chunks(self, size: int, bounded: bool = False, share: int = 1,
               most: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(indices, float32 rows) in order, `size` rows at a time; `bounded`: each chunk read in
        pieces that keep `read_bytes` with `share` readers reading at once, and of at most `most`
        rows (`piece_rows`) where given (`read_spans`: each row's bits as in its whole chunk, for
        per-row work such as scoring, not for sums over a chunk)."""
        caps = [c for c in (self.rows_per_read(self.read_row_bytes, share) if bounded else None, most)
                if c is not None]
        cap = max(min(caps), 2 * LEAST_ROWS) if caps else None
        for start, stop in read_spans(self.n, size, cap):
            idx = np.arange(start, stop)
            yield idx, self.take(idx)


def to_device(values: np.ndarray | torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """Host `values` on `device`, to CUDA without waiting for it: copied from pageable memory, a
    transfer waits until the stream has run everything queued before it (CUDA's rule), and the
    moment stage made ~1,500 transfers for 26 row sets, each leaving the GPU idle while the host
    prepared the next; through pinned memory (`pin_memory`, whose block the allocator keeps until
    the transfer is done) it is queued like a kernel."""
    t = torch.from_numpy(values) if isinstance(values, np.ndarray) else values
    if not str(device).startswith("cuda"):
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def modules_to_device(modules: Sequence[torch.nn.Module], device: str | torch.device) -> None:
    """`Module.to(device)` of each module, in place; to CUDA, a module's tensors of one type in one
    transfer (`to_device`), of which they become views (each module its own: a deep copy of one
    module's state copies only its own). `Module.to` transfers tensor by tensor, each from pageable
    memory and so waiting for all the stream has queued: a row set's probes hold ~150 tensors, 3,900
    transfers for 26 row sets at ~44 µs each on an H200's host. A module whose parameters hold
    gradients is moved by `Module.to` (it moves those too)."""
    target = torch.device(device)
    for module in modules:
        if target.type != "cuda" or any(p.grad is not None for p in module.parameters()):
            module.to(target)
            continue
        places: dict[int, tuple[torch.Tensor, list[tuple[torch.nn.Module, str]]]] = {}  # tied tensors once
        for owner in module.modules():
            for t in owner._parameters.values():
                if t is not None and t.device != target:
                    places.setdefault(id(t), (t, []))
            for name, t in owner._buffers.items():
                if t is not None and t.device != target:
                    places.setdefault(id(t), (t, []))[1].append((owner, name))
        by_type: dict[torch.dtype, list[tuple[torch.Tensor, list[tuple[torch.nn.Module, str]]]]] = {}
        for t, buffers in places.values():
            by_type.setdefault(t.dtype, []).append((t, buffers))
        for members in by_type.values():
            flat = to_device(torch.cat([t.detach().reshape(-1) for t, _ in members]), target)
            for (t, buffers), piece in zip(members, flat.split([t.numel() for t, _ in members])):
                moved = piece.view(t.shape)
                if isinstance(t, torch.nn.Parameter):
                    t.data = moved  # the same Parameter: what holds it (tied modules, optimisers) sees the move
                for owner, name in buffers:
                    owner._buffers[name] = moved


def feature_stats(reader: RowReader, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std over all rows (and tokens), streamed in float64: a sum per
    `chunk` rows, each added in order, whatever the reader's `read_bytes` (a chunk read in pieces
    goes on with its running sum, row after row, as numpy adds a whole chunk's rows: the same
    bits under any memory budget).

    Rows holding inf give NaN statistics without numpy's RuntimeWarning: the linear stage refuses
    such a row set in one line that its row names, where the warning was an unnamed extra line."""
    d = reader.row_shape[-1]
    total, sq, count = np.zeros(d), np.zeros(d), 0
    piece = reader.rows_per_read(STATS_VALUE_BYTES * reader.values) or chunk
    for start in range(0, reader.n, chunk):
        part_sum = part_sq = None
        for at in range(start, min(start + chunk, reader.n), piece):
            flat = reader.take(np.arange(at, min(at + piece, start + chunk, reader.n))).reshape(-1, d)
            flat = flat.astype(np.float64)
            squares = np.square(flat)
            if part_sum is not None:  # (running sum + first row) + the next rows: the whole chunk's order
                flat[0] += part_sum
                squares[0] += part_sq
            part_sum, part_sq = flat.sum(0), squares.sum(0)
            count += len(flat)
        total += part_sum
        sq += part_sq
    mean = total / max(count, 1)
    with np.errstate(invalid="ignore"):
        return mean, np.sqrt(np.maximum(sq / max(count, 1) - mean**2, 0.0))


@dataclass
class ProbeJob:
    """One probe to train: its model, per-split targets (N x K uint8), optional condition,
    and optional exact prior logits (N x K float32, ±inf where the prior fixes the bit)
    that the probe's residual is added to.

    Jobs with the same `linear_key` solve the same linear problem (the same targets, prior
    and condition, and probes whose linear parts have the same shape, e.g. one target's
    probes across families): its L2 path is fitted once and copied into each of them.
    `warm_start` names another job whose fitted parameters this one starts from where names
    and shapes agree (`warm_start_from`): it is trained after that job."""

    name: str
    model: Probe
    targets: dict[str, np.ndarray]
    cond: dict[str, np.ndarray] | None = None
    prior: dict[str, np.ndarray] | None = None
    linear_key: str | None = None
    warm_start: str | None = None
    #: The gradient stage's AdamW settings (`evaluators.probes.probe_optim` gives a family's).
    optim: ProbeOptim = ProbeOptim()


@dataclass
class FitResult:
    """A trained probe's test scores with the settings chosen on validation.

    `best_epoch` is the gradient stage's best epoch (0: its start, the linear stage's
    solution or, for probes without one, the untrained probe). `setting` records what was
    chosen on validation: the linear stage's penalty ("l2" or "l1") and its `strength`, and
    whether the gradient stage improved on it. `guard` is "fit" when the probe's validation saving over its
    exact prior exceeded `TrainConfig.guard_se` standard errors (taken over validation
    groups, the F codes), "prior" when it did not and the probe was reset to its prior
    (it then codes test exactly at the prior), None for unanchored probes. `val_bits` is
    the chosen probe's mean validation code length, `val_prior_bits` the prior's and
    `val_saving_se` the saving's standard error.

    `converged` is False when the fit may have stopped short of its optimum: validation was
    still improving when the epoch budget ran out (no `patience` epochs without improvement),
    or the best epoch lies in the last 10 % of the budget, or the linear solver hit its
    iteration limit.
    """

    name: str
    best_epoch: int = -1
    val_bits: float = math.inf
    scene_bits: np.ndarray | None = None  # test bits per scene
    bits_correct: np.ndarray | None = None  # teacher-forced correct bits per test scene
    n_bits: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)  # (train, val) mean bits per epoch
    l2_path: list[tuple[float, float]] = field(default_factory=list)  # (L2 strength, val mean bits)
    l1_path: list[tuple[float, float]] = field(default_factory=list)  # (L1 strength, val mean bits)
    converged: bool = False
    error: str | None = None
    val_scene_bits: np.ndarray | None = None  # validation bits per scene of the chosen probe
    val_prior_bits: float | None = None
    val_saving_se: float | None = None
    guard: str | None = None
    setting: dict[str, Any] = field(default_factory=dict)


#: What `stage_label` puts before a stage's name.
STAGE_PREFIX = "bindingbench.fit."


def stage_label(name: str) -> torch.profiler.record_function:
    """A fit stage's label in a profiler's trace (`torch.profiler.record_function`): a trace of a fit
    reads its stages apart (`benchmarks/gpu.py --profile`); costs nothing measurable unprofiled."""
    return torch.profiler.record_function(STAGE_PREFIX + name)
