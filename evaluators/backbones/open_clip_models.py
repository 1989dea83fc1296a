"""`open_clip:<arch>[@<pretrained-tag or checkpoint file>]`: OpenCLIP image towers
(optional extra: `pip install 'bindingbench[open_clip]'`).

OpenCLIP's `create_model` builds the model and loads the weights (tag downloads come
from the local Hugging Face cache first), then only `model.visual` is kept and run.
Hidden state 0 is the input of the first residual block (patch + class embeddings,
position embeddings, `ln_pre`), hidden state k the output of block k, as in
transformers' CLIP. The one prefix token is the class embedding. Off the native size,
the position embeddings are resampled with OpenCLIP's own `resize_pos_embed` (what it
does when loading a checkpoint at another size). Mean, std, interpolation and input
size are `model.visual.preprocess_cfg` (the tag's, else OpenCLIP's defaults).
Towers OpenCLIP borrows from timm or its ResNets are not Vision Transformers it
exposes block by block; use `timm:<name>` for those.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

import torch
from PIL import Image

from bench.core.errors import BenchError
from evaluators.backbones.base import AttentionQK, BackboneInfo
from evaluators.backbones.fused_qk import fused_attention_qk
from evaluators.backbones.hf import HFBackbone, autocast
from evaluators.backbones.hub import Download
from evaluators.backbones.hub_weights import hub_file, hub_file_download, require_network, weights_download
from evaluators.backbones.presets import Family, Preprocess
from evaluators.backbones.weights import state_dict_hash

FAMILY = Family("open_clip", "open_clip.VisionTransformer", False)
INSTALL = "pip install 'bindingbench[open_clip]'"


class OpenClipBackbone(HFBackbone):
    """HF-style preprocessing (whole image resized, never cropped); OpenCLIP's vision tower."""

    def __init__(self, spec: str, visual: torch.nn.Module, arch: str, model_cfg: dict[str, Any],
                 revision: str | None) -> None:
        self.model, self.family, self.config, self.arch = visual.eval(), FAMILY, None, arch
        self.model_cfg = model_cfg
        self.weights = state_dict_hash(visual)
        pp = visual.preprocess_cfg
        size = pp["size"] if isinstance(pp["size"], int) else tuple(pp["size"])
        if isinstance(size, tuple) and size[0] != size[1]:
            raise BenchError(f"model: {arch} takes {size[0]}x{size[1]} px images; only square inputs are supported")
        try:
            resample = int(Image.Resampling[str(pp["interpolation"]).upper()])
        except KeyError:
            raise BenchError(f"model: {arch} asks for {pp['interpolation']!r} interpolation, "
                             f"which has no PIL filter") from None
        self.preprocess = Preprocess(mean=tuple(float(v) for v in pp["mean"]), std=tuple(float(v) for v in pp["std"]),
                                     resample=resample)
        self._positions: dict[tuple[int, int, str], torch.Tensor] = {}
        self.info = BackboneInfo(
            spec=spec, family="open_clip", revision=revision or f"sha256:{self.weights[:12]}",
            n_params=sum(p.numel() for p in visual.parameters()), patch_size=int(visual.patch_size[0]),
            input_size=int(size if isinstance(size, int) else size[0]), n_layers=len(visual.transformer.resblocks),
            width=int(visual.transformer.width), n_prefix=1, cls_index=0, register_indices=(),
        )
        self._set_normalisation(self.preprocess)

    def identity(self) -> dict[str, Any]:
        return {"family": "open_clip", "arch": self.arch, "model_cfg": self.model_cfg, "weights": self.weights,
                "preprocess": self.preprocess.to_dict()}

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden state 0: `visual._embeds`, with the position embeddings of this input's grid."""
        v = self.model
        grid = (x.shape[-2] // self.info.patch_size, x.shape[-1] // self.info.patch_size)
        x = v.conv1(x).flatten(2).transpose(1, 2)
        cls = v.class_embedding.to(x.dtype).view(1, 1, -1).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self._position_embedding(grid).to(x.dtype)
        return v.ln_pre(v.patch_dropout(x))

    def _position_embedding(self, grid: tuple[int, int]) -> torch.Tensor:
        pos = self.model.positional_embedding
        if grid == tuple(self.model.grid_size):
            return pos
        key = (*grid, str(pos.device))
        if key not in self._positions:
            from open_clip.model import resize_pos_embed

            state = {"visual.positional_embedding": pos.detach().clone()}
            with torch.inference_mode(False), torch.no_grad():
                resize_pos_embed(state, SimpleNamespace(visual=SimpleNamespace(grid_size=grid)))
            self._positions[key] = state["visual.positional_embedding"]
        return self._positions[key]

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        """One pass: the embeddings, then OpenCLIP's `forward_intermediates`, stopped after the last block needed."""
        blocks = sorted({i - 1 for i in layers if i > 0})
        with torch.inference_mode(), autocast(self.device, self.dtype):
            x = self.embed(inputs.to(self.device, non_blocking=True))
            out = {0: x}
            if blocks:
                _, inter = self.model.transformer.forward_intermediates(x, indices=blocks, stop_early=True)
                out.update({i + 1: h for i, h in zip(blocks, inter)})
        return [out[i] for i in layers]

    def blocks(self) -> torch.nn.ModuleList:
        return self.model.transformer.resblocks

    def attention_qk(self, layer: int) -> AttentionQK | None:
        """Block `layer`'s `ln_1` and the q/k thirds of its attention's `in_proj` (nn.MultiheadAttention,
        or OpenCLIP's Attention with its q/k norms). None for scaled-cosine attention."""
        from open_clip.transformer import Attention

        n = self.info.n_layers
        if not 0 <= layer < n:
            raise BenchError(f"probe: attention-qk needs the block that reads hidden state {layer}; {self.info.spec} "
                             f"has blocks 0..{n - 1} (the last hidden state {n} feeds none)")
        block = self.blocks()[layer]
        attn = block.attn
        if isinstance(attn, torch.nn.MultiheadAttention) and attn._qkv_same_embed_dim:
            ident = torch.nn.Identity()
            return fused_attention_qk(block.ln_1, attn.in_proj_weight, attn.in_proj_bias, attn.num_heads,
                                      ident, ident, attn.head_dim ** -0.5)
        if isinstance(attn, Attention) and attn.logit_scale is None:
            return fused_attention_qk(block.ln_1, attn.in_proj_weight, attn.in_proj_bias, attn.num_heads,
                                      attn.ln_q, attn.ln_k, attn.scale)
        return None


def _open_clip(spec: str) -> Any:
    try:
        import open_clip
    except ImportError:
        raise BenchError(f"model: {spec} needs open_clip_torch, an optional extra: {INSTALL}") from None
    return open_clip


def load_open_clip(spec: str, arch: str, pretrained: str | None = None, seed: int | None = None) -> OpenClipBackbone:
    """OpenCLIP `arch`'s vision tower: weights of a pretrained tag or a checkpoint file, or with
    `seed` a seeded random init."""
    open_clip = _open_clip(spec)
    model_cfg = _model_config(open_clip, arch)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            visual = _create(open_clip, arch, pretrained=None)
        return OpenClipBackbone(spec, visual, arch, model_cfg, f"seed={seed}")
    kwargs = _weights(open_clip, spec, arch, _named(open_clip, spec, arch, pretrained))
    return OpenClipBackbone(spec, _create(open_clip, arch, **kwargs), arch,
                            {**model_cfg, "quick_gelu": bool(model_cfg.get("quick_gelu") or kwargs.get("force_quick_gelu"))},
                            None)


def check_open_clip(spec: str, arch: str, pretrained: str | None, seeded: bool) -> Download | None:
    """What `load_open_clip` would refuse whatever the network, found without building the
    model, and the download its weights need (None: none; a `seeded` one has no weights)."""
    open_clip = _open_clip(spec)
    _model_config(open_clip, arch)
    if seeded:
        return None
    pretrained = _named(open_clip, spec, arch, pretrained)
    if os.path.isfile(pretrained):
        return None
    tag = _tag(open_clip, arch, pretrained)
    if tag.get("hf_hub"):
        return hub_file_download(spec, *_hub_file(tag))
    return weights_download(spec, tag.get("url"))


def _model_config(open_clip: Any, arch: str) -> dict[str, Any]:
    """`arch`'s config, refused in one line unless its image tower is an OpenCLIP ViT."""
    model_cfg = open_clip.get_model_config(arch)
    if model_cfg is None:
        close = difflib.get_close_matches(arch, open_clip.list_models(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see open_clip.list_models()"
        raise BenchError(f"model: OpenCLIP has no architecture {arch!r}; {hint}")
    vision = model_cfg.get("vision_cfg", {})
    if vision.get("timm_model_name") or isinstance(vision.get("layers"), (list, tuple)):
        raise BenchError(f"model: OpenCLIP's {arch} image tower is a timm model or a ResNet, not an OpenCLIP "
                         f"Vision Transformer; use timm:<name> for it")
    return model_cfg


def _named(open_clip: Any, spec: str, arch: str, pretrained: str | None) -> str:
    """The weights a pretrained model names (a tag or a file), refused in one line when none."""
    if not pretrained:
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(arch)) or "none"
        raise BenchError(f"model: {spec} names no weights; use open_clip:{arch}@<tag> (tags: {tags}) "
                         f"or random:open_clip:{arch}")
    return pretrained


def _tag(open_clip: Any, arch: str, pretrained: str) -> dict[str, Any]:
    tag = open_clip.get_pretrained_cfg(arch, pretrained)
    if not tag:
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(arch)) or "none"
        raise BenchError(f"model: OpenCLIP has no pretrained tag {pretrained!r} for {arch} and no such file; "
                         f"tags: {tags}")
    return tag


def _hub_file(tag: dict[str, Any]) -> tuple[str, list[str]]:
    """A hub tag's repo and the weight files it may hold, safest first."""
    from open_clip.constants import HF_WEIGHTS_NAME
    from open_clip.pretrained import _get_safe_alternatives

    repo, filename = os.path.split(tag["hf_hub"])  # 'org/repo/' names the default file
    filename = filename or HF_WEIGHTS_NAME
    return repo, [*_get_safe_alternatives(filename), filename]


def _weights(open_clip: Any, spec: str, arch: str, pretrained: str) -> dict[str, Any]:
    """`create_model` arguments that load a tag's weights from a local file (cached or downloaded
    now) with the tag's preprocessing and activation, or those of a checkpoint file as is."""
    if os.path.isfile(pretrained):
        return {"pretrained": pretrained}
    tag = _tag(open_clip, arch, pretrained)
    if tag.get("hf_hub"):
        path: Path | str = hub_file(spec, *_hub_file(tag))
    else:
        require_network(spec, tag.get("url"))
        try:
            path = open_clip.download_pretrained(tag)
        except Exception as e:
            raise BenchError(f"model: could not download the weights of {spec} ({str(e).strip().splitlines()[0]})") from None
    preprocess = {k: tag[k] for k in ("mean", "std", "interpolation", "resize_mode") if tag.get(k)}
    return {"pretrained": str(path), "force_quick_gelu": bool(tag.get("quick_gelu", False)),
            "force_preprocess_cfg": preprocess}


def _create(open_clip: Any, arch: str, **kwargs: Any) -> torch.nn.Module:
    """The image tower of `open_clip.create_model` (the rest of the model is dropped)."""
    try:
        with _quiet():  # a random init logs "No pretrained weights loaded" as a warning
            model = open_clip.create_model(arch, device="cpu", **kwargs)
    except Exception as e:  # bad checkpoint, incompatible config: one line either way
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BenchError(f"model: OpenCLIP could not build {arch!r} ({first})") from None
    visual = model.visual
    if not all(hasattr(visual, a) for a in ("conv1", "class_embedding", "positional_embedding", "transformer")):
        raise BenchError(f"model: OpenCLIP's {arch} image tower is not a Vision Transformer")
    return visual


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)
