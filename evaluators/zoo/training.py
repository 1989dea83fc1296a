"""Training a zoo recipe: deterministic, resumable, and only ever published whole.

Determinism. Every random draw is a function of (seed, step): the initial weights come
from `torch.manual_seed(seed)`, each step's batch and patch mask from a generator seeded by
`derive_seed(seed, step)`. The model has no dropout, deterministic algorithms are on and
training runs on one thread (a sum split across threads may round differently), so a run
resumed from its checkpoint takes exactly the steps an uninterrupted run takes, and the
same seed gives the same weight bytes.

Publication. A recipe trains into `<zoo>/NAME-<hash>` (`Recipe.folder`: the hash covers every
setting, seed and steps included), so a changed recipe never overwrites, resumes or passes for a
model trained earlier; old folders stay where they are. While training, state lives in
`<zoo>/.NAME-<hash>.partial/` (a checkpoint written atomically every few steps, tagged with its
recipe and data). The finished model is written with `save_pretrained` into a temporary
directory, with its objective's head in `head/` (`evaluators.zoo.heads`; models trained before
heads were published have none), its card last, and renamed into place in one step; `zoo:NAME`
accepts only a directory whose card is there.

Verification. The card records the sha256 of the files a model loads from (`WEIGHT_FILES`);
`damage` checks them before the model is used or listed, so a truncated, replaced or deleted
weights file, or a card of the wrong shape, marks the model damaged rather than loading (or
half-loading) it. A card written before hashes were recorded gains them once its files load.
The card, its checks and the partial folder's name live in `evaluators.zoo.cards` (no torch).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from bench.core.dataset import Dataset, decode_image, replacing, write_json_atomic
from bench.core.errors import BenchError
from bench.core.hashing import config_hash, derive_seed, file_sha256, sha256_hex
from bench.core.resources import disk_full
from evaluators.zoo.cards import CARD_NAME, WEIGHT_FILES, damage, partial_dir, read_card
from evaluators.zoo.heads import LOSS_BATCH, save_head, val_mask_seed
from evaluators.zoo.recipes import Recipe

STATE_NAME = "state.pt"
RUN_NAME = "run.json"
CHECKPOINT_EVERY = 20
#: ViTImageProcessor's defaults, which the saved processor config records.
MEAN, STD = 0.5, 0.5

Progress = Callable[[int], None]


def train_recipe(recipe: Recipe, root: Path, *, progress: Progress | None = None,
                 on_start: Callable[[int], None] | None = None) -> Path:
    """Train (or resume) `recipe` and publish it at `root/NAME-<hash>`; returns that directory.

    A finished model of the same recipe is reused; a directory there without a card, or an
    interrupted run on other scenes, is a BenchError (the user decides what to delete).
    """
    final = root / recipe.folder
    if read_card(final) is not None:
        if damage(final) is None:
            return final
        shutil.rmtree(final)  # the zoo's own folder for this recipe, damaged: trained again
    if final.exists():
        raise BenchError(f"zoo: {final} exists but holds no {CARD_NAME} (not a finished zoo model); delete it")
    # the untrained control reads no data: its card says so rather than naming scenes it never saw
    data = training_data(recipe, root / "data") if recipe.objective != "untrained" else None
    with _deterministic():
        model, head, state = _start(recipe, partial_dir(root, recipe), data["fingerprint"] if data else None)
        if on_start:
            on_start(recipe.steps)
        if progress and state["step"]:
            progress(state["step"])
        clock = _Clock(state["wall_s"])
        losses = _train(recipe, model, head, state, data, partial_dir(root, recipe), progress, clock) if data else []
        val = _mean_loss(recipe, model, head, data["val"], val_mask_seed(recipe)) if data else None
    card = dict(
        name=recipe.name, folder=recipe.folder, objective=recipe.objective, seed=recipe.seed, steps=recipe.steps, recipe=recipe.to_dict(),
        data=dict(generator="colorshape", preset=recipe.data_preset, seed=recipe.seed, fingerprint=data["fingerprint"],
                  n_train=len(data["train"]["x"]), n_val=len(data["val"]["x"])) if data else None,
        final_train_loss=float(np.mean(losses[-10:])) if losses else None, final_val_loss=val,
        wall_time_s=round(clock(), 3), threads=1, torch=torch.__version__,
    )
    _publish(model, head if data else None, recipe, card, final)
    shutil.rmtree(partial_dir(root, recipe), ignore_errors=True)
    return final


# -- data ------------------------------------------------------------------------------------

def training_data(recipe: Recipe, data_root: Path) -> dict[str, Any]:
    """The recipe's train and val scenes (rendered once per preset and seed, reused) as tensors and
    codes; the test split is never rendered, so no test F code is drawn."""
    from generators.base import build_config, config_to_dict, get_generator
    from generators.engine import generate

    gen = get_generator("colorshape")
    config = build_config(gen, recipe.data_preset, {**recipe.data, "seed": recipe.seed, "n_test": 0})
    where = data_root / f"colorshape-{recipe.data_preset}-{config_hash(config_to_dict(config))}"
    try:
        ds = Dataset(where)
    except BenchError:
        generate(gen, config, where, overwrite=True)
        ds = Dataset(where)
    out: dict[str, Any] = {"fingerprint": sha256_hex(ds.fingerprint("train"), ds.fingerprint("val"))}
    for split in ("train", "val"):
        f, o, _ = ds.codes(split)
        images = [decode_image(im) for im in ds.table(split, ["image"])["image"].to_pylist()]
        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()  # uint8, N x 3 x H x W
        out[split] = {"x": x, "F": torch.from_numpy(f).float(), "O": torch.from_numpy(o).float()}
    return out


def pixels(x: torch.Tensor) -> torch.Tensor:
    """uint8 images as the saved processor prepares them: rescale to [0, 1], normalise."""
    return (x.float() / 255 - MEAN) / STD


# -- the model and its objective ---------------------------------------------------------------

def build_model(recipe: Recipe) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The ViT and the objective's head, initialised from the recipe's seed."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(recipe.seed)
    model = ViTModel(ViTConfig(**recipe.architecture), add_pooling_layer=False)
    width, patch = recipe.architecture["hidden_size"], recipe.architecture["patch_size"]
    outputs = {"conjunctions": 64, "features": 16, "masked": 3 * patch * patch, "untrained": 1}[recipe.objective]
    return model, torch.nn.Linear(width, outputs)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """Images (N, 3, H, W) as their patches' pixels (N, patches row-major, 3·p·p): the masked head's targets."""
    n, _, h, w = x.shape
    return x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(n, (h // p) * (w // p), -1)


def hide(x: torch.Tensor, hidden: torch.Tensor, p: int) -> torch.Tensor:
    """`x` with the patches `hidden` (N, patches) marks set to 0 (grey): what the masked model reads."""
    n, _, h, w = x.shape
    grid = hidden.view(n, 1, h // p, w // p).float()
    return x * (1 - grid.repeat_interleave(p, 2).repeat_interleave(p, 3))


def head_loss(objective: str, head: torch.nn.Module, last: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The objective's loss per element, before it is averaged: `last` is the ViT's last hidden state after
    its final layer norm (`last_hidden_state`, CLS first). `masked`: the squared error of every patch's
    reconstruction, averaged over its pixels (N, patches; training averages the hidden ones);
    `conjunctions`/`features`: the binary cross-entropy of each O or F value read from CLS (N, values).
    Training and the `objective` task (`evaluators.tasks.objective`) both reduce this."""
    if objective == "masked":
        return ((head(last[:, 1:]) - target) ** 2).mean(-1)
    return torch.nn.functional.binary_cross_entropy_with_logits(head(last[:, 0]), target, reduction="none")


def _loss(recipe: Recipe, model: torch.nn.Module, head: torch.nn.Module, batch: dict[str, torch.Tensor],
          gen: torch.Generator) -> torch.Tensor:
    x = pixels(batch["x"])
    if recipe.objective == "masked":
        p = recipe.architecture["patch_size"]
        patches = patchify(x, p)
        hidden = torch.rand(patches.shape[:2], generator=gen) < recipe.mask_ratio
        return head_loss("masked", head, model(pixel_values=hide(x, hidden, p)).last_hidden_state, patches)[hidden].mean()
    target = batch["O"] if recipe.objective == "conjunctions" else batch["F"]
    return head_loss(recipe.objective, head, model(pixel_values=x).last_hidden_state, target).mean()


def _batch(split: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    return {k: v[index] for k, v in split.items()}


def _lr(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine decay to zero at the last step."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    t = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * 0.5 * (1 + np.cos(np.pi * t))


class _Clock:
    """Training wall time: earlier (interrupted) sessions' plus this one's so far."""

    def __init__(self, earlier: float) -> None:
        self.earlier, self.start = earlier, time.perf_counter()

    def __call__(self) -> float:
        return self.earlier + time.perf_counter() - self.start


def _train(recipe: Recipe, model: torch.nn.Module, head: torch.nn.Module, state: dict[str, Any],
           data: dict[str, Any], partial: Path, progress: Progress | None, clock: _Clock) -> list[float]:
    params = [*model.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    if state.get("optimizer"):
        opt.load_state_dict(state["optimizer"])
    n = len(data["train"]["x"])
    model.train()
    while state["step"] < recipe.steps:
        step = state["step"]
        gen = torch.Generator().manual_seed(derive_seed("zoo-step", recipe.seed, step))
        index = torch.randint(n, (recipe.batch_size,), generator=gen)
        for group in opt.param_groups:
            group["lr"] = _lr(recipe, step)
        loss = _loss(recipe, model, head, _batch(data["train"], index), gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state["losses"].append(float(loss.detach()))
        state["step"] += 1
        if progress:
            progress(1)
        if state["step"] % CHECKPOINT_EVERY == 0 or state["step"] == recipe.steps:
            state["wall_s"] = clock()
            _checkpoint(partial, model, head, opt, state)
    model.eval()
    return state["losses"]


@torch.no_grad()
def _mean_loss(recipe: Recipe, model: torch.nn.Module, head: torch.nn.Module, split: dict[str, torch.Tensor],
               seed: int) -> float | None:
    """The objective's loss over a whole split (None for the untrained control)."""
    if recipe.objective == "untrained":
        return None
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total, n = 0.0, len(split["x"])
    for start in range(0, n, LOSS_BATCH):
        index = torch.arange(start, min(n, start + LOSS_BATCH))
        total += float(_loss(recipe, model, head, _batch(split, index), gen)) * len(index)
    return total / n


# -- checkpoints and publication ---------------------------------------------------------------

def _run_tag(recipe: Recipe, fingerprint: str | None) -> dict[str, Any]:
    return {"seed": recipe.seed, "steps": recipe.steps, "recipe": config_hash(recipe.to_dict()), "data": fingerprint}


def _start(recipe: Recipe, partial: Path, fingerprint: str | None) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, Any]]:
    """A fresh model, or the interrupted run's model, head, optimizer and step (same recipe and scenes only)."""
    model, head = build_model(recipe)
    tag = _run_tag(recipe, fingerprint)
    if (partial / RUN_NAME).is_file() and (partial / STATE_NAME).is_file():
        found = json.loads((partial / RUN_NAME).read_text())
        if found != tag:  # same recipe hash, other scenes: the generator has changed since
            raise BenchError(f"zoo: {recipe.name} has an interrupted run on other training scenes in {partial}; "
                             f"delete that directory to train afresh")
        saved = torch.load(partial / STATE_NAME, weights_only=False)
        model.load_state_dict(saved["model"])
        head.load_state_dict(saved["head"])
        return model, head, saved["state"]
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    write_json_atomic(tag, partial / RUN_NAME)
    return model, head, {"step": 0, "losses": [], "wall_s": 0.0, "optimizer": None}


def _checkpoint(partial: Path, model: torch.nn.Module, head: torch.nn.Module, opt: torch.optim.Optimizer,
                state: dict[str, Any]) -> None:
    buffer = io.BytesIO()  # serialised first: torch.save to a full disk raises a RuntimeError that names no cause
    torch.save({"model": model.state_dict(), "head": head.state_dict(),
                "state": {**state, "optimizer": opt.state_dict()}}, buffer)
    with replacing(partial / STATE_NAME) as tmp:
        tmp.write_bytes(buffer.getbuffer())


def _publish(model: torch.nn.Module, head: torch.nn.Module | None, recipe: Recipe, card: dict[str, Any],
             final: Path) -> None:
    """save_pretrained + processor config + the objective's head (`evaluators.zoo.heads`; the untrained
    control has none) + card into a temporary directory, then one rename."""
    from transformers import ViTImageProcessor

    from evaluators.backbones.hf import quiet_transformers

    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with quiet_transformers():
            model.save_pretrained(tmp)
        side = int(model.config.image_size)
        ViTImageProcessor(size={"height": side, "width": side}, image_mean=[MEAN] * 3, image_std=[STD] * 3,
                          do_resize=True, do_rescale=True, do_normalize=True, resample=2).save_pretrained(tmp)
        if head is not None:
            save_head(head, recipe, tmp)
        write_json_atomic({**card, "files": {f: file_sha256(tmp / f) for f in WEIGHT_FILES}}, tmp / CARD_NAME)
        os.replace(tmp, final)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)  # half a model is never left, not even under a temporary name
        if disk_full(e):  # safetensors reports it as its own error type, naming the cause only in its text
            raise BenchError(f"zoo: disk full while writing {final}: free space and run `bench zoo train "
                             f"{card['name']}` again (training resumes from its last checkpoint)") from None
        raise


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """One thread and deterministic kernels while training; the caller's settings after."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(strict)
        torch.set_num_threads(threads)
