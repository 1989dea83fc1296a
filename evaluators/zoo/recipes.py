"""The zoo's recipes: one small ViT architecture, four objectives with known binding demands.

Architecture. A stock `ViTModel` (4 layers, width 64, 4 heads, MLP 256) at 128 px with
16-px patches: 64 tokens. It is narrower than the issue's 128-192 because the three trained
recipes must fit in about 4 minutes of 2 CPU cores together with room to learn: at width 128
a step cost twice as much and a conjunction head had learned nothing measurable after 200
steps, where width 64 with batch 16 was already below the base rate after 400.

Scenes. The `zoo` preset of ColorShape: 128 px, two 32-px objects, two colours and two
shapes, so O given F is exactly one bit (which colour goes with which shape: the smallest
binding problem). A 32-px object covers 2x2 to 3x3 patches and its outline is drawn at full
resolution into the patch embedding, so shapes are legible. With 16-px objects (one patch
each) nothing was learned in budget: a conjunction head stayed at the base rate
(BCE 0.140 = H(1/32) nats per pair) after 200 steps, and an F head trained on the demo's
18-object scenes stayed at its base rate too.

Data. Each recipe renders its own scenes from its own seed (the recipe seed) and renders only
the train and val splits. F codes go to splits by a salted hash ranked within strata of equal
active-value counts (generators/splits.py); a code's split depends only on the salt and the
set of codes in its stratum, never on the seed or on the split sizes. The zoo keeps the default
salt and never renders a test split, so it never sees a test F code of a dataset made with the
default salt: of `bench generate colorshape --preset zoo` (any seed, any size) because the
codes are the same 784 and split the same way, and of the demo's and the `small`/`balanced`
presets' datasets because their codes have 6 active colours and 6 shapes, never 2. Its
validation loss is measured on val codes, which it does not train on either. Only a dataset
made with another `--set salt=` could share a test code with the zoo's training scenes.

Objectives (what binding each model *needs*):
- `conjunctions`: predict O (which of the 64 colour-shape pairs are present) from CLS: a
  linear readout of O needs colour and shape bound per object;
- `features`: predict F (which colours, which shapes) from CLS: no binding needed;
- `masked`: reconstruct the pixels of half the patches, hidden, from the other half
  (SimMIM-style, pixel masking): binding only as far as reconstruction needs it;
- `untrained`: the same architecture at its seeded initialisation (saved, never trained).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.hashing import config_hash

#: The scenes every recipe renders, and the demo scores the zoo on: the `zoo` preset of ColorShape
#: drawn at 64 px with 24-px objects (the preset's own 128 px and 32-px objects at half the cost).
SCENES: dict[str, Any] = dict(image_size=64, object_size=24)
#: The shared architecture (ViTConfig keywords). No dropout: training is deterministic
#: without an RNG stream inside the model.
ARCHITECTURE: dict[str, Any] = dict(
    image_size=SCENES["image_size"], patch_size=16, num_channels=3, hidden_size=64, num_hidden_layers=4,
    num_attention_heads=4, intermediate_size=256, hidden_act="gelu", layer_norm_eps=1e-6,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, qkv_bias=True,
)
#: The ColorShape preset the recipes render (generators/colorshape.py).
DATA_PRESET = "zoo"
OBJECTIVES = ("conjunctions", "features", "masked", "untrained")


@dataclass(frozen=True)
class Recipe:
    """Everything that determines a zoo model's weights, together with the seed."""

    name: str
    objective: str
    steps: int
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 20
    mask_ratio: float = 0.5
    seed: int = 0
    architecture: dict[str, Any] = field(default_factory=lambda: dict(ARCHITECTURE))
    data_preset: str = DATA_PRESET
    #: overrides of the data preset's parameters (tests render a few scenes only)
    data: dict[str, Any] = field(default_factory=lambda: dict(SCENES, n_train=6_000))

    def with_(self, **changes: Any) -> "Recipe":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def folder(self) -> str:
        """`NAME-<hash of everything above>`: a changed recipe (or seed, or steps) trains into a
        folder of its own, so nothing trained earlier is overwritten or mistaken for it."""
        return f"{self.name}-{config_hash(self.to_dict())[:12]}"


RECIPES: dict[str, Recipe] = {
    "conjunctions": Recipe("conjunctions", "conjunctions", steps=3000),
    "features": Recipe("features", "features", steps=3000),
    "masked": Recipe("masked", "masked", steps=3000),
    "untrained": Recipe("untrained", "untrained", steps=0),
}
