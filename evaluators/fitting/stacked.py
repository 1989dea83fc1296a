"""The gradient stage of many row sets as one: the same job of every row set of a stack (the same
family and target, read from another layer or view) trained as one module with stacked
parameters (`torch.func.vmap` over `functional_call`), one AdamW step for all of them.

On a GPU every step of a probe is a train of small kernels whatever its rows: stepped row set by
row set, the 26 row sets of dinov2-small kept an H200 a third busy. Stacked, a step launches the
kernels of one probe for all of them. A row set's numbers do not depend on its batch-mates: every
one has its own parameters, moments, learning rate, plateau and stop, and the batches are the
same for all (one seed); on one thread a row set stacked with three others equals its fit alone to
the last bit (tests/test_stacking.py).

On CUDA a stack's step is also captured as a CUDA graph and replayed (`_StepGraphs`): stacked,
the kernels of one probe still went out one Python call at a time, and the attention probe on
pixels (one row set) took 11 ms a step at 8.5 % SM; replayed, 0.9 ms. And each stack steps on a
CUDA stream of its own (`SideStreams`, `CONCURRENT_DEVICES`): a step's kernels are too small to
fill a GPU, and the stacks of a stage are independent (attention on pixels: 8.3 s on a stream
per stack, 8.9 s on one, an H200; the same numbers).

Where the stage runs stacked: on CUDA (`STACKED_DEVICES`), every family (the attention probe's
moving average of weights stacked too; its encoder hands no product on there, `TokenEncoder`). On
a CPU a stacked step costs what the row sets' steps cost one after another, and vmap's own
overhead made one row set's step two to three times slower (quadratic and dnn, 31 rows of 384
inputs; four stacked row sets' gradient stage took 87 s, the same four one after another 72 s)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Hashable, Iterator, Sequence

import numpy as np
import torch
from torch.func import functional_call, vmap

from evaluators.fitting.cuda_graphs import GraphedStep, SideStreams
from evaluators.fitting.early_stopping import WeightAverage
from evaluators.fitting.data import FitResult, ProbeJob, RowReader, TrainConfig, stack_budget, stage_label, to_device
from evaluators.fitting.gradient import _Course, _gradient_stage, _optim_settings, _trained, load_states
from evaluators.fitting.scoring import _SCORE_BYTES, HeldCodes, HeldSplit, _codes, _fail, _score_sets
from evaluators.probes.base import anchor, scene_bits
from evaluators.probes.token_encoder import TokenEncoder

#: The devices whose gradient stage steps a stack's row sets as one (`trains_stacked`).
STACKED_DEVICES = ("cuda",)

#: The devices whose stacks keep a stopped row set at a learning rate of 0 and run their step as a
#: CUDA graph (`_StepGraphs`; elsewhere than on CUDA the step stays eager, which tests use).
GRAPHED_DEVICES = ("cuda",)

#: The devices on which each stack steps on a stream of its own (`SideStreams`), so that the
#: steps of a stage's stacks run at once (the numbers are those of one stream).
CONCURRENT_DEVICES = ("cuda",)

#: AdamW's defaults (`torch.optim.AdamW`), which the stacked step applies with a learning rate per row set.
_BETAS, _EPS = (0.9, 0.999), 1e-8


def trains_stacked(device: str) -> bool:
    """Whether jobs train stacked with the same job of their stack's other row sets on `device`."""
    return device.split(":")[0] in STACKED_DEVICES


def gradient_stages(jobs_per_set: Sequence[Sequence[ProbeJob]], inputs: Sequence[dict[str, RowReader]],
                    config: TrainConfig, device: str, results: Sequence[dict[str, FitResult]],
                    active: Sequence[dict[str, ProbeJob]], progress: Callable[[int], None] | None) -> None:
    """The gradient stage of every row set of a stack: on a device that trains them stacked
    (`trains_stacked`) the same job of every row set as one, else row set by row set from the
    same seed."""
    if not trains_stacked(device):
        for i, jobs in enumerate(jobs_per_set):
            torch.manual_seed(config.seed)
            _gradient_stage(jobs, inputs[i], config, device, results[i], active[i], progress)
        return
    groups: dict[tuple, list[tuple[int, ProbeJob]]] = {}
    for i, jobs in enumerate(jobs_per_set):
        for j in jobs:
            groups.setdefault(_signature(j, config), []).append((i, j))
    if groups:
        failed = _stacked_stage(list(groups.values()), inputs, config, device, results, active, progress)
        for i, jobs in enumerate(failed):  # a stack whose step raised: its jobs again, alone
            torch.manual_seed(config.seed)
            _gradient_stage(jobs, inputs[i], config, device, results[i], active[i], progress)


def _signature(job: ProbeJob, config: TrainConfig) -> tuple:
    """What jobs must share to be stacked: what they must share to be scored as one (`_shapes`),
    what is frozen, the weight decay and the moving average (the learning rate may differ: it is
    one per row set)."""
    return (_shapes(job), _optim_settings(job, config)[1:], frozenset(getattr(job.model, "frozen_names", ())))


class _Stack:
    """The same job of several row sets as one: each tensor of the module stacked along a first
    dimension (one entry per row set), AdamW's moments with them, and each row set's course.

    `live`: the positions of the row sets still training. Where the step is a CUDA graph
    (`graphed`), a row set that stops stays in the stack at a learning rate of 0 (its weights no
    longer move, and no one reads its losses), so that the captured step stays valid; elsewhere
    the stack shrinks to the row sets still training (`keep`)."""

    def __init__(self, members: list[tuple[int, ProbeJob]], results: Sequence[dict[str, FitResult]],
                 config: TrainConfig, graphed: bool = False) -> None:
        self.sets = [i for i, _ in members]
        self.jobs = [j for _, j in members]
        self.live = list(range(len(self.jobs)))
        self.template = self.jobs[0].model
        self.amp = self.jobs[0].optim.amp  # bf16 autocast on CUDA: its family's
        first = {id(p) for p in _trained(self.jobs[0])}
        for j in self.jobs[1:]:
            _trained(j)
        self.trained = [n for n, p in self.template.named_parameters() if id(p) in first]
        self.courses: list[_Course] = []
        for i, j in members:
            lr, self.decay, self.ema = _optim_settings(j, config)
            self.courses.append(_Course(j, results[i][j.name], lr, config))
            results[i][j.name].setting.update(lr=lr, weight_decay=self.decay, ema=self.ema)
        self.params, self.buffers = _stacked_tensors([j.model for j in self.jobs])
        for n in self.trained:
            self.params[n].requires_grad_(True)
        self.moments = {n: (torch.zeros_like(self.params[n]), torch.zeros_like(self.params[n])) for n in self.trained}
        self.average = WeightAverage([self.params[n] for n in self.trained], self.ema) if self.ema else None
        device = self.params[self.trained[0]].device
        self.steps = torch.zeros((), dtype=torch.float64, device=device)  # on the device: a graph reads it
        self.train_sum = torch.zeros(len(self.jobs), device=device)
        self.rate_fields: list[torch.Tensor] = []
        self.set_rates(self.learning_rates())
        # each row set's weights at its best epoch so far (`state_of`, `store_best`), and who has a new one
        self.best = {n: t.detach().clone() for n, t in self.read_params().items() if n in self.trained}
        self.improved: list[int] = []
        self.graphs = _StepGraphs(self) if graphed else None

    def learning_rates(self) -> list[float]:
        """Each row set's learning rate (its schedule changes it only between epochs; 0 for a row set
        that stopped and stays in the stack)."""
        live = set(self.live)
        return [c.lr if k in live else 0.0 for k, c in enumerate(self.courses)]

    def losses(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None,
               prior: torch.Tensor | None, device: str) -> torch.Tensor:
        """Each row set's mean bits on its batch (x: row sets x batch x ...), teacher-forced."""
        return self._bits(self.params, x, target, cond, prior, device).mean(1)

    @torch.no_grad()
    def scene_bits(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None,
                   prior: torch.Tensor | None, device: str) -> torch.Tensor:
        """Each row set's bits per scene (row sets x batch), teacher-forced, with the weights that
        validation reads: the moving average where the job keeps one."""
        return self._bits(self.read_params(), x, target, cond, prior, device)

    def _bits(self, params: dict[str, torch.Tensor], x: torch.Tensor, target: torch.Tensor,
              cond: torch.Tensor | None, prior: torch.Tensor | None, device: str) -> torch.Tensor:
        return _stacked_bits(self.template, self.amp, params, self.buffers, x, target, cond, prior, device)[0]

    def read_params(self) -> dict[str, torch.Tensor]:
        """The stacked parameters validation reads and a job keeps: the moving average in place of
        the trained ones where the job keeps one."""
        if self.average is None:
            return self.params
        return {**self.params, **dict(zip(self.trained, self.average.average))}

    def state_of(self, k: int) -> dict[str, torch.Tensor]:
        """Row set `k`'s weights as its module's state dict (what `_Course` keeps at a new best):
        views of its slice of the stack's best weights, which `store_best` fills once the epoch's
        bests are known, and of the tensors that training does not move."""
        self.improved.append(k)
        tensors = {**self.params, **self.buffers, **self.best}
        return {name: tensors[name][k].detach() for name in self.jobs[k].model.state_dict()}

    def starting_states(self) -> list[dict[str, torch.Tensor]]:
        """Each row set's weights now as its module's state dict: views of one copy of each stacked
        tensor (one operation per tensor, where a copy per row set and tensor launched ~300 small
        kernels a row set on a GPU)."""
        now = {n: t.detach().clone() for n, t in {**self.params, **self.buffers}.items()}
        return [{name: now[name][k] for name in j.model.state_dict()} for k, j in enumerate(self.jobs)]

    def store_best(self) -> None:
        """Copy the trained weights of the row sets whose epoch was their best (`state_of`) into the
        stack's best, one operation per tensor whatever the row sets: a copy per row set and tensor
        launched ~2,900 small kernels for 4 row sets' stacks on a GPU (their tensors at each new best)."""
        if not self.improved:
            return
        mask = torch.zeros(len(self.jobs), dtype=torch.bool)
        mask[self.improved] = True
        mask = to_device(mask, self.train_sum.device)
        read = self.read_params()
        for n, best in self.best.items():
            torch.where(mask.view(-1, *[1] * (best.dim() - 1)), read[n].detach(), best, out=best)
        self.improved = []

    def train(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None,
              prior: torch.Tensor | None, device: str) -> None:
        """One step of every row set on a batch: losses, gradients, AdamW, the training bits' sum
        (replayed from a CUDA graph where the stack has them, `_StepGraphs`)."""
        if self.graphs is not None:
            self.graphs.run(x, target, cond, prior, device)
        else:
            self.train_eagerly(x, target, cond, prior, device)

    def train_eagerly(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None,
                      prior: torch.Tensor | None, device: str) -> None:
        losses = self.losses(x, target, cond, prior, device)
        losses.sum().backward()
        self.step()
        self.train_sum += losses.detach() * x.shape[1]

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step of every row set's parameters (as `torch.optim.AdamW` steps one probe's,
        with a learning rate per row set, `set_rates`: torch's takes one rate per parameter group,
        and a stack is one tensor), each operation one multi-tensor kernel for all the trained
        tensors (`torch._foreach_*`): a tensor at a time, the attention probe's step launched 170
        kernels, more than its forward and backward passes together. The step count and its bias
        corrections are tensors on the device (float64, then float32, as the host's numbers would
        be), so that a captured step counts on when replayed."""
        self.steps += 1
        (b1, b2), t = _BETAS, self.steps
        first, second = (1 - b1 ** t).float(), (1 - b2 ** t).sqrt().float()
        params = [self.params[n] for n in self.trained]
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        firsts, seconds = [self.moments[n][0] for n in self.trained], [self.moments[n][1] for n in self.trained]
        torch._foreach_mul_(params, self.keep_fields)  # decoupled weight decay: p·(1 − rate·decay)
        torch._foreach_lerp_(firsts, grads, 1 - b1)
        torch._foreach_mul_(seconds, b2)
        torch._foreach_addcmul_(seconds, grads, grads, value=1 - b2)
        denom = torch._foreach_sqrt(seconds)
        torch._foreach_div_(denom, second)
        torch._foreach_add_(denom, _EPS)
        update = torch._foreach_div(self.rate_fields, first)
        torch._foreach_mul_(update, firsts)
        torch._foreach_div_(update, denom)
        torch._foreach_sub_(params, update)
        if self.average is not None:  # WeightAverage's warm-up, min(decay, (1 + n) / (10 + n)), counted here
            self.average.fold((1 - torch.clamp((1 + t) / (10 + t), max=self.average.decay)).float())

    def set_rates(self, rates: list[float]) -> None:
        """Each row set's learning rate (`rates`) where the step reads it, on the device: at each
        trained tensor's shape (`rate_fields`), and as the weight decay's factor 1 − rate·decay
        (`keep_fields`), as the step's multi-tensor kernels take operands of one shape. Written in
        place while the stack keeps its row sets (a captured step reads these tensors)."""
        self.rates = list(rates)
        on_device = to_device(torch.tensor(self.rates), self.train_sum.device)
        shaped = [on_device.view(-1, *[1] * (self.params[n].dim() - 1)).expand_as(self.params[n])
                  for n in self.trained]
        rate, keep = [r.contiguous() for r in shaped], [(1 - r * self.decay).contiguous() for r in shaped]
        if self.rate_fields and self.rate_fields[0].shape == rate[0].shape:
            for mine, given in zip(self.rate_fields + self.keep_fields, rate + keep):
                mine.copy_(given)
        else:
            self.rate_fields, self.keep_fields = rate, keep

    def keep(self, kept: list[int]) -> None:
        """Go on with the row sets at positions `kept` only (the others stopped or failed): a graphed
        stack keeps them all, the others at a learning rate of 0; any other shrinks."""
        if self.graphs is not None:
            self.live = list(kept)
            return
        index = torch.tensor(kept, dtype=torch.long, device=self.train_sum.device)
        self.sets = [self.sets[k] for k in kept]
        self.jobs = [self.jobs[k] for k in kept]
        self.courses = [self.courses[k] for k in kept]
        self.live = list(range(len(kept)))
        self.params = {n: t[index].detach().requires_grad_(n in self.trained) for n, t in self.params.items()}
        self.buffers = {n: t[index] for n, t in self.buffers.items()}
        self.moments = {n: (m[index], v[index]) for n, (m, v) in self.moments.items()}
        self.train_sum = self.train_sum[index]
        self.best = {n: t[index] for n, t in self.best.items()}  # a stopped row set's views keep the old tensor
        if self.average is not None:
            self.average.select([self.params[n] for n in self.trained], index)

    def refresh_rates(self) -> None:
        """The rates for the next epoch, written where the step reads them where one changed (a
        rate drops or a row set stops a few times a stage; rewritten every epoch, the fields were
        a quarter of the stage's launches from Python)."""
        rates = self.learning_rates()
        if rates != self.rates:
            self.set_rates(rates)


class _StepGraphs:
    """A stack's training step as CUDA graphs, one per batch shape (a full batch and the epoch's
    last): a step of a probe is a train of a few hundred small kernels, each launched from Python
    through vmap, and an H200 sat 90 % idle waiting for them (the attention probe on pixels: 11 ms
    a step, 7,428 steps). Replayed, the step launches them all at once. The graph reads the batch
    from its own input tensors, into which each step copies the batch."""

    def __init__(self, stack: _Stack) -> None:
        self.stack = stack
        self.step = GraphedStep(stack.params[stack.trained[0]].device)
        self.inputs: dict[tuple, tuple] = {}  # per batch shape, the tensors its graph reads the batch from
        self.validation = GraphedStep(stack.params[stack.trained[0]].device)

    def validation_bits(self, key: Hashable, bits: Callable[[], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """`bits()`, a validation chunk's forward (reading only tensors that stay where they are for
        the stage: the held split's rows and codes, the stack's weights), replayed from a graph per
        chunk: ~100 kernels a stack and epoch, launched from Python, otherwise (eagerly off CUDA: `x`,
        the chunk's rows, says where). Each call's output is overwritten by the next (`GraphedStep.call`)."""
        return self.validation.call(key, bits) if x.is_cuda else bits()

    def run(self, x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None, prior: torch.Tensor | None,
            device: str) -> None:
        batch = (x, target, cond, prior)
        if not x.is_cuda:
            self.stack.train_eagerly(*batch, device)
            return
        key = tuple(None if t is None else tuple(t.shape) for t in batch)
        if key not in self.inputs:
            self.inputs[key] = tuple(None if t is None else t.clone() for t in batch)
        inputs = self.inputs[key]
        for mine, given in zip(inputs, batch):
            if mine is not None:
                mine.copy_(given)
        self.step.run(key, lambda: self.stack.train_eagerly(*inputs, device), on_fail=self.forget_gradients)

    def forget_gradients(self) -> None:
        """What a failed capture leaves: gradients of a backward that never ran."""
        for n in self.stack.trained:
            self.stack.params[n].grad = None


def _stacked_tensors(models: Sequence[torch.nn.Module]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every parameter and buffer of the same module of several row sets, each stacked along a
    first dimension (one entry per row set): (parameters, buffers)."""
    first = models[0]
    return ({n: torch.stack([m.get_parameter(n).detach() for m in models]) for n, _ in first.named_parameters()},
            {n: torch.stack([m.get_buffer(n) for m in models]) for n, _ in first.named_buffers()})


def _stacked_bits(template: torch.nn.Module, amp: bool, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                  x: torch.Tensor, target: torch.Tensor, cond: torch.Tensor | None, prior: torch.Tensor | None,
                  device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits per scene, logits) of every row set (row sets x batch [x bits]), teacher-forced: the
    template module's forward with each row set's stacked tensors (`vmap` over `functional_call`),
    bf16 autocast on CUDA where `amp`, anchored at the prior."""
    def one(params: dict, buffers: dict, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # a cached cast (autocast's cache) would outlive a graph's capture
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp and device.startswith("cuda"),
                            cache_enabled=False):
            residual = functional_call(template, (params, buffers), (rows, target, cond))
        logits = anchor(residual.float(), prior)
        return scene_bits(logits, target), logits

    with TokenEncoder.uncached():
        return vmap(one)(params, buffers, x)


@torch.no_grad()
def score_sets(sets: Sequence[tuple[Sequence[ProbeJob], RowReader]], split: str, device: str,
               batch: int) -> list[dict[str, tuple[np.ndarray, np.ndarray] | Exception]]:
    """`_score_sets` (per row set, each job's bits per scene and correct bits on a split), with the
    same job of every row set scored as one vmap'd forward where the device trains stacked
    (`trains_stacked`): scored job by job, 26 row sets' 15 probes launched ~35,000 small kernels a
    split (1.1 s of a 22 s fit on an H200). A stack whose forward raises is scored job by job, so
    that only the jobs that fail alone fail."""
    if not trains_stacked(device):
        return _score_sets(sets, split, device, batch)
    groups: dict[tuple, list[tuple[int, ProbeJob]]] = {}
    for i, (jobs, reader) in enumerate(sets):
        for j in jobs:
            j.model.eval()
            groups.setdefault((_shapes(j), reader.row_shape), []).append((i, j))
    stacks = list(groups.values())  # a job of one row set too: vmap'd, its numbers are those it gets in a stack
    alone: list[list[ProbeJob]] = [[] for _ in sets]
    scored = _score_stacks(stacks, [reader for _, reader in sets], split, device, batch)
    for members, got in zip(stacks, scored):
        if isinstance(got, Exception):
            for i, j in members:
                alone[i].append(j)
    singly = _score_sets([(mine, reader) for mine, (_, reader) in zip(alone, sets)], split, device, batch)
    out: list[dict[str, tuple[np.ndarray, np.ndarray] | Exception]] = [{} for _ in sets]
    for members, got in zip(stacks, scored):
        if not isinstance(got, Exception):
            bits, correct = got
            for k, (i, j) in enumerate(members):
                out[i][j.name] = (bits[k].copy(), correct[k].astype(np.int64))
    return [{j.name: mine.get(j.name, single.get(j.name)) for j in jobs}
            for (jobs, _), mine, single in zip(sets, out, singly)]


def _shapes(job: ProbeJob) -> tuple:
    """What the same job of several row sets must share to be scored as one: its name, and every
    tensor's name, shape and type."""
    model = job.model
    return (job.name, tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()))


def _score_stacks(stacks: list[list[tuple[int, ProbeJob]]], readers: Sequence[RowReader], split: str, device: str,
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
        for idx, x in _stacked_chunks([readers[i] for i in sets], batch, device):
            for a in mine:
                if isinstance(parts[a], Exception):
                    continue
                job = stacks[a][0][1]
                try:
                    if a not in tensors:
                        tensors[a] = _stacked_tensors([j.model for _, j in stacks[a]])
                    target, cond, prior = _codes(job, split, idx, device)
                    bits, logits = _stacked_bits(job.model, job.optim.amp, *tensors[a], x, target, cond, prior, device)
                except Exception as e:  # noqa: BLE001 — its jobs are scored one by one
                    parts[a] = e
                    continue
                parts[a] += [bits.float(), ((logits > 0) == (target > 0)).sum(-1).float()]
    both = _on_host([p if isinstance(p, Exception) else torch.stack([torch.cat(p[0::2], 1), torch.cat(p[1::2], 1)])
                     for p in parts])
    return [b if isinstance(b, Exception) else (b[0], b[1]) for b in both]


def _stacked_stage(groups: list[list[tuple[int, ProbeJob]]], inputs: Sequence[dict[str, RowReader]],
                   config: TrainConfig, device: str, results: Sequence[dict[str, FitResult]],
                   active: Sequence[dict[str, ProbeJob]], progress: Callable[[int], None] | None
                   ) -> list[list[ProbeJob]]:
    """Train each group (one job of several row sets) as a `_Stack`; returns, per row set, the jobs
    of stacks whose step raised, reset to where the stage started, to be trained alone."""
    n_train = len(inputs[0]["train"])
    rng = np.random.default_rng(config.seed)
    graphed = device.split(":")[0] in GRAPHED_DEVICES
    stacks = [_Stack(members, results, config, graphed) for members in groups]
    streams = SideStreams(len(stacks) if device.split(":")[0] in CONCURRENT_DEVICES else 0, device)
    lane = {id(s): k for k, s in enumerate(stacks)}
    courses = [c for s in stacks for c in s.courses]
    starts = {id(j): state for s in stacks for j, state in zip(s.jobs, s.starting_states())}
    failed: list[list[ProbeJob]] = [[] for _ in inputs]
    rows, held, val = _held_rows(stacks, inputs, device, config)
    chunks: dict[tuple[int, ...], list] = {}  # the held validation split's chunks, stacked once for the stage
    stacks = _validate(stacks, val, config, device, active, 0, n_train, starts, chunks)
    for epoch in range(1, config.epochs + 1):
        if not stacks:
            break
        for s in stacks:
            s.train_sum.zero_()
        perm = rng.permutation(n_train)
        batches = [np.sort(perm[start : start + config.batch_size]) for start in range(0, n_train, config.batch_size)]
        # the epoch's batches in one copy to the device: each copy from the host waits for a GPU
        on_device = to_device(np.concatenate(batches), device).split([len(b) for b in batches]) \
            if rows is not None else batches
        for idx, index in zip(batches, on_device):
            x = None if rows is not None else {i: torch.from_numpy(inputs[i]["train"].take(idx)).to(device)
                                               for i in sorted({i for s in stacks for i in s.sets})}
            stacked: dict[tuple[int, ...], torch.Tensor] = {}  # most stacks hold the same row sets: stacked once
            for s in list(stacks):
                try:
                    sets = tuple(s.sets)
                    if sets not in stacked:
                        stacked[sets] = rows.batch(sets, index) if rows is not None else \
                            torch.stack([x[i] for i in sets])
                    with streams.lane(lane[id(s)], stacked[sets], index):
                        target, cond, prior = _codes(s.jobs[0], "train", index, device, held)
                        s.train(stacked[sets], target, cond, prior, device)
                except Exception:  # noqa: BLE001 — its row sets are fitted alone instead
                    streams.join()
                    stacks.remove(s)
                    for k in s.live:
                        s.jobs[k].model.load_state_dict(starts[id(s.jobs[k])])
                        failed[s.sets[k]].append(s.jobs[k])
        n_sets = len({s.sets[k] for s in stacks for k in s.live})
        streams.join()
        stacks = _validate(stacks, val, config, device, active, epoch, n_train, chunks=chunks)
        if progress:
            progress(n_sets)
    again = {id(j) for jobs in failed for j in jobs}
    concluding = [c for c in courses if id(c.job) not in again]
    load_states([(c.job.model, c.state) for c in concluding if c.result.error is None])
    for c in concluding:
        c.conclude(load=False)
    return failed


@stage_label("validation")
def _validate(stacks: list[_Stack], val: Sequence[RowReader | HeldSplit], config: TrainConfig, device: str,
              active: Sequence[dict[str, ProbeJob]], epoch: int, n_train: int,
              starts: dict[int, dict[str, torch.Tensor]] | None = None,
              chunks: dict[tuple[int, ...], list] | None = None) -> list[_Stack]:
    """Score every stacked job on its row set's validation split (`val`, per row set) and count the
    epoch in its course (epoch 0: the stage's start, each job's weights there in `starts`, by id);
    a job that stops or fails leaves its stack, and a stack with none left is dropped. `chunks`:
    the stage's held validation chunks (`_stack_bits`)."""
    # every stack's training bits in the validation bits' read (each read waits for the device)
    sums = [torch.cat([s.train_sum for s in stacks])] if epoch and stacks else []
    scored = _stack_bits(stacks, val, config.batch_size, device, chunks, sums)
    if epoch and stacks:
        totals = scored[-1].tolist()
        ends = np.cumsum([0] + [len(s.jobs) for s in stacks])
        train = [totals[a:b] for a, b in zip(ends[:-1], ends[1:])]
    going: list[list[int]] = [[] for _ in stacks]
    for a, (s, bits) in enumerate(zip(stacks, scored)):
        for k in s.live:
            course = s.courses[k]
            if isinstance(bits, Exception):
                outcome: Exception | bool = bits
            elif epoch == 0:
                course.start(bits[k], starts[id(course.job)] if starts else None)
                outcome = True
            else:
                outcome = course.epoch(epoch, train[a][k] / n_train, bits[k], kept=partial(s.state_of, k))
            if isinstance(outcome, Exception):
                _fail(course.result, outcome, active[s.sets[k]], course.job.name)
            if outcome is True:
                going[a].append(k)
        s.store_best()
    for s, kept in zip(stacks, going):
        if len(kept) < len(s.live):
            s.keep(kept)
        s.refresh_rates()
    return [s for s in stacks if s.live]


def _stack_bits(stacks: list[_Stack], val: Sequence[RowReader | HeldSplit], batch: int, device: str,
                chunks: dict[tuple[int, ...], list] | None = None, extra: Sequence[torch.Tensor] = ()
                ) -> list[np.ndarray | Exception]:
    """Per stack, its row sets' bits per validation scene (row sets x scenes), or the exception its
    forward pass raised: one vmap'd pass per stack and chunk, and one transfer for all of them.
    Scored probe by probe, the 26 row sets' 15 probes of dinov2-small launched ~16,000 small
    kernels an epoch (2.6 s of a 22 s fit on an H200). Where the split is held on the device
    (`HeldSplit`), its chunks are stacked once in `chunks` (the stage's) and a graphed stack's
    passes are replayed from graphs (`_StepGraphs.validation_bits`). `extra` float tensors come back
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
                stacked[sets] = list(_stacked_chunks([val[i] for i in sets], batch, device))
            pieces = []
            for c, (idx, x) in enumerate(stacked[sets]):
                bits = partial(_chunk_bits, s, x, idx, device, held)
                pieces.append(s.graphs.validation_bits(c, bits, x) if kept and s.graphs is not None else bits())
            parts.append(torch.cat(pieces, dim=1).float())
        except Exception as e:  # noqa: BLE001 — the stack's row sets fail, the others go on
            parts.append(e)
    return _on_host(parts + list(extra))


def _chunk_bits(s: _Stack, x: torch.Tensor, idx: np.ndarray | torch.Tensor, device: str,
                held: HeldCodes | None) -> torch.Tensor:
    """A stack's row sets' bits per scene on a validation chunk (rows `idx`, stacked inputs `x`)."""
    return s.scene_bits(x, *_codes(s.jobs[0], "val", idx, device, held), device)


def _on_host(parts: Sequence[torch.Tensor | Exception]) -> list[np.ndarray | Exception]:
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


def _stacked_chunks(readers: Sequence[RowReader | HeldSplit], batch: int, device: str
                    ) -> Iterator[tuple[np.ndarray | torch.Tensor, torch.Tensor]]:
    """(indices, rows of every reader stacked: readers x chunk x ...) over a split, in chunks of
    `_SCORE_BYTES` of input at most (at least `batch` rows)."""
    size = max(batch, _SCORE_BYTES // max(len(readers) * readers[0].float_row_bytes, 1))
    for parts in zip(*(r.chunks(size) for r in readers)):
        idx = parts[0][0]
        rows = [x if isinstance(x, torch.Tensor) else to_device(x, device) for _, x in parts]
        yield idx, torch.stack(rows)


class _TrainRows:
    """The stacked row sets' training rows on the device for a stage, in one tensor (row sets x N x ...)
    where their rows have one shape: a stack's batch is then one gather, where a gather per row set
    and a stack of them were 27 kernels a batch for 26 row sets (the same rows either way)."""

    def __init__(self, arrays: dict[int, np.ndarray], device: str) -> None:
        self.position = {i: k for k, i in enumerate(arrays)}
        shapes = {a.shape for a in arrays.values()}
        self.block = torch.from_numpy(np.stack(list(arrays.values()))).to(device) if len(shapes) == 1 else None
        self.each = None if self.block is not None else {i: torch.from_numpy(a).to(device) for i, a in arrays.items()}
        self.picks: dict[tuple[int, ...], torch.Tensor] = {}  # per subset of the row sets, their positions

    def batch(self, sets: tuple[int, ...], index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of row sets `sets` (len(sets) x len(index) x ...)."""
        if self.block is None:
            return torch.stack([self.each[i][index] for i in sets])
        positions = [self.position[i] for i in sets]
        if positions == list(range(len(self.position))):
            return self.block[:, index]
        if sets not in self.picks:
            self.picks[sets] = to_device(torch.tensor(positions), self.block.device)
        return self.block[self.picks[sets][:, None], index[None, :]]


def _held_rows(stacks: list[_Stack], inputs: Sequence[dict[str, RowReader]], device: str, config: TrainConfig
               ) -> tuple[_TrainRows | None, HeldCodes | None, list[RowReader | HeldSplit]]:
    """Every row set's training rows and validation split (`HeldSplit`; where all of them fit the
    stack's memory budget, the validation split counted twice as `_stack_bits` stacks it once more,
    else validation reads its readers) and the stacked jobs' training codes, on the device for the
    whole stage (`gradient._held_on_device`)."""
    readers = [one["val"] for one in inputs]
    sets = sorted({i for s in stacks for i in s.sets})
    size = sum((len(inputs[i]["train"]) + 2 * len(inputs[i]["val"])) * inputs[i]["train"].float_row_bytes
               for i in sets)
    jobs = [s.jobs[0] for s in stacks]
    held = HeldCodes(jobs, "train", device)
    if size > stack_budget(config, device):
        return None, held, readers
    rows = _TrainRows({i: inputs[i]["train"].read_all() for i in sets}, device)
    codes = HeldCodes(jobs, "val", device)
    val = [HeldSplit(reader, codes) if i in sets else reader for i, reader in enumerate(readers)]
    return rows, held, val
