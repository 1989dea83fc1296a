"""The paper's backbones: Hugging Face ids, native resolutions and architectures.

The architecture configs ship here (copied from the checkpoints' config.json) so
that `random:<preset>` builds the exact network with no download, and `bench
models` can count parameters offline. `LIBRARY_PRESETS` name timm and OpenCLIP
models the same way (their metadata written down, weights fetched on first use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Callable, Sequence

from bench.core.errors import BenchError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
BICUBIC, BILINEAR = 3, 2  # PIL resample codes, as processor configs store them


@dataclass(frozen=True)
class Family:
    """How one transformers architecture exposes its tokens."""

    name: str
    model_class: str
    #: needs `interpolate_pos_encoding=True` off its native size (DINOv2 always interpolates).
    interpolate_flag: bool
    registers: Callable[[Any], int] = lambda config: 0


FAMILIES: dict[str, Family] = {
    "dinov2": Family("dinov2", "Dinov2Model", False),
    "dinov2_with_registers": Family("dinov2", "Dinov2WithRegistersModel", False,
                                    lambda c: int(c.num_register_tokens)),
    "clip": Family("clip", "CLIPVisionModel", True),
    "clip_vision_model": Family("clip", "CLIPVisionModel", True),
    "vit_mae": Family("mae", "ViTMAEModel", True),
    "vit": Family("vit", "ViTModel", True),
}


@dataclass(frozen=True)
class Preprocess:
    """What an image processor does that we keep: resample filter, rescale, mean/std."""

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    resample: int = BICUBIC
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    do_rescale: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "resample": self.resample,
                "rescale_factor": self.rescale_factor, "do_normalize": self.do_normalize,
                "do_rescale": self.do_rescale}


#: The options that put a user's input side and normalisation in place of a model's own
#: (`bench models` / `bench evaluate` `--image-size`, `--mean`, `--std`).
PREPROCESSING = ("image_size", "mean", "std")


def checked_preprocessing(image_size: int | None = None, mean: Sequence[float] | None = None,
                          std: Sequence[float] | None = None) -> dict[str, Any]:
    """The preprocessing overrides that were given (None means "the model's own"), checked and
    normalised (an int side, tuples of three floats), so a bad value fails in one line before
    any model loads, whichever caller (plan, `resolve_backbone`, a backbone) sees it first."""
    out: dict[str, Any] = {}
    if image_size is not None:
        if isinstance(image_size, bool) or not isinstance(image_size, Integral) or image_size < 1:
            raise BenchError(f"image_size: a positive number of pixels, got {image_size!r}")
        out["image_size"] = int(image_size)
    for name, values in (("mean", mean), ("std", std)):
        if values is None:
            continue
        try:
            floats = tuple(float(v) for v in values)
        except (TypeError, ValueError):
            floats = ()
        if len(floats) != 3 or not all(math.isfinite(v) for v in floats) or (name == "std" and min(floats) <= 0):
            shown = list(values) if isinstance(values, (list, tuple)) else values
            raise BenchError(f"{name}: three values (R, G, B){', all > 0' if name == 'std' else ''}; got {shown!r}")
        out[name] = floats
    return out


@dataclass(frozen=True)
class Preset:
    hub_id: str
    model_type: str  # transformers config model_type
    input_size: int
    config: dict[str, Any] = field(default_factory=dict)
    preprocess: Preprocess = Preprocess()
    description: str = ""
    #: parameter count of the architecture (checked against a meta-device build in the tests),
    #: so listing backbones does not have to import transformers.
    n_params: int = 0

    @property
    def family(self) -> str:
        return FAMILIES[self.model_type].name


def _dinov2(hidden: int, heads: int, layers: int, registers: int = 0, swiglu: bool = False) -> dict[str, Any]:
    cfg = dict(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers, patch_size=14,
               image_size=518, mlp_ratio=4, layer_norm_eps=1e-6, layerscale_value=1.0, qkv_bias=True,
               hidden_act="gelu", use_swiglu_ffn=swiglu)
    if registers:
        cfg["num_register_tokens"] = registers
    return cfg


def _vit_large(patch: int, image: int, eps: float) -> dict[str, Any]:
    return dict(hidden_size=1024, num_attention_heads=16, num_hidden_layers=24, intermediate_size=4096,
                patch_size=patch, image_size=image, layer_norm_eps=eps, qkv_bias=True, hidden_act="gelu")


def _clip_large(image: int) -> dict[str, Any]:
    return dict(hidden_size=1024, num_attention_heads=16, num_hidden_layers=24, intermediate_size=4096,
                patch_size=14, image_size=image, projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5)


_DINO_SIZES = {"small": (384, 6, 12, False), "base": (768, 12, 12, False),
               "large": (1024, 16, 24, False), "giant": (1536, 24, 40, True)}
_DINO_PARAMS = {"small": 22_056_576, "base": 86_580_480, "large": 304_368_640, "giant": 1_136_480_768}

PRESETS: dict[str, Preset] = {}
for _size, (_h, _n, _l, _swiglu) in _DINO_SIZES.items():
    PRESETS[f"dinov2-{_size}"] = Preset(
        f"facebook/dinov2-{_size}", "dinov2", 224, _dinov2(_h, _n, _l, swiglu=_swiglu),
        description=f"DINOv2 ViT-{_size[0].upper()}/14 (self-supervised)", n_params=_DINO_PARAMS[_size])
    PRESETS[f"dinov2-{_size}-reg"] = Preset(
        f"facebook/dinov2-with-registers-{_size}", "dinov2_with_registers", 224,
        _dinov2(_h, _n, _l, registers=4, swiglu=_swiglu),
        description=f"DINOv2 ViT-{_size[0].upper()}/14 with 4 register tokens",
        n_params=_DINO_PARAMS[_size] + 4 * _h)
PRESETS.update({
    "clip-vit-large-14": Preset("openai/clip-vit-large-patch14", "clip_vision_model", 224, _clip_large(224),
                                Preprocess(CLIP_MEAN, CLIP_STD), "CLIP ViT-L/14 vision tower, 224 px", 303_179_776),
    "clip-vit-large-14-336": Preset("openai/clip-vit-large-patch14-336", "clip_vision_model", 336, _clip_large(336),
                                    Preprocess(CLIP_MEAN, CLIP_STD), "CLIP ViT-L/14 vision tower, 336 px",
                                    303_507_456),
    "mae-vit-large": Preset("facebook/vit-mae-large", "vit_mae", 224,
                            {**_vit_large(16, 224, 1e-12), "mask_ratio": 0.0},
                            Preprocess(resample=BICUBIC), "MAE ViT-L/16 (masking off, patch order kept)", 303_301_632),
    "vit-large-16": Preset("google/vit-large-patch16-224", "vit", 224, _vit_large(16, 224, 1e-12),
                           Preprocess((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), BILINEAR),
                           "ViT-L/16 supervised (ImageNet-21k pretrain, 1k fine-tune)", 303_301_632),
})


@dataclass(frozen=True)
class LibraryPreset:
    """A timm or OpenCLIP backbone with pretrained weights. Its metadata is written down here
    (checked against meta-device builds and the libraries' pretrained configs in the tests),
    so `bench models` lists it without importing the library or downloading anything."""

    library: str  # "timm" or "open_clip"
    name: str  # timm model name with its pretrained tag; OpenCLIP architecture
    description: str
    n_params: int  # the image tower's parameters (timm: no classifier head)
    patch_size: int
    input_size: int
    n_layers: int
    width: int
    n_prefix: int
    has_cls: bool = True
    tag: str = ""  # OpenCLIP pretrained tag
    weights_repo: str = ""  # Hugging Face repo the weights come from
    weights_files: tuple[str, ...] = ()  # file names the library tries there, in order

    @property
    def spec(self) -> str:
        return f"timm:{self.name}" if self.library == "timm" else f"open_clip:{self.name}@{self.tag}"

    @property
    def family(self) -> str:
        return self.library


def _timm(name: str, description: str, *shape: int, has_cls: bool = True) -> LibraryPreset:
    """A timm preset; timm hosts its weights under timm/<name> (safetensors first)."""
    return LibraryPreset("timm", name, description, *shape, has_cls=has_cls, weights_repo=f"timm/{name}",
                         weights_files=("model.safetensors", "pytorch_model.bin"))


def _open_clip(arch: str, tag: str, repo: str, description: str, *shape: int) -> LibraryPreset:
    return LibraryPreset("open_clip", arch, description, *shape, tag=tag, weights_repo=repo,
                         weights_files=("open_clip_model.safetensors", "open_clip_pytorch_model.bin"))


#: shape: parameters, patch size, input size, blocks, width, prefix tokens
LIBRARY_PRESETS: dict[str, LibraryPreset] = {
    "dinov2-base-reg-timm": _timm("vit_base_patch14_reg4_dinov2.lvd142m",
                                  "DINOv2 ViT-B/14 with 4 registers (timm, 518 px)", 86_582_016, 14, 518, 12, 768, 5),
    "dinov2-large-reg-timm": _timm("vit_large_patch14_reg4_dinov2.lvd142m",
                                   "DINOv2 ViT-L/14 with 4 registers (timm, 518 px)", 304_370_688, 14, 518, 24, 1024, 5),
    "siglip-base-16-timm": _timm("vit_base_patch16_siglip_224.webli",
                                 "SigLIP ViT-B/16 image tower, WebLI (timm; no class token)",
                                 92_884_224, 16, 224, 12, 768, 0, has_cls=False),
    "eva02-base-14-timm": _timm("eva02_base_patch14_224.mim_in22k",
                                "EVA-02 ViT-B/14, MIM on ImageNet-22k (timm; rotary positions)",
                                85_758_720, 14, 224, 12, 768, 1),
    "openclip-vit-b-32-laion2b": _open_clip("ViT-B-32", "laion2b_s34b_b79k", "laion/CLIP-ViT-B-32-laion2B-s34B-b79K",
                                            "OpenCLIP ViT-B/32 image tower, LAION-2B", 87_849_216, 32, 224, 12, 768, 1),
    "openclip-vit-l-14-laion2b": _open_clip("ViT-L-14", "laion2b_s32b_b82k", "laion/CLIP-ViT-L-14-laion2B-s32B-b82K",
                                            "OpenCLIP ViT-L/14 image tower, LAION-2B", 303_966_208, 14, 224, 24, 1024, 1),
}
