"""The source of a tiny `py:` backbone (a ViT-shaped toy: 8-px patches of a 32-px image, one class
token, width 24) that tests write to a file and load as `py:<file>:make`, each with its own blocks
and forward."""

from __future__ import annotations

#: What the toy's forward does after its patch and class tokens: run every block in turn.
EVERY_BLOCK = """for b in self.blocks:
            t = b(t)
        return t"""


def toy_module(blocks: str, forward: str = EVERY_BLOCK, preamble: str = "") -> str:
    """A module defining `make()`, which wraps the toy in a `ModuleAdapter`: `blocks` is the
    argument of its `torch.nn.ModuleList`, `forward` the end of its forward pass (from the tokens
    `t`), `preamble` code defined before it (a block class)."""
    return f'''
import torch
from evaluators.backbones.module_adapter import ModuleAdapter
{preamble}

class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 24, 8, stride=8)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 24))
        self.blocks = torch.nn.ModuleList({blocks})

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], 1)
        {forward}


def make():
    return ModuleAdapter(Toy(), blocks="blocks", patch_size=8, image_size=32, prefix_tokens=1)
'''
