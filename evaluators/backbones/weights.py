"""Content hashes of weights: what makes two backbones with the same name distinct.

Hashing a 1 GB checkpoint takes about a second, so hashes of large files are
remembered by (path, size, mtime, inode); small files are always re-hashed, which
also covers a file rewritten within the filesystem's timestamp granularity.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from bench.core.dataset import write_json_atomic
from bench.core.hashing import file_sha256

if TYPE_CHECKING:  # a plan hashes weight files (`files_hash`) before any model code loads
    import torch

#: The files of a Hugging Face checkpoint folder that hold its weights (their hash is its fingerprint).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
MEMO_MIN_BYTES = 64 << 20
MEMO_NAME = "weight-hashes.json"


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes (memoised for large files)."""
    st = path.stat()
    memo_key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    memo = _load_memo() if st.st_size >= MEMO_MIN_BYTES else {}
    if memo_key in memo:
        return memo[memo_key]
    digest = file_sha256(path)
    if st.st_size >= MEMO_MIN_BYTES:
        memo[memo_key] = digest
        _memo_path().parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(memo, _memo_path())
    return digest


def files_hash(paths: Sequence[Path]) -> str:
    """One hash over several weight files (names and contents)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(f"{p.name}\0{file_hash(p)}\0".encode())
    return h.hexdigest()


def state_dict_hash(model: torch.nn.Module) -> str:
    """sha256 over a model's parameters and buffers (names, shapes, dtypes, bytes)."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}\0{tuple(t.shape)}\0{t.dtype}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def _memo_path() -> Path:
    from evaluators.cache.entries import cache_root

    return cache_root() / MEMO_NAME


def _load_memo() -> dict[str, str]:
    try:
        return json.loads(_memo_path().read_text())
    except (OSError, ValueError):
        return {}
