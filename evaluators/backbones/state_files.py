"""Weight files users have: a state dict in .pth/.pt/.bin or .safetensors.

Training scripts save state dicts bare, under a `state_dict` or `model` key, and (from
DataParallel/DDP) with every key prefixed `module.`; all of these load the same way.
Pickled files are read with `torch.load(weights_only=True)`, so a file cannot run code.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.core.errors import BenchError

SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
NESTED_KEYS = ("state_dict", "model")
DDP_PREFIX = "module."


def check_state_file(path: Path) -> None:
    """Refuse, without reading it, a weight file that is not there or not of a known kind."""
    if not path.is_file():
        raise BenchError(f"model: weight file {path} does not exist")
    if path.suffix not in SUFFIXES:
        raise BenchError(f"model: {path} is not a weight file (expected {', '.join(SUFFIXES)})")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weight file, unwrapped from `state_dict`/`model` and `module.`."""
    check_state_file(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path))
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # cut short, not a checkpoint, or pickled objects weights_only refuses
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BenchError(f"model: cannot read {path} as a state dict ({first[:200]})") from None
    for key in NESTED_KEYS:
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
            break
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise BenchError(f"model: {path} holds no state dict (a dict of tensors, bare or under "
                         f"{' / '.join(NESTED_KEYS)})")
    if data and all(k.startswith(DDP_PREFIX) for k in data):
        data = {k[len(DDP_PREFIX):]: v for k, v in data.items()}
    return data


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load `state` strictly; a mismatch is one line counting missing and unexpected keys."""
    own = set(model.state_dict())
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        examples = ", ".join((missing + unexpected)[:3])
        raise BenchError(f"model: {path} does not fit the architecture: {len(missing)} missing and "
                         f"{len(unexpected)} unexpected keys (e.g. {examples})")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:  # shapes differ
        lines = [ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln]
        raise BenchError(f"model: {path} does not fit the architecture: "
                         f"{len(lines)} tensors of another shape ({lines[0][:160] if lines else e})") from None
