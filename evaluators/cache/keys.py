"""What names a request's data and its choices, without torch: the layers and tokens asked for,
the dtypes and devices known, and a split's fingerprint (part of every row's key). A run works out
from them which rows it owes before it loads any model code (`evaluators.cache.extract`, which
extracts, re-exports them); a plan prints its cache bytes with `gib`."""

from __future__ import annotations

from typing import Any, Sequence

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.hashing import fingerprint
from evaluators.probes.families import TOKEN_CHOICES

DTYPES = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")


def parse_layers(layers: str | int | Sequence[int | str], n_layers: int) -> list[int]:
    """Hidden-state indices (0 = embeddings, n_layers = last block) from `all`, `last`, `mid`,
    ints (negative count from the end) or fractions of the depth like `0.5`, comma-separated or listed."""
    items: list[Any] = layers.split(",") if isinstance(layers, str) else (
        [layers] if isinstance(layers, int) else list(layers))
    out: set[int] = set()
    for raw in items:
        item = raw.strip().lower() if isinstance(raw, str) else raw
        if item == "all":
            out.update(range(n_layers + 1))
            continue
        if item in ("last", "mid", "first"):
            out.add({"last": n_layers, "mid": n_layers // 2, "first": 0}[item])
            continue
        try:
            value = float(item) if isinstance(item, str) and "." in item else int(item)
        except (TypeError, ValueError):
            raise BenchError(f"layers: cannot read {raw!r}; use all, last, mid, integers or fractions like 0.5") from None
        if isinstance(value, float):
            if not 0.0 <= value <= 1.0:
                raise BenchError(f"layers: fraction {raw!r} must be in [0, 1]")
            out.add(int(round(value * n_layers)))
            continue
        index = value + n_layers + 1 if value < 0 else value
        if not 0 <= index <= n_layers:
            raise BenchError(f"layers: {raw!r} out of range; this backbone has hidden states 0..{n_layers}")
        out.add(index)
    if not out:
        raise BenchError("layers: nothing selected")
    return sorted(out)


def parse_tokens(token_choices: str | Sequence[str]) -> list[str]:
    items = token_choices.split(",") if isinstance(token_choices, str) else list(token_choices)
    out = []
    for v in (s.strip() for s in items):
        if v not in TOKEN_CHOICES:
            raise TOKEN_CHOICES.unknown(v)
        if v not in out:
            out.append(v)
    if not out:
        raise BenchError("tokens: none selected")
    return out


def check_dtype(dtype: str) -> None:
    """Refuse an unknown dtype in one line (`EvaluationRequest` does when it is made, before any work)."""
    if dtype not in DTYPES:
        raise BenchError(f"dtype: unknown {dtype!r}; allowed: {', '.join(DTYPES)}")


def check_device(device: str) -> None:
    """Refuse an unknown device name in one line (whether cuda is there is `resolve_device`'s to say)."""
    if device not in DEVICES:
        raise BenchError(f"device: unknown {device!r}; allowed: {', '.join(DEVICES)}")


def split_fingerprint(dataset: Dataset, split: str, limit: int | None = None) -> str:
    """Fingerprint of a split, or of its first `limit` rows (a `--limit` run's data)."""
    if limit is None or limit >= dataset.num_rows(split):
        return dataset.fingerprint(split)
    return fingerprint(dataset.table(split, ["content_hash"])["content_hash"].to_pylist()[:limit])


def gib(n: int) -> str:
    """A byte count for a message, in decimal units like `df -H`: kB, MB or GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB"
