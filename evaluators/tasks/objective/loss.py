"""A zoo model's training loss on a split, per scene, through the backbone's own forward pass, and
its bootstrap interval (package docstring, `evaluators.tasks.objective`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from bench.core.console import progress_bar
from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from evaluators.backbones.base import Backbone
from evaluators.cache.extract import dataset_side
from evaluators.zoo.heads import Head, load_head
from evaluators.zoo.cards import read_card
from evaluators.zoo.training import head_loss, hide, patchify


def zoo_model(backbone: Backbone) -> tuple[Any, Path]:
    """The zoo model a backbone is or wraps (an intervened backbone's `base`) and its folder; a
    BenchError for a backbone that is no zoo model (it has no head) and for the untrained control."""
    base = getattr(backbone, "base", backbone)
    spec = base.info.spec
    if spec.startswith("zoo:"):
        from evaluators.zoo import model_path

        folder = model_path(spec.split(":", 1)[1])
    else:
        folder = Path(spec).expanduser()
    card = read_card(folder) if folder.is_dir() else None
    if not isinstance(card, dict) or not hasattr(getattr(base, "model", None), "layernorm"):
        raise BenchError(f"objective: {backbone.info.spec} has no head (only zoo models publish the head they "
                         "were trained with)")
    if card.get("objective") == "untrained":
        raise BenchError(f"objective: {backbone.info.spec} has no objective (the untrained control is never trained)")
    return base, folder


def check_head(backbone: Backbone, probes: Sequence[str]) -> None:
    """The task's `check_backbone`: refuse, before any work, a backbone whose zoo model has no usable head."""
    base, folder = zoo_model(backbone)
    load_head(folder, base.info.spec)


@contextlib.contextmanager
def greyed(embeddings: torch.nn.Module, hidden: torch.Tensor, patch: int) -> Iterator[None]:
    """While inside, the ViT's embeddings read their pixels with the `hidden` patches greyed out (`hide`,
    as training masks them), whoever calls the forward pass: the backbone (or its wrapper) runs unchanged."""
    def grey(module: torch.nn.Module, args: tuple) -> tuple:
        return (hide(args[0], hidden.to(args[0].device), patch), *args[1:])

    handle = embeddings.register_forward_pre_hook(grey)
    try:
        yield
    finally:
        handle.remove()


def scene_losses(backbone: Backbone, ds: Dataset, split: str, *, limit: int | None = None, device: str = "cpu",
                 dtype: str = "fp32", progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per scene of `split` (its first `limit`), the objective's loss summed over the elements training averages
    (`head_loss`: the hidden patches of the masked model, a CLS head's one per-scene mean) and their count, so
    that sum(losses) / sum(counts) over any set of scenes is training's loss on them as one batch. The last
    hidden state is the backbone's own `hidden_states` output at its last layer, with the ViT's final layer norm."""
    base, folder = zoo_model(backbone)
    head = load_head(folder, base.info.spec)
    n = ds.num_rows(split) if limit is None else min(limit, ds.num_rows(split))
    side = backbone.input_side(dataset_side(ds, split))
    columns = list(dict.fromkeys([*backbone.columns, *base.columns]))
    table = ds.table(split, columns).slice(0, n)
    codes = None if head.target == "pixels" else _codes(ds, split, head, backbone.info.spec)[:n]
    dev = torch.device(device)
    backbone = backbone.to(dev, dtype)
    module = head.module.to(dev)
    gen = torch.Generator().manual_seed(head.mask_seed)  # the masks training draws for its validation loss
    sums, counts = [], []
    with _bar(progress, f"objective {backbone.info.spec} {split}", n) as advance, torch.inference_mode():
        for start in range(0, n, head.batch):
            rows = {c: table.column(c).slice(start, head.batch).to_pylist() for c in columns}
            loss, count = _batch_losses(backbone, base, head, module, rows, side, codes, start, gen)
            sums.append(loss.double().cpu().numpy())
            counts.append(count.double().cpu().numpy())
            advance(len(rows[columns[0]]))
    return np.concatenate(sums), np.concatenate(counts)


def _batch_losses(backbone: Backbone, base: Any, head: Head, module: torch.nn.Module, rows: dict[str, list],
                  side: int, codes: np.ndarray | None, start: int, gen: torch.Generator
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch's per-scene loss sums and element counts (`scene_losses`)."""
    inputs = backbone.prepare(rows, side)
    layer = [backbone.info.n_layers]
    if head.target == "pixels":
        target = patchify(base.prepare(rows, side), head.patch_size)  # what the ViT reads, before greying
        hidden = torch.rand(target.shape[:2], generator=gen) < head.mask_ratio
        with greyed(base.model.embeddings, hidden, head.patch_size):
            last = backbone.hidden_states(inputs, layer)[0]
    else:
        last = backbone.hidden_states(inputs, layer)[0]
        target = torch.from_numpy(codes[start:start + len(last)]).float()
        hidden = torch.ones(len(last), 1, dtype=torch.bool)
    last = base.model.layernorm(last.float())
    terms = head_loss(head.objective, module, last, target.to(last.device))
    if head.target == "pixels":
        mask = hidden.to(terms.device)
        return (terms * mask).sum(1), mask.sum(1)
    return terms.mean(1), hidden.sum(1)


def _codes(ds: Dataset, split: str, head: Head, spec: str) -> np.ndarray:
    """The split's O or F codes the head predicts; a BenchError when the dataset has none of its width."""
    try:
        f, o, _ = ds.codes(split)
    except (KeyError, ValueError):
        f = o = None
    codes = o if head.target == "O" else f
    width = head.module.out_features
    if codes is None or codes.shape[1] != width:
        found = "none" if codes is None else f"{codes.shape[1]} values"
        raise BenchError(f"objective: {spec}'s head predicts the {width} values of the {head.target} code of the "
                         f"zoo's scenes; {ds.path} has {found} (use ColorShape with the zoo's colours and shapes, "
                         "e.g. `bench generate colorshape --preset zoo`)")
    return codes


@contextlib.contextmanager
def _bar(enabled: bool, label: str, total: int) -> Iterator[Any]:
    if not enabled:
        yield lambda n: None
        return
    with progress_bar(label, total) as bar:
        yield bar.advance


def ratio_interval(sums: np.ndarray, counts: np.ndarray, *, seed: int, n_boot: int = 1000,
                   level: float = 0.95) -> tuple[float, float, float]:
    """sum(sums) / sum(counts) and its percentile bootstrap interval over scenes (each drawn scene brings
    its sum and its count)."""
    rng = np.random.default_rng(seed)
    n = len(sums)
    draws = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (draws @ sums) / (draws @ counts)
    boot = boot[np.isfinite(boot)]
    tail = (1 - level) / 2 * 100
    return (float(sums.sum() / counts.sum()), float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail)))
