"""Hugging Face vision transformers: hub ids, local checkpoints and `random:` presets.

Hub ids resolve offline first: a snapshot in the local cache is used as is; only
when it is missing is it downloaded (`hub.py`: the cache, the network probe and its
watchdog). Every checkpoint is then loaded from its directory, so a hub id and a local
copy take exactly the same path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from bench.core.errors import BenchError
from bench.core.hashing import stable_json
from evaluators.backbones.base import AttentionQK, Backbone, BackboneInfo, decode_resized
from evaluators.backbones.hub import cached_snapshot, download_snapshot
from evaluators.backbones.metadata import check_checkpoint
from evaluators.backbones.presets import (FAMILIES, IMAGENET_MEAN, IMAGENET_STD, Family, Preprocess, Preset,
                                         checked_preprocessing)
from evaluators.backbones.weights import WEIGHT_PATTERNS, files_hash, state_dict_hash

#: Where each family keeps a block's pre-attention norm, its attention module, and the
#: query/key projections inside it (dotted paths, first match wins; transformers 5.x
#: names first, the nested `attention.attention.query` of 4.x ViT/DINOv2 after).
BLOCK_NORMS = ("norm1", "layer_norm1", "layernorm_before")
BLOCK_ATTENTIONS = ("attention", "self_attn")
ATTENTION_QUERIES = ("q_proj", "attention.query", "query")
ATTENTION_KEYS = ("k_proj", "attention.key", "key")


class HFBackbone(Backbone):
    """A transformers vision model run for all its hidden states in one forward pass."""

    #: (folder, where each default came from) when no preprocessor config stated the input side
    #: and normalisation (see `input_note`), and the overrides given since (`override_preprocessing`).
    unstated_input: tuple[Path, dict[str, str]] | None = None
    overridden: frozenset[str] = frozenset()

    def __init__(self, spec: str, model: torch.nn.Module, config: Any, family: Family,
                 preprocess: Preprocess, input_size: int, revision: str, weights: str) -> None:
        self.model = model.eval()
        self.config = config
        self.family = family
        self.preprocess = preprocess
        self.weights = weights
        n_reg = family.registers(config)
        self.info = BackboneInfo(
            spec=spec, family=family.name, revision=revision,
            n_params=sum(p.numel() for p in model.parameters()), patch_size=int(config.patch_size),
            input_size=int(input_size), n_layers=int(config.num_hidden_layers), width=int(config.hidden_size),
            n_prefix=1 + n_reg, cls_index=0, register_indices=tuple(range(1, 1 + n_reg)),
        )
        self._set_normalisation(preprocess)

    def _set_normalisation(self, p: Preprocess) -> None:
        self._mean = torch.tensor(p.mean if p.do_normalize else (0.0,) * 3).view(1, 3, 1, 1)
        self._std = torch.tensor(p.std if p.do_normalize else (1.0,) * 3).view(1, 3, 1, 1)
        self._scale = p.rescale_factor if p.do_rescale else 1.0

    def override_preprocessing(self, image_size: int | None = None, mean: Sequence[float] | None = None,
                               std: Sequence[float] | None = None) -> "HFBackbone":
        """The user's native input side and normalisation in place of the checkpoint's (a folder
        without a preprocessor config, or a model trained with other statistics). Both enter
        `identity`, so activations cached under the old settings are never reused."""
        given = checked_preprocessing(image_size, mean, std)
        side = given.get("image_size")
        if side is not None and side % (self.info.patch_size or 1):
            raise BenchError(f"image_size: {side} px is not a positive multiple of {self.info.spec}'s "
                             f"patch size {self.info.patch_size}")
        self.preprocess = dataclasses.replace(self.preprocess, **{k: v for k, v in given.items() if k != "image_size"})
        self._set_normalisation(self.preprocess)
        if side is not None:
            self.info = dataclasses.replace(self.info, input_size=side)
        self.overridden = self.overridden | set(given)
        return self

    def input_note(self) -> str | None:
        """For a folder without preprocessor_config.json, the one line that says which input side
        and normalisation it runs with and where each came from (they change every number);
        None when the checkpoint's own processor config said."""
        if self.unstated_input is None:
            return None
        path, defaults = self.unstated_input

        def origin(name: str) -> str:
            return f"--{name.replace('_', '-')}" if name in self.overridden else defaults[name]

        p = self.preprocess
        return (f"model: {path} has no preprocessor_config.json; using image size {self.info.input_size} px "
                f"({origin('image_size')}), mean {list(p.mean)} ({origin('mean')}), std {list(p.std)} "
                f"({origin('std')}), bicubic resize")

    def identity(self) -> dict[str, Any]:
        return {"family": self.family.name, "class": self.family.model_class, "weights": self.weights,
                "config": _config_identity(self.config), "preprocess": self.preprocess.to_dict()}

    def to(self, device: torch.device, dtype: str) -> "HFBackbone":
        super().to(device, dtype)
        self.model.to(device)
        return self

    def prepare(self, rows: dict[str, list], side: int) -> torch.Tensor:
        """Decode, resize the whole image to side x side (never crop: objects at the border count), normalise."""
        pixels = np.stack([decode_resized(im, side, self.preprocess.resample) for im in rows["image"]])
        x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().mul_(self._scale)
        return x.sub_(self._mean).div_(self._std)

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        x = inputs.to(self.device, non_blocking=True)
        kwargs: dict[str, Any] = {"output_hidden_states": True}
        if self.family.interpolate_flag and x.shape[-1] != int(self.config.image_size):
            kwargs["interpolate_pos_encoding"] = True
        if self.family.name == "mae":  # argsort(arange) is the identity: no shuffle, patch order kept
            n = (x.shape[-2] // self.info.patch_size) * (x.shape[-1] // self.info.patch_size)
            kwargs["noise"] = torch.arange(n, device=x.device, dtype=torch.float32).expand(x.shape[0], n)
        with torch.inference_mode(), autocast(self.device, self.dtype):
            hs = self.model(pixel_values=x, **kwargs).hidden_states
        return [hs[i] for i in layers]

    def blocks(self) -> torch.nn.ModuleList:
        """The transformer blocks in order: the ModuleList of `num_hidden_layers` blocks
        (`encoder.layer` in DINOv2, `encoder.layers` in CLIP, `layers` in ViT and MAE)."""
        n = self.info.n_layers
        found = [(name, m) for name, m in self.model.named_modules()
                 if isinstance(m, torch.nn.ModuleList) and len(m) == n and name.split(".")[-1] in ("layer", "layers")]
        if not found:
            raise BenchError(f"probe: cannot find the {n} transformer blocks of {self.info.spec}")
        return min(found, key=lambda t: t[0].count("."))[1]

    def attention_qk(self, layer: int) -> AttentionQK | None:
        n = self.info.n_layers
        if not 0 <= layer < n:
            raise BenchError(f"probe: attention-qk needs the block that reads hidden state {layer}; {self.info.spec} "
                             f"has blocks 0..{n - 1} (the last hidden state {n} feeds none)")
        block = self.blocks()[layer]
        attn = _submodule(block, BLOCK_ATTENTIONS)
        parts = (_submodule(block, BLOCK_NORMS), _submodule(attn, ATTENTION_QUERIES) if attn else None,
                 _submodule(attn, ATTENTION_KEYS) if attn else None)
        if any(p is None for p in parts):
            raise BenchError(f"probe: attention-qk: cannot find the pre-attention norm and query/key projections "
                             f"in {type(block).__name__} of {self.info.spec}")
        return AttentionQK(*parts, n_heads=int(self.config.num_attention_heads))


def _submodule(module: torch.nn.Module, paths: Sequence[str]) -> torch.nn.Module | None:
    """The first of `paths` (dotted) that names a submodule of `module`."""
    for path in paths:
        try:
            return module.get_submodule(path)
        except AttributeError:
            continue
    return None


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for bf16/fp16 (CPU autocast uses AMX for bf16); fp32 runs as is."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])


def _config_identity(config: Any) -> dict[str, Any]:
    d = config.to_dict()
    for k in ("transformers_version", "_name_or_path", "architectures", "torch_dtype", "dtype", "id2label", "label2id"):
        d.pop(k, None)
    return json.loads(stable_json(d))


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' load reports and progress bars silenced while a model is built or loaded, so
    extraction output stays clean (the zoo's trainer builds its ViTs under it too)."""
    import transformers

    log = transformers.utils.logging
    level, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(level)
        if bars:
            log.enable_progress_bar()


def _family(model_type: str, where: str) -> Family:
    if model_type not in FAMILIES:
        raise BenchError(
            f"model: {where} is a {model_type!r} checkpoint; supported model types: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]


def load_local(spec: str, path: Path, revision: str | None = None) -> HFBackbone:
    """A checkpoint directory: config.json and weights, with or without preprocessor_config.json
    (without it, `_config_settings`; `resolve_backbone` then says which input settings it runs with)."""
    import transformers
    from transformers import AutoConfig, AutoImageProcessor

    check_checkpoint(path)
    with quiet_transformers():
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        family = _family(config.model_type, str(path))
        if config.model_type == "clip":  # vision tower only: the text tower is never built
            config = config.vision_config
        if family.name == "mae":
            config.mask_ratio = 0.0
        if (path / "preprocessor_config.json").is_file():
            try:
                processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
            except (OSError, ValueError) as e:
                raise BenchError(f"model: {path} has no usable preprocessor_config.json ({str(e).splitlines()[0]})") from None
            preprocess, native = _processor_settings(processor)
            origins = None
        else:
            preprocess, native, origins = _config_settings(config)
        cls = getattr(transformers, family.model_class)
        extra = {"add_pooling_layer": False} if family.name == "vit" else {}
        from safetensors import SafetensorError

        try:
            model = cls.from_pretrained(path, config=config, local_files_only=True, dtype=torch.float32, **extra)
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:  # weights missing or cut short
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BenchError(f"model: {path} has no readable weights ({first})") from None
    weights = files_hash(sorted(f for pat in WEIGHT_PATTERNS for f in path.glob(pat)))
    backbone = HFBackbone(spec, model, config, family, preprocess, native, revision or f"sha256:{weights[:12]}",
                          weights)
    if origins is not None:
        backbone.unstated_input = (path, origins)
    return backbone


def _config_settings(config: Any) -> tuple[Preprocess, int, dict[str, str]]:
    """A `save_pretrained` folder without preprocessor_config.json: the input side is the
    config's `image_size`, mean/std the config's `image_mean`/`image_std` or ImageNet's; also
    where each came from, for the line `HFBackbone.input_note` says once."""
    origins = {"image_size": "config.json"}
    for name in ("mean", "std"):
        origins[name] = "config.json" if getattr(config, f"image_{name}", None) else "ImageNet's"
    mean = tuple(float(v) for v in getattr(config, "image_mean", None) or IMAGENET_MEAN)
    std = tuple(float(v) for v in getattr(config, "image_std", None) or IMAGENET_STD)
    return Preprocess(mean=mean, std=std), int(config.image_size), origins


def _processor_settings(processor: Any) -> tuple[Preprocess, int]:
    """Resample filter, rescale and mean/std of the checkpoint's processor, and its native input side."""
    crop = getattr(processor, "crop_size", None)
    size = processor.size
    if getattr(processor, "do_center_crop", False) and crop:
        native = _side(crop)
    else:
        native = _side(size)
    pre = Preprocess(
        mean=tuple(float(v) for v in processor.image_mean), std=tuple(float(v) for v in processor.image_std),
        resample=int(processor.resample), rescale_factor=float(processor.rescale_factor),
        do_normalize=bool(processor.do_normalize), do_rescale=bool(processor.do_rescale),
    )
    return pre, native


def _side(size: Any) -> int:
    get = size.get if isinstance(size, dict) else lambda k: getattr(size, k, None)
    for key in ("height", "shortest_edge"):
        if get(key):
            return int(get(key))
    raise BenchError(f"model: cannot read an input size from the image processor's size {size}")


def _build_preset(preset: Preset) -> torch.nn.Module:
    """A preset's architecture from the config shipped in presets.py (initialised on the current device)."""
    import transformers

    family = FAMILIES[preset.model_type]
    config = transformers.CONFIG_MAPPING[preset.model_type](**preset.config)
    extra = {"add_pooling_layer": False} if family.name == "vit" else {}
    with quiet_transformers():
        return getattr(transformers, family.model_class)(config, **extra)


def build_random(spec: str, preset: Preset, seed: int = 0) -> HFBackbone:
    """The preset's architecture with seeded random init (the untrained control; no download)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _build_preset(preset)
    return HFBackbone(spec, model, model.config, FAMILIES[preset.model_type], preset.preprocess, preset.input_size,
                      f"seed={seed}", state_dict_hash(model))


def preset_n_params(preset: Preset) -> int:
    """Parameter count of a preset's architecture, built on the meta device (no memory, no download)."""
    with torch.device("meta"):
        model = _build_preset(preset)
    return sum(p.numel() for p in model.parameters())


def load_hub(spec: str, repo_id: str, revision: str | None = None) -> HFBackbone:
    """A hub id: the cached snapshot if there is one, otherwise a download (fails fast offline)."""
    path = cached_snapshot(repo_id, revision)
    if path is None:
        path = download_snapshot(repo_id, revision)
    return load_local(spec, path, revision=path.name)
