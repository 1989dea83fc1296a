"""A stack: the same job of several row sets as one module (`Stack`), each tensor stacked along a
first dimension, one AdamW step for all of them, and its step captured as CUDA graphs
(`StepGraphs`); the forward of every row set at once (`stacked_bits`, vmap over `functional_call`).

On CUDA a stack's step is also captured as a CUDA graph and replayed (`StepGraphs`): stacked,
the kernels of one probe still went out one Python call at a time, and the attention probe on
pixels (one row set) took 11 ms a step at 8.5 % SM; replayed, 0.9 ms. And each stack steps on a
CUDA stream of its own (`SideStreams`, `stacked.CONCURRENT_DEVICES`): a step's kernels are too small to
fill a GPU, and the stacks of a stage are independent (attention on pixels: 8.3 s on a stream
per stack, 8.9 s on one, an H200; the same numbers)."""

from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch
from torch.func import functional_call, vmap

from evaluators.fitting.cuda_graphs import GraphedStep
from evaluators.fitting.data import FitResult, ProbeJob, TrainConfig, to_device
from evaluators.fitting.early_stopping import WeightAverage
from evaluators.fitting.gradient import Course, optim_settings, trained_parameters
from evaluators.probes.base import anchor, scene_bits
from evaluators.probes.token_encoder import TokenEncoder

#: AdamW's defaults (`torch.optim.AdamW`), which the stacked step applies with a learning rate per row set.
_BETAS, _EPS = (0.9, 0.999), 1e-8


class Stack:
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
        first = {id(p) for p in trained_parameters(self.jobs[0])}
        for j in self.jobs[1:]:
            trained_parameters(j)
        self.trained = [n for n, p in self.template.named_parameters() if id(p) in first]
        self.courses: list[Course] = []
        for i, j in members:
            lr, self.decay, self.ema = optim_settings(j, config)
            self.courses.append(Course(j, results[i][j.name], lr, config))
            results[i][j.name].setting.update(lr=lr, weight_decay=self.decay, ema=self.ema)
        self.params, self.buffers = stacked_tensors([j.model for j in self.jobs])
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
        self.graphs = StepGraphs(self) if graphed else None

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
        return stacked_bits(self.template, self.amp, params, self.buffers, x, target, cond, prior, device)[0]

    def read_params(self) -> dict[str, torch.Tensor]:
        """The stacked parameters validation reads and a job keeps: the moving average in place of
        the trained ones where the job keeps one."""
        if self.average is None:
            return self.params
        return {**self.params, **dict(zip(self.trained, self.average.average))}

    def state_of(self, k: int) -> dict[str, torch.Tensor]:
        """Row set `k`'s weights as its module's state dict (what `Course` keeps at a new best):
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
        (replayed from a CUDA graph where the stack has them, `StepGraphs`)."""
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


class StepGraphs:
    """A stack's training step as CUDA graphs, one per batch shape (a full batch and the epoch's
    last): a step of a probe is a train of a few hundred small kernels, each launched from Python
    through vmap, and an H200 sat 90 % idle waiting for them (the attention probe on pixels: 11 ms
    a step, 7,428 steps). Replayed, the step launches them all at once. The graph reads the batch
    from its own input tensors, into which each step copies the batch."""

    def __init__(self, stack: Stack) -> None:
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


def stacked_tensors(models: Sequence[torch.nn.Module]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every parameter and buffer of the same module of several row sets, each stacked along a
    first dimension (one entry per row set): (parameters, buffers)."""
    first = models[0]
    return ({n: torch.stack([m.get_parameter(n).detach() for m in models]) for n, _ in first.named_parameters()},
            {n: torch.stack([m.get_buffer(n) for m in models]) for n, _ in first.named_buffers()})


def stacked_bits(template: torch.nn.Module, amp: bool, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
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
