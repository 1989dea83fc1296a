"""The models the 3D generators draw, at scale 1 on z = 0: CLEVR's shapes and palette, and the
procedural toys (two car makes and a boat), as trimesh geometry in coloured `Part`s.

Meshes are built on first use and cached: trimesh takes ~0.7 s to import, so only a process
that renders scenes pays for it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np

from bench.core.errors import ConfigError
from generators.render3d import Part

if TYPE_CHECKING:  # trimesh takes ~0.7 s to import: only scenes being rendered need it
    import trimesh

#: CLEVR's colours (sRGB 0-255), in CLEVR's order of mention; the paper uses the first four.
CLEVR_COLORS: dict[str, tuple[int, int, int]] = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
CLEVR_SHAPES: tuple[str, ...] = ("cube", "sphere", "cylinder")


def unit_rgb(rgb: Sequence[int]) -> tuple[float, float, float]:
    """An 8-bit colour as pyrender's base colour factor. pyrender writes shaded values
    without gamma encoding, so passing the sRGB values keeps the palette's look
    where the light is about 1."""
    return tuple(v / 255 for v in rgb)


@lru_cache(maxsize=None)
def clevr_geometry(shape: str) -> trimesh.Trimesh:
    """A CLEVR shape at scale 1 (footprint bounding radius 1), standing on z = 0."""
    import trimesh

    if shape == "cube":  # CLEVR shrinks cubes by √2 so their footprint fits the same circle
        mesh = trimesh.creation.box(extents=(math.sqrt(2),) * 3)
        mesh.apply_translation((0, 0, math.sqrt(2) / 2))
    elif shape == "sphere":
        mesh = trimesh.creation.icosphere(subdivisions=3, radius=1.0)
        mesh.apply_translation((0, 0, 1))
    elif shape == "cylinder":
        mesh = trimesh.creation.cylinder(radius=1.0, height=2.0, sections=48).smooth_shaded
        mesh.apply_translation((0, 0, 1))
    else:
        raise ConfigError("shapes", f"unknown {shape!r}; allowed: {', '.join(CLEVR_SHAPES)}")
    return mesh


#: the toys' models, by category (each drawn in any colour of the palette).
TOY_CATEGORIES: tuple[str, ...] = ("car_make_1", "car_make_2", "boat")
_TYRE = (0.05, 0.05, 0.05)
_GLASS = (0.12, 0.16, 0.2)
_WHITE = (0.85, 0.85, 0.85)


def _box(extents: Sequence[float], center: Sequence[float]) -> trimesh.Trimesh:
    import trimesh

    m = trimesh.creation.box(extents=extents)
    m.apply_translation(center)
    return m


def _wheels(xs: Sequence[float], half_track: float, radius: float, width: float) -> trimesh.Trimesh:
    import trimesh

    parts = []
    for x in xs:
        for y in (-half_track, half_track):
            w = trimesh.creation.cylinder(radius=radius, height=width, sections=24)
            w.apply_transform(trimesh.transformations.rotation_matrix(math.pi / 2, (1, 0, 0)))
            w.apply_translation((x, y, radius))
            parts.append(w)
    return trimesh.util.concatenate(parts)


def toy_parts(category: str, color: tuple[float, float, float]) -> list[Part]:
    """Procedural models on z = 0, facing +x: two car makes (body, cabin, four wheels) and a boat."""
    import trimesh

    if category == "car_make_1":  # a compact: short body, tall cabin in the middle
        return [
            Part(_box((1.5, 0.7, 0.32), (0, 0, 0.30)), color, 0.1, 0.5, smooth=False),
            Part(_box((0.75, 0.62, 0.28), (-0.05, 0, 0.60)), _GLASS, 0.0, 0.2, smooth=False),
            Part(_wheels((-0.48, 0.48), 0.36, 0.16, 0.12), _TYRE, 0.0, 0.9),
        ]
    if category == "car_make_2":  # a long, low saloon: cabin set back, bigger wheels
        return [
            Part(_box((1.9, 0.78, 0.26), (0, 0, 0.33)), color, 0.1, 0.5, smooth=False),
            Part(_box((0.85, 0.66, 0.2), (-0.25, 0, 0.56)), _GLASS, 0.0, 0.2, smooth=False),
            Part(_wheels((-0.62, 0.62), 0.40, 0.2, 0.14), _TYRE, 0.0, 0.9),
        ]
    if category == "boat":  # a hull tapering to the bow and down to the keel, a white cabin
        deck = [(-0.8, -0.38), (0.35, -0.38), (0.95, 0.0), (0.35, 0.38), (-0.8, 0.38)]
        keel = [(-0.7, -0.16), (0.3, -0.16), (0.7, 0.0), (0.3, 0.16), (-0.7, 0.16)]
        pts = [(x, y, 0.42) for x, y in deck] + [(x, y, 0.0) for x, y in keel]
        hull = trimesh.convex.convex_hull(np.array(pts))
        return [
            Part(hull, color, 0.1, 0.5, smooth=False),
            Part(_box((0.5, 0.5, 0.3), (-0.35, 0, 0.57)), _WHITE, 0.0, 0.6, smooth=False),
        ]
    raise ConfigError("category", f"unknown {category!r}; allowed: {', '.join(TOY_CATEGORIES)}")


@lru_cache(maxsize=None)
def toy_radius(category: str) -> float:
    """Bounding-circle radius of a toy's footprint."""
    pts = np.concatenate([p.geometry.vertices[:, :2] for p in toy_parts(category, (0, 0, 0))])
    return float(np.linalg.norm(pts, axis=1).max())
