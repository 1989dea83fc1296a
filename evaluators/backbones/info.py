"""What a backbone is, told without torch: its metadata record (`BackboneInfo`), and the
ground-truth backbones' (`pixels`, `oracle:`) read from their specs alone. A run plans the rows
it owes from these before it loads any model code (`evaluators.backbones.backbone_metadata`);
`evaluators.backbones.base` and `evaluators.backbones.ground_truth` build on them."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from bench.core.errors import BenchError

#: The ground-truth backbones' weights fingerprint (they have no weights: the code's version).
VERSION = "builtin-v1"
ORACLE_KINDS = ("objects", "features", "patches", "mix-<q>")
#: oracle:patches uses the ColorShape object size as its patch: a 256 px image gives 16 x 16 tokens.
ORACLE_PATCH = 16
DEFAULT_PIXEL_PATCH = 16
DEFAULT_SIDE = 256
#: The families of `GroundTruthBackbone`: their class token is the mean patch token (`_with_cls`).
FAMILIES = ("pixels", "oracle")


@dataclass(frozen=True)
class BackboneInfo:
    """Strict metadata of one backbone (JSON-able via `to_dict`)."""

    spec: str
    family: str
    revision: str
    n_params: int
    patch_size: int | None
    input_size: int
    n_layers: int
    width: int
    n_prefix: int
    cls_index: int | None
    register_indices: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["register_indices"] = list(self.register_indices)
        return d


def cls_is_mean(info: BackboneInfo) -> bool:
    """Whether a backbone's class token is its mean patch token, read from its info alone, so a
    run (from the loaded backbone) and a study (from the registry's metadata) alias the same views."""
    return info.family in FAMILIES


def ground_truth_info(spec: str, family: str, patch: int | None, width: int, side: int = DEFAULT_SIDE) -> BackboneInfo:
    return BackboneInfo(spec=spec, family=family, revision=VERSION, n_params=0, patch_size=patch, input_size=side,
                        n_layers=0, width=width, n_prefix=1, cls_index=0, register_indices=())


def pixels_info(spec: str, patch: int) -> BackboneInfo:
    """`pixels:P`: one token per P x P patch, its RGB values."""
    return ground_truth_info(spec, "pixels", patch, 3 * patch * patch)


def oracle_info(spec: str, kind: str) -> BackboneInfo:
    """An oracle before it reads a dataset (its width, the dataset's code length, comes when it is bound)."""
    return ground_truth_info(spec, "oracle", ORACLE_PATCH if kind == "patches" else None, 0)


def ground_truth_spec_info(spec: str) -> BackboneInfo:
    """The metadata of a `pixels[:P]` or `oracle:<kind>` spec (an oracle's unbound), refused as loading it would."""
    return pixels_info(spec, pixels_patch(spec)) if spec.startswith("pixels") else oracle_info(spec, oracle_kind(spec)[0])


def pixels_patch(spec: str) -> int:
    """The patch side of a `pixels[:P]` spec, refused in one line when malformed."""
    m = re.fullmatch(r"pixels(?::(\d+))?", spec)
    if not m or (m.group(1) is not None and int(m.group(1)) <= 0):
        raise BenchError(f"model: bad pixels spec {spec!r}; use pixels or pixels:<P> with a patch size P > 0")
    return int(m.group(1) or DEFAULT_PIXEL_PATCH)


def oracle_kind(spec: str) -> tuple[str, float | None]:
    """The kind of an `oracle:<kind>` spec and, for `mix-<q>`, its q; refused in one line when unknown."""
    kind = spec.split(":", 1)[1]
    if kind in ("objects", "features", "patches"):
        return kind, None
    m = re.fullmatch(r"mix-([0-9]*\.?[0-9]+)", kind)
    if m and 0.0 <= float(m.group(1)) <= 1.0:
        return "mix", float(m.group(1))
    raise BenchError(f"model: unknown oracle {spec!r}; allowed: " + ", ".join(f"oracle:{k}" for k in ORACLE_KINDS)
                     + " (q in [0, 1])")
