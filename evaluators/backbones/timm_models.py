"""`timm:<name>`: timm Vision Transformers (optional extra: `pip install 'bindingbench[timm]'`).

Any timm model with a `blocks` list and `forward_intermediates` (VisionTransformer,
EVA, DeiT, ...) runs for all its hidden states in one pass: hooks on the blocks
collect their outputs while timm's own `forward_intermediates` runs, so position
embeddings (resampled for non-native sizes, `dynamic_img_size=True`), prefix tokens
and rotary embeddings are timm's. Hidden state 0 is the input of block 0 (after
position embeddings and the pre-norm); hidden state k is the output of block k, like
transformers' `hidden_states`. Prefix tokens are timm's `num_prefix_tokens`, in timm's
order: class token (when `has_class_token`), then registers or distillation tokens.
Mean, std, interpolation and input size are timm's `resolve_model_data_config`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from bench.core.errors import BenchError
from evaluators.backbones.base import AttentionQK, BackboneInfo
from evaluators.backbones.fused_qk import fused_attention_qk
from evaluators.backbones.hf import HFBackbone, autocast
from evaluators.backbones.hub import Download
from evaluators.backbones.hub_weights import hub_file, hub_file_download, require_network, weights_download
from evaluators.backbones.presets import Family, Preprocess
from evaluators.backbones.state_files import check_state_file
from evaluators.backbones.weights import state_dict_hash

FAMILY = Family("timm", "timm", False)
INSTALL = "pip install 'bindingbench[timm]'"


class TimmBackbone(HFBackbone):
    """HF-style preprocessing (whole image resized, never cropped); timm's forward and metadata."""

    def __init__(self, spec: str, model: torch.nn.Module, name: str, revision: str | None,
                 model_kwargs: dict[str, Any] | None = None) -> None:
        import timm

        self.model, self.family, self.config, self.name = model.eval(), FAMILY, None, name
        self.model_kwargs = dict(model_kwargs or {})
        self.weights = state_dict_hash(model)
        data = timm.data.resolve_model_data_config(model)
        height, width = data["input_size"][-2:]
        if height != width:
            raise BenchError(f"model: {name} takes {height}x{width} px images; only square inputs are supported")
        self.preprocess = Preprocess(mean=tuple(float(v) for v in data["mean"]),
                                     std=tuple(float(v) for v in data["std"]),
                                     resample=_pil_filter(str(data["interpolation"]), name))
        n_prefix = int(model.num_prefix_tokens)
        has_cls = bool(getattr(model, "has_class_token", getattr(model, "cls_token", None) is not None))
        patch = model.patch_embed.patch_size
        self.info = BackboneInfo(
            spec=spec, family="timm", revision=revision or f"sha256:{self.weights[:12]}", n_params=sum(p.numel() for p in model.parameters()),
            patch_size=int(patch[0]), input_size=int(width), n_layers=len(model.blocks), width=int(model.embed_dim),
            n_prefix=n_prefix, cls_index=0 if has_cls else None, register_indices=tuple(range(int(has_cls), n_prefix)),
        )
        self._set_normalisation(self.preprocess)

    def identity(self) -> dict[str, Any]:
        return {"family": "timm", "name": self.name, "kwargs": self.model_kwargs, "weights": self.weights,
                "preprocess": self.preprocess.to_dict()}

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        """One pass of timm's `forward_intermediates`, stopped after the last block needed."""
        m, wanted = self.model, sorted(set(layers))
        out: dict[int, torch.Tensor] = {}
        hooks = [m.blocks[0].register_forward_pre_hook(lambda mod, args: out.__setitem__(0, args[0]))]
        hooks += [m.blocks[i - 1].register_forward_hook(lambda mod, args, y, i=i: out.__setitem__(i, y))
                  for i in wanted if i > 0]
        try:
            with torch.inference_mode(), autocast(self.device, self.dtype):
                m.forward_intermediates(inputs.to(self.device, non_blocking=True), indices=[max(max(wanted) - 1, 0)],
                                        stop_early=True, intermediates_only=True, output_fmt="NLC")
        finally:
            for h in hooks:
                h.remove()
        return [out[i] for i in layers]

    def blocks(self) -> torch.nn.ModuleList:
        return self.model.blocks

    def attention_qk(self, layer: int) -> AttentionQK | None:
        """Block `layer`'s norm1 and the q/k thirds of its fused `qkv` (with timm's q/k norms).
        None for blocks whose logits are not a function of the two tokens alone: rotary
        position embeddings (EVA-02, DINOv3), post-norm or parallel blocks, other attentions."""
        from timm.layers import Attention
        from timm.models.vision_transformer import Block

        n = self.info.n_layers
        if not 0 <= layer < n:
            raise BenchError(f"probe: attention-qk needs the block that reads hidden state {layer}; {self.info.spec} "
                             f"has blocks 0..{n - 1} (the last hidden state {n} feeds none)")
        block = self.model.blocks[layer]
        attn = getattr(block, "attn", None)
        if (getattr(self.model, "rope", None) is not None or type(block) is not Block
                or not isinstance(attn, Attention) or getattr(attn, "gate", None) is not None):
            return None
        return fused_attention_qk(block.norm1, attn.qkv.weight, attn.qkv.bias, int(attn.num_heads),
                                  attn.q_norm, attn.k_norm, float(attn.scale))


def _pil_filter(interpolation: str, name: str) -> int:
    try:
        return int(Image.Resampling[interpolation.upper()])
    except KeyError:
        raise BenchError(f"model: {name} asks for {interpolation!r} interpolation, which has no PIL filter") from None


def _timm(spec: str) -> Any:
    try:
        import timm
    except ImportError:
        raise BenchError(f"model: {spec} needs timm, an optional extra: {INSTALL}") from None
    return timm


def load_timm(spec: str, name: str, seed: int | None = None, **model_kwargs: Any) -> TimmBackbone:
    """timm model `name` (`arch` or `arch.tag`): pretrained weights (the local Hugging Face
    cache, else a download), or with `seed` a seeded random init (no weights at all).
    `model_kwargs` go to `timm.create_model` (tests shrink architectures with them)."""
    timm = _timm(spec)
    _check_arch(timm, name)
    kwargs: dict[str, Any] = {"num_classes": 0, "dynamic_img_size": True, **model_kwargs}
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _create(timm, name, pretrained=False, **kwargs)
        return TimmBackbone(spec, model, name, f"seed={seed}", model_kwargs)
    model = _create(timm, name, pretrained=True, pretrained_cfg_overlay=_weights_source(timm, spec, name), **kwargs)
    return TimmBackbone(spec, model, name, None, model_kwargs)


def load_timm_file(spec: str, name: str, path: Path, **model_kwargs: Any) -> TimmBackbone:
    """timm architecture `name` built untrained, then a state-dict file's weights loaded
    strictly (`timm:<arch>@<file>`); the file's sha256 is the revision."""
    from evaluators.backbones.state_files import load_into, read_state_dict
    from evaluators.backbones.weights import file_hash

    path = path.expanduser()
    state = read_state_dict(path)
    timm = _timm(spec)
    _check_arch(timm, name)
    model = _create(timm, name, pretrained=False, **{"num_classes": 0, "dynamic_img_size": True, **model_kwargs})
    load_into(model, {k: v for k, v in state.items() if not k.startswith("head.")}, path)
    return TimmBackbone(spec, model, name, f"sha256:{file_hash(path)[:12]}", model_kwargs)


def _check_arch(timm: Any, name: str) -> None:
    arch, _ = timm.models.split_model_name_tag(name)
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "see timm.list_models()"
        raise BenchError(f"model: timm has no model {name!r}; {hint}")


def check_timm(spec: str, name: str, path: Path | None, seeded: bool) -> Download | None:
    """What `load_timm` (`load_timm_file` with a state-dict `path`) would refuse whatever the
    network, found without building the model, and the download its weights need (None: none;
    a `seeded` one has no weights)."""
    if path is not None:
        check_state_file(path.expanduser())
    timm = _timm(spec)
    _check_arch(timm, name)
    if path is not None or seeded:
        return None
    cfg = _pretrained_cfg(timm, spec, name)
    if cfg.file:
        return None
    if cfg.hf_hub_id:
        return hub_file_download(spec, cfg.hf_hub_id, _hub_names(cfg))
    return weights_download(spec, cfg.url)


def _pretrained_cfg(timm: Any, spec: str, name: str) -> Any:
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or not (cfg.hf_hub_id or cfg.url or cfg.file):
        raise BenchError(f"model: timm has no pretrained weights for {name!r} (list them with "
                         f"timm.list_pretrained('{timm.models.split_model_name_tag(name)[0]}*')); "
                         f"random:{spec} builds it untrained")
    return cfg


def _hub_names(cfg: Any) -> list[str]:
    """The weight files a timm config may name in its hub repo, safest first."""
    from timm.models._hub import HF_WEIGHTS_NAME, _get_safe_alternatives

    return [cfg.hf_hub_filename] if cfg.hf_hub_filename else [*_get_safe_alternatives(HF_WEIGHTS_NAME), HF_WEIGHTS_NAME]


def _weights_source(timm: Any, spec: str, name: str) -> dict[str, str]:
    """Where timm should read the weights: a cached (or just downloaded) hub file, or its own URL download."""
    cfg = _pretrained_cfg(timm, spec, name)
    if cfg.file:
        return {}
    if cfg.hf_hub_id:
        return {"file": str(hub_file(spec, cfg.hf_hub_id, _hub_names(cfg)))}
    require_network(spec, cfg.url)
    return {}


def _create(timm: Any, name: str, **kwargs: Any) -> torch.nn.Module:
    not_vit = f"model: timm model {name!r} is not a Vision Transformer (no blocks of patch tokens)"
    try:
        model = timm.create_model(name, **kwargs)
    except TypeError as e:  # CNNs take no dynamic_img_size
        if "dynamic_img_size" in str(e):
            raise BenchError(not_vit) from None
        raise BenchError(f"model: timm could not build {name!r} ({str(e).strip().splitlines()[0]})") from None
    except Exception as e:  # incompatible kwargs, bad checkpoint: one line either way
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BenchError(f"model: timm could not build {name!r} ({first})") from None
    if not all(hasattr(model, a) for a in ("blocks", "patch_embed", "num_prefix_tokens", "forward_intermediates")):
        raise BenchError(not_vit)
    return model

