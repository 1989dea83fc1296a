"""The segmentation heads and how they are trained (the package docstring, `evaluators.tasks.segmentation`,
says what each predicts): linear maps of standardised patch tokens, trained with AdamW on the
train images, stopped early on the validation loss, on the device. A split's tokens go to the
device once; an epoch reads the host once (its validation loss, for early stopping), never a step."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from bench.core.errors import BenchError
from evaluators.fitting.early_stopping import Plateau
from evaluators.tasks.issameobject.patch_labels import BACKGROUND


@dataclass(frozen=True)
class HeadConfig:
    """Training settings. `slots`: the instance head's K, raised to the most instances a training
    image holds (background one of them) when that is more. `lr` None = 3e-2 · sqrt(64 / D), at
    most 3e-2 (a linear logit sums D standardised terms). `pair_budget`: the instance loss holds
    images x patches² pair weights, so its batches shrink on fine grids to stay under it. Batches
    shrink below `batch_size` images on small splits so an epoch takes at least `min_steps` steps.
    Measured on oracle:patches (60 train scenes, 37 classes): 32-image batches at 1e-2 read a
    semantic mIoU of 40% after 50 epochs, 4-image batches at 3e-2 read 100%."""

    epochs: int = 50
    batch_size: int = 32
    lr: float | None = None
    min_steps: int = 16
    weight_decay: float = 1e-4
    patience: int = 5
    min_delta: float = 1e-4
    slots: int = 16
    pair_budget: int = 2**22
    seed: int = 0
    device: str = "cpu"


@dataclass
class FittedHead:
    """A trained head: `predict(tokens)` gives each patch's class or slot, (N, T) int64 on the host;
    `val_loss` the validation loss it was kept at."""

    weight: torch.Tensor
    bias: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    best_epoch: int
    val_loss: float

    @torch.no_grad()
    def predict(self, tokens: np.ndarray, chunk: int = 64) -> np.ndarray:
        out = [logits(self, standardised(tokens[s : s + chunk], self.mean, self.std)).argmax(-1)
               for s in range(0, len(tokens), chunk)]
        return torch.cat(out).cpu().numpy() if out else np.zeros(tokens.shape[:2], np.int64)


def standardised(tokens: np.ndarray, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Tokens (N, T, D) as float32 on the statistics' device, standardised by the training statistics."""
    return (torch.from_numpy(np.asarray(tokens, np.float32)).to(mean.device) - mean) / std


def logits(head: FittedHead, x: torch.Tensor) -> torch.Tensor:
    return x @ head.weight.T + head.bias


def semantic_loss(z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every patch's class (mean over the batch's patches)."""
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), labels.reshape(-1))


def instance_loss(z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Permutation-invariant: two patches of one image agree by the inner product of their slot
    distributions (`PointwiseIdentityPair`'s agreement), trained towards "same instance" by binary
    cross-entropy over every pair of distinct patches. Each pair kind (same object, both background,
    two objects, object and background) weighs equally within the batch, so the many background
    pairs do not drown the pairs that tell two objects apart."""
    p = F.softmax(z, -1)
    agree = (p @ p.transpose(1, 2)).clamp(1e-6, 1 - 1e-6)
    same = labels[:, :, None] == labels[:, None, :]
    bg_i, bg_j = labels[:, :, None] == BACKGROUND, labels[:, None, :] == BACKGROUND
    kind = torch.where(bg_i & bg_j, 1, torch.where(bg_i | bg_j, 3, torch.where(same, 0, 2)))
    off_diagonal = ~torch.eye(labels.shape[1], dtype=torch.bool, device=labels.device)
    bce = -(same * agree.log() + ~same * (1 - agree).log())
    total = z.new_zeros(())
    for k in range(4):
        w = ((kind == k) & off_diagonal).to(z.dtype)
        total = total + (bce * w).sum() / w.sum().clamp(min=1.0)
    return total / 4


LOSSES = {"semantic": semantic_loss, "instance": instance_loss}


def fit_head(name: str, train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], n_out: int,
             config: HeadConfig) -> FittedHead:
    """Fit head `name` ("semantic": `n_out` classes; "instance": `n_out` slots) on (tokens (N, T, D),
    labels (N, T)) of train, keeping the weights of the epoch with the lowest validation loss."""
    loss_fn = LOSSES[name]
    tokens, labels = train
    if len(tokens) == 0 or len(val[0]) == 0:
        raise BenchError(f"segmentation: the {'train' if len(tokens) == 0 else 'val'} split has no images")
    dev = torch.device(config.device)
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    flat = np.asarray(tokens, np.float64).reshape(-1, tokens.shape[-1])
    mean = torch.from_numpy(flat.mean(0).astype(np.float32)).to(dev)
    std = torch.from_numpy(np.where(flat.std(0) > 1e-6, flat.std(0), 1.0).astype(np.float32)).to(dev)
    x, y = standardised(tokens, mean, std), torch.from_numpy(np.asarray(labels, np.int64)).to(dev)
    vx, vy = standardised(val[0], mean, std), torch.from_numpy(np.asarray(val[1], np.int64)).to(dev)
    d = x.shape[-1]
    weight = torch.nn.Parameter(torch.randn(n_out, d, generator=gen).to(dev) * 0.01)
    bias = torch.nn.Parameter(torch.zeros(n_out, device=dev))
    lr = config.lr if config.lr is not None else 3e-2 * min(1.0, math.sqrt(64 / d))
    opt = torch.optim.AdamW([weight, bias], lr=lr, weight_decay=config.weight_decay)
    batch = max(1, min(config.batch_size, math.ceil(len(x) / config.min_steps),
                       config.pair_budget // x.shape[1] ** 2 if name == "instance" else len(x)))
    head = FittedHead(weight, bias, mean, std, -1, math.inf)
    plateau, best = Plateau(math.inf, config.patience, config.min_delta), None
    for epoch in range(config.epochs):
        order = torch.randperm(len(x), generator=gen).to(dev)
        for start in range(0, len(x), batch):
            b = order[start : start + batch]
            loss = loss_fn(logits(head, x[b]), y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            v = float(sum(loss_fn(logits(head, vx[s : s + batch]), vy[s : s + batch]) * len(vx[s : s + batch])
                          for s in range(0, len(vx), batch)) / len(vx))  # the epoch's one host read
        if not math.isfinite(v):
            raise FloatingPointError(f"validation loss is {v} at epoch {epoch}")
        if plateau.improved(v):
            best = (weight.detach().clone(), bias.detach().clone(), epoch, v)
        elif plateau.stopped:
            break
    if best is None:
        raise FloatingPointError("the validation loss never improved on its start")
    w, b, epoch, v = best
    return FittedHead(w, b, mean, std, epoch, v)
