"""The zoo's recipes: one small ViT architecture, four objectives with known binding demands.

Architecture. A stock `ViTModel` (4 layers, width 64, 4 heads, MLP 256, 0.25 M parameters) at
64 px with 16-px patches: 16 tokens and CLS. Narrow and short because the three trained recipes
must fit, with the rest of `bench demo`, in 10 minutes of 2 CPU cores: a step of 16 scenes costs
about 7 ms of one core at 64 px against 27 ms at 128 px (64 tokens), and at width 128 a step cost
2.7 times as much again.

Scenes. The `zoo` preset of ColorShape (two objects, two colours and two shapes, so O given F is
exactly one bit: which colour goes with which shape, the smallest binding problem) drawn at 64 px
with 24-px objects (`SCENES`). A 24-px object covers 2x2 to 3x3 patches, so its outline is
inside the patch embedding and shapes are legible. Measured by the conjunction head's own
pairing accuracy on 200 val scenes (does it score the true pairing above the swapped one), 3,000
steps of 16: 0.95 at 64 px (a quarter of the compute) against 0.91 at 128 px with 32-px objects
and 0.91 at 96 px; at 128 px the 800-step recipe of before read β* = 0 under every probe. With
16-px objects at 128 px (one patch each) nothing was learned in budget.

Schedule. 3,000 steps of 16 scenes, AdamW at 1e-3 (cosine after 20 warm-up steps), for every
trained recipe alike, so that the objective is the only difference. Tried for the conjunction
head (pairing accuracy / bits on val at the end): 3e-3 at 128 px 0.79 / 0.40 against 1e-3's
0.91 / 0.69; 2e-3 at 64 px 0.95 / 0.83, no better; batches of 32 for 1,500 steps (the same
scenes) 0.93 / 0.71; 2 layers 0.91 / 0.73. 6,000 training scenes instead of 2,000 narrowed the
train-val gap (0.048 / 0.063 against 0.040 / 0.066) and lifted pairing to 0.96 / 0.87; rendering
them takes seconds.

Data. Each recipe renders its own scenes from its own seed (the recipe seed) and renders only
the train and val splits. F codes go to splits by a salted hash ranked within strata of equal
active-value counts (generators/splits.py); a code's split depends only on the salt and the
set of codes in its stratum, never on the seed or on the split sizes. The zoo keeps the default
salt and never renders a test split, so it never sees a test F code of a dataset made with the
default salt: not of `bench demo`'s nor of `bench generate colorshape --preset zoo` (any seed,
size or image size) because the codes are the same 784 and split the same way, nor of the
`small`/`balanced` presets' datasets because their codes have 6 active colours and 6 shapes,
never 2. Its validation loss is measured on val codes, which it does not train on either. Only a
dataset made with another `--set salt=` could share a test code with the zoo's training scenes.

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

from bench.core.hashing import config_hash

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
