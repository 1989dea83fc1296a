"""Your own backbone: a plain `torch.nn.Module` plus a note of where its blocks and tokens are.

`ModuleAdapter` names the module's list of transformer blocks, its patch size, native
input side, normalisation and how many prefix (class/register) tokens lead each
sequence. Hidden states are collected with hooks on the blocks while the module's
own forward runs: hidden state 0 is the input of block 0, hidden state k the output of
block k, as in transformers' `hidden_states`. `py:<file>:<function>` loads a Python
file whose function returns such an adapter (or any Backbone object); its code is part of
its fingerprint (`source_hash`), so an edited forward is measured again.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from bench.core.errors import BenchError
from evaluators.backbones.base import Backbone, BackboneInfo
from evaluators.backbones.hf import HFBackbone, autocast
from evaluators.backbones.presets import IMAGENET_MEAN, IMAGENET_STD, Family, Preprocess
from evaluators.backbones.weights import files_hash, state_dict_hash

FAMILY = Family("module", "module", False)


@dataclass(frozen=True)
class ModuleAdapter:
    """Where a module's blocks and tokens are. The module's forward takes a batch of
    normalised images (B x 3 x S x S) and each block returns tokens B x T x D
    (or a tuple whose first item they are), `prefix_tokens` of them before the patches."""

    module: torch.nn.Module
    blocks: str = "blocks"
    patch_size: int = 16
    image_size: int = 224
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    prefix_tokens: int = 1
    cls_index: int | None = 0

    def backbone(self, spec: str = "module") -> "ModuleBackbone":
        """The Backbone that evaluation runs (checks the adapter against one forward pass)."""
        return ModuleBackbone(spec, self)


class ModuleBackbone(HFBackbone):
    """A module run through its adapter: whole image resized, normalised, hooks on the blocks."""

    def __init__(self, spec: str, adapter: ModuleAdapter) -> None:
        if not isinstance(adapter.module, torch.nn.Module):
            raise BenchError(f"model: {spec}: ModuleAdapter.module must be a torch.nn.Module, "
                             f"got {type(adapter.module).__name__}")
        try:
            self._blocks = adapter.module.get_submodule(adapter.blocks)
        except AttributeError:
            raise BenchError(f"model: {spec}: the module has no submodule {adapter.blocks!r} "
                             f"(ModuleAdapter.blocks names its list of transformer blocks)") from None
        if not isinstance(self._blocks, (torch.nn.ModuleList, torch.nn.Sequential)) or not len(self._blocks):
            raise BenchError(f"model: {spec}: {adapter.blocks!r} is not a non-empty ModuleList of blocks")
        if adapter.image_size % adapter.patch_size:
            raise BenchError(f"model: {spec}: image_size {adapter.image_size} is not a multiple of "
                             f"patch_size {adapter.patch_size}")
        self.model, self.family, self.config, self.adapter = adapter.module.eval(), FAMILY, None, adapter
        self.preprocess = Preprocess(mean=tuple(adapter.mean), std=tuple(adapter.std))
        self._set_normalisation(self.preprocess)
        self.weights = state_dict_hash(adapter.module)
        width = self._probe_width(spec)
        self.info = BackboneInfo(
            spec=spec, family="module", revision=f"sha256:{self.weights[:12]}",
            n_params=sum(p.numel() for p in adapter.module.parameters()), patch_size=adapter.patch_size,
            input_size=adapter.image_size, n_layers=len(self._blocks), width=width, n_prefix=adapter.prefix_tokens,
            cls_index=adapter.cls_index,
            register_indices=tuple(i for i in range(adapter.prefix_tokens) if i != adapter.cls_index),
        )

    def _probe_width(self, spec: str) -> int:
        """Token width from one forward pass at the native side; the token count must match the grid."""
        a = self.adapter
        x = torch.zeros(1, 3, a.image_size, a.image_size)
        (tokens,) = self._collect(x, [len(self._blocks)], spec)
        expected = a.prefix_tokens + (a.image_size // a.patch_size) ** 2
        if tokens.ndim != 3 or tokens.shape[1] != expected:
            raise BenchError(f"model: {spec}: the last block returns tokens of shape {tuple(tokens.shape)}; expected "
                             f"1 x {expected} x D ({a.prefix_tokens} prefix + {a.image_size // a.patch_size}² patches)")
        return int(tokens.shape[-1])

    def identity(self) -> dict[str, Any]:
        a = self.adapter
        return {"family": "module", "class": type(a.module).__qualname__, "weights": self.weights,
                "blocks": a.blocks, "patch_size": a.patch_size, "prefix_tokens": a.prefix_tokens,
                "preprocess": self.preprocess.to_dict()}

    def hidden_states(self, inputs: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        return self._collect(inputs.to(self.device, non_blocking=True), layers, self.info.spec)

    def _collect(self, x: torch.Tensor, layers: Sequence[int], spec: str) -> list[torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        first = lambda y: y[0] if isinstance(y, (tuple, list)) else y  # noqa: E731
        hooks = [self._blocks[0].register_forward_pre_hook(lambda m, args: out.__setitem__(0, first(args)))]
        hooks += [self._blocks[i - 1].register_forward_hook(lambda m, args, y, i=i: out.__setitem__(i, first(y)))
                  for i in set(layers) if i > 0]
        try:
            with torch.inference_mode(), autocast(self.device, self.dtype):
                self.model(x)
        finally:
            for h in hooks:
                h.remove()
        missing = sorted(set(layers) - set(out))
        if missing:
            raise BenchError(f"model: {spec}: the forward pass never ran blocks for hidden states {missing}")
        return [out[i] for i in layers]

    def blocks(self) -> torch.nn.ModuleList:
        return self._blocks  # type: ignore[return-value]

    def attention_qk(self, layer: int) -> None:
        return None


def load_py(spec: str, target: str) -> Backbone:
    """`py:<file>:<function>`: call the function (torch seeded with 0, so random init is
    reproducible); it returns a ModuleAdapter or a Backbone. The backbone's revision (its rows'
    weights fingerprint and part of its activation cache key) is `with_source` of the one it
    states and the file's `source_hash`."""
    fn, path = py_function(spec, target)
    source = source_hash(spec, path)
    with torch.random.fork_rng(devices=[]):  # an untrained module inits the same each time: same fingerprint
        torch.manual_seed(0)
        result = fn()
    if isinstance(result, ModuleAdapter):
        result = result.backbone(spec)
    if isinstance(result, Backbone):
        return with_source(result, source)
    hint = " (wrap it: ModuleAdapter(module, blocks=..., patch_size=...))" if isinstance(result, torch.nn.Module) else ""
    raise BenchError(f"model: {spec}: {target.rpartition(':')[2]}() returned {type(result).__name__}; expected a "
                     f"ModuleAdapter or a Backbone{hint}")


def py_function(spec: str, target: str) -> tuple[Callable[[], Any], Path]:
    """The function `py:<file>:<function>` names and its file: the file imported (its top level
    runs), the function not called. A study checks its `py:` backbones with it before any work."""
    file, sep, func = target.rpartition(":")
    if not sep or not file or not func:
        raise BenchError(f"model: {spec}: expected py:<file.py>:<function>")
    path = Path(file).expanduser()
    if not path.is_file():
        raise BenchError(f"model: {spec}: no such Python file {path}")
    fn = getattr(_import(spec, path), func, None)
    if not callable(fn):
        raise BenchError(f"model: {spec}: {path.name} defines no function {func!r}")
    return fn, path


def source_hash(spec: str, path: Path) -> str:
    """sha256 over the names and bytes of every `*.py` file in `path`'s folder (itself included),
    by name: the rule for which code is part of a `py:` backbone's identity. The folder's files
    rather than the modules its imports reached, because those depend on what the process had
    imported before and on `sys.path` (a Ray worker would see others than the driver), while the
    folder is the same in every process and no helper beside the module can be missed. Code in a
    subfolder or an installed package is not covered (docs/how-to/own-backbone.md says so)."""
    files = sorted(p for p in path.resolve().parent.glob("*.py") if p.is_file())
    try:
        return files_hash(files)
    except OSError as e:
        raise BenchError(f"model: {spec}: cannot read {e.filename} (the .py files beside {path.name} are part "
                         f"of its fingerprint): {e.strerror}") from None


def with_source(backbone: Backbone, source: str) -> Backbone:
    """A shallow copy of `backbone` whose `info.revision` is `sha256:` of the revision it states and
    `source` (`source_hash`): edited code is a new fingerprint, as edited weights are, and the
    activation cache (keyed by the revision) never serves the old code's activations."""
    out = copy.copy(backbone)  # an object the function kept elsewhere keeps its own info
    both = hashlib.sha256(f"{backbone.info.revision}\0{source}".encode()).hexdigest()
    out.info = replace(backbone.info, revision=f"sha256:{both[:12]}")
    return out


def _import(spec: str, path: Path) -> Any:
    name = f"bindingbench_py_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise BenchError(f"model: {spec}: cannot import {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: its error, in one line
        sys.modules.pop(name, None)
        raise BenchError(f"model: {spec}: importing {path.name} failed ({type(e).__name__}: {e})") from None
    return module
