"""`timm:<name>`: timm Vision Transformers (optional extra: `pip install 'bindingbench[timm]'`).

Hidden state 0 is the embedding output (after position embeddings, prefix tokens
and the pre-norm); hidden state k is the output of block k, like transformers'
`hidden_states`. Prefix tokens are timm's `num_prefix_tokens` (class token first,
then registers).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from bench.errors import BenchError
from evaluators.backbones.base import AttentionQK, BackboneInfo
from evaluators.backbones.hf import HFBackbone, autocast
from evaluators.backbones.presets import BICUBIC, BILINEAR, Family, Preprocess
from evaluators.backbones.weights import state_dict_hash

FAMILY = Family("timm", "timm.VisionTransformer", False)


class TimmBackbone(HFBackbone):
    """Same preprocessing path as Hugging Face models; the forward walks timm's blocks."""

    def __init__(self, spec: str, model: torch.nn.Module, preprocess: Preprocess, input_size: int) -> None:
        self.model, self.family, self.preprocess = model.eval(), FAMILY, preprocess
        self.weights = state_dict_hash(model)
        self.config = None
        has_cls = getattr(model, "cls_token", None) is not None
        n_prefix = int(model.num_prefix_tokens)
        patch = model.patch_embed.patch_size
        self.info = BackboneInfo(
            spec=spec, family="timm", revision=f"sha256:{self.weights[:12]}",
            n_params=sum(p.numel() for p in model.parameters()), patch_size=int(patch[0]), input_size=input_size,
            n_layers=len(model.blocks), width=int(model.embed_dim), n_prefix=n_prefix,
            cls_index=0 if has_cls else None, register_indices=tuple(range(int(has_cls), n_prefix)),
        )
        self._set_normalisation(preprocess)

    def identity(self) -> dict[str, Any]:
        return {"family": "timm", "name": self.info.spec, "weights": self.weights,
                "preprocess": self.preprocess.to_dict()}

    def attention_qk(self, layer: int) -> AttentionQK | None:
        """Not offered: timm fuses the projections into one `qkv` layer (and may norm q and k)."""
        return None

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        m = self.model
        with torch.inference_mode(), autocast(self.device, self.dtype):
            x = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(inputs.to(self.device)))))
            out = [x]
            for block in m.blocks[: max(layers)]:
                x = block(x)
                out.append(x)
        return [out[i] for i in layers]


def load_timm(spec: str) -> TimmBackbone:
    try:
        import timm
    except ImportError:
        raise BenchError(f"model: {spec} needs timm, an optional extra: pip install 'bindingbench[timm]'") from None
    name = spec.split(":", 1)[1]
    try:
        model = timm.create_model(name, pretrained=True, num_classes=0, dynamic_img_size=True)
    except Exception as e:  # unknown name, no network, incompatible kwargs: one line either way
        raise BenchError(f"model: timm could not build {name!r} ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})") from None
    if not all(hasattr(model, a) for a in ("blocks", "patch_embed", "_pos_embed", "num_prefix_tokens")):
        raise BenchError(f"model: timm model {name!r} is not a plain Vision Transformer")
    cfg = timm.data.resolve_model_data_config(model)
    preprocess = Preprocess(mean=tuple(cfg["mean"]), std=tuple(cfg["std"]),
                            resample=BILINEAR if cfg.get("interpolation") == "bilinear" else BICUBIC)
    return TimmBackbone(spec, model, preprocess, int(cfg["input_size"][-1]))
