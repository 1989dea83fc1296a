"""What the 3D generators (`clevr`, `toys`) share: a CLEVR-like stage, rendered with pyrender
(no Blender), and `Scene3DGenerator`, the base that sweeps, places, lights and renders it.

Objects stand on a grey ground plane, placed uniformly in [-extent, extent]² with a minimum
gap between their footprints; the camera looks at the origin from `camera_distance` away
horizontally and `camera_height` up, with seeded jitter; three lights (key, fill, back) are
jittered too. Every random choice of a scene comes from its own seed, in a fixed order, and
none depends on the camera height: a height sweep renders the *same* layouts from
lower and lower viewpoints, so only occlusion changes.

Ground truth per object: 3D position (the ground contact point), yaw, scale,
the pixel centre (projection of the model's box centre), the bbox of its full
silhouette, and `visible_px` / `full_px` / `visibility` (render3d's exact counts).
"""

from __future__ import annotations

import math
import random
from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Hashable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.core.dataset import Scene
from bench.core.errors import BenchError, ConfigError
from generators import render3d
from generators.base import CommonConfig, SceneGenerator
from generators.pyrender_setup import check_available
from generators.render3d import Camera, Light, Placed, Stage

#: Per-object 3D ground truth and per-scene camera/light columns, shared by both generators.
OBJECT_FIELDS_3D: dict[str, pa.DataType] = {
    "position": pa.list_(pa.float64()),
    "rotation": pa.float64(),
    "scale": pa.float64(),
    "pixel_center": pa.list_(pa.float64()),
}
SCENE_FIELDS_3D: dict[str, pa.DataType] = {
    "camera_height": pa.float64(),
    "camera_position": pa.list_(pa.float64()),
    "camera_pose": pa.list_(pa.float64()),
    "camera_fov": pa.float64(),
    "light_positions": pa.list_(pa.float64()),
}


@dataclass
class Scene3DConfig(CommonConfig):
    """Stage, camera and lights shared by the 3D generators (CLEVR's values by default)."""

    image_size: int = 336
    #: objects' ground contact points are uniform in [-extent, extent]².
    extent: float = 3.0
    #: minimum distance between the bounding circles of two footprints.
    min_gap: float = 0.25
    #: placement: tries per object, then a restart of the whole scene, at most this many.
    max_retries: int = 50
    max_restarts: int = 200
    camera_distance: float = 9.9
    camera_height: float = 3.2
    #: occlusion sweep: one dataset per height, same layouts (`--set camera_heights=0.6,1.2`).
    camera_heights: tuple[float, ...] = ()
    #: azimuth of the camera around the origin, degrees (CLEVR's camera sits at -43°).
    camera_azimuth: float = -43.3
    #: uniform jitter of the camera's x and y (not its height, the controlled variable).
    camera_jitter: float = 0.5
    fov: float = 49.0
    #: uniform jitter of each light coordinate.
    light_jitter: float = 1.0
    #: directional shadows (one more pass; off by default for speed).
    shadows: bool = False

    def validate_stage(self) -> None:
        if self.extent <= 0:
            raise ConfigError("extent", f"must be > 0, got {self.extent}")
        if self.min_gap < 0:
            raise ConfigError("min_gap", f"must be ≥ 0, got {self.min_gap}")
        if self.max_retries < 1 or self.max_restarts < 1:
            raise ConfigError("max_retries", "max_retries and max_restarts must be ≥ 1")
        if self.camera_distance <= 0:
            raise ConfigError("camera_distance", f"must be > 0, got {self.camera_distance}")
        _check_height("camera_height", self.camera_height)
        for h in self.camera_heights:
            _check_height("camera_heights", h)
        if not 1 <= self.fov < 179:
            raise ConfigError("fov", f"must be in [1, 179) degrees, got {self.fov}")
        if self.camera_jitter < 0 or self.light_jitter < 0:
            raise ConfigError("camera_jitter", "camera_jitter and light_jitter must be ≥ 0")


def _check_height(name: str, h: float) -> None:
    if not h > 0:
        raise ConfigError(name, f"camera height must be > 0 (above the ground), got {h}")


def check_packing(n: int, radius: float, gap: float, extent: float, param: str) -> None:
    """Refuse layouts that cannot exist: n discs of radius r + gap/2 around centres in
    [-e, e]² are disjoint and lie in a square of side 2(e + r + gap/2); discs never
    cover more than π/(2√3) of a plane region."""
    rho = radius + gap / 2
    if n * math.pi * rho**2 > math.pi / (2 * math.sqrt(3)) * (2 * (extent + rho)) ** 2:
        raise ConfigError(param, f"{n} objects of radius {radius} with gap {gap} cannot fit in "
                          f"[-{extent}, {extent}]²; use fewer objects, a smaller min_gap or a larger extent")


def place(rng: random.Random, radii: Sequence[float], c: Scene3DConfig) -> list[tuple[float, float]]:
    """CLEVR placement: each object uniform in the square, retried until its bounding
    circle keeps `min_gap` from all earlier ones; after `max_retries` misses the whole
    scene restarts, at most `max_restarts` times."""
    for _restart in range(c.max_restarts):
        placed: list[tuple[float, float]] = []
        for r in radii:
            for _try in range(c.max_retries):
                x, y = rng.uniform(-c.extent, c.extent), rng.uniform(-c.extent, c.extent)
                if all(math.hypot(x - px, y - py) - r - radii[j] >= c.min_gap for j, (px, py) in enumerate(placed)):
                    placed.append((x, y))
                    break
            else:
                break
        if len(placed) == len(radii):
            return placed
    raise BenchError(
        f"placement: could not place {len(radii)} objects with min_gap {c.min_gap} in [-{c.extent}, {c.extent}]² "
        f"after {c.max_restarts} restarts; use fewer objects, a smaller min_gap or a larger extent"
    )


def camera_and_lights(rng: random.Random, c: Scene3DConfig) -> tuple[Camera, list[Light]]:
    """The jittered camera (at the configured height) and CLEVR-like key, fill and back lights.

    Draws the same random numbers whatever the height, so layouts stay aligned across a sweep.
    """
    az = math.radians(c.camera_azimuth)
    jx, jy = rng.uniform(-c.camera_jitter, c.camera_jitter), rng.uniform(-c.camera_jitter, c.camera_jitter)
    eye = (c.camera_distance * math.cos(az) + jx, c.camera_distance * math.sin(az) + jy, c.camera_height)
    # light positions in the camera's frame (forward = towards the scene, side = to its right)
    fwd = np.array([-math.cos(az), -math.sin(az), 0.0])
    side = np.array([math.sin(az), -math.cos(az), 0.0])
    up = np.array([0.0, 0.0, 1.0])
    base = [("directional", (-2.0, 4.0, 10.0), 1.4), ("point", (-5.0, -6.0, 5.0), 20.0), ("point", (6.0, 2.0, 6.0), 12.0)]
    lights = []
    for kind, (f, s, u), intensity in base:
        j = [rng.uniform(-c.light_jitter, c.light_jitter) for _ in range(3)]
        pos = f * fwd + s * side + u * up + np.array(j)
        lights.append(Light(kind, tuple(float(x) for x in pos), intensity))
    return Camera(eye=eye, yfov_deg=c.fov), lights


@dataclass
class Layout:
    """A scene before rendering: posed models, camera, lights, and each object's columns."""

    placed: list[Placed]
    camera: Camera
    lights: list[Light]
    objects: list[dict[str, Any]]
    h_o_given_f: float


#: a ground plane 120 units wide: its far edge is the horizon, the background the sky above it.
STAGE = Stage(ground_color=(0.42, 0.42, 0.42), ground_size=120.0, background=(0.58, 0.58, 0.58), ambient=0.2)


class Scene3DGenerator(SceneGenerator):
    """What the 3D generators share: the sweep, the stage, rendering, visibility stats."""

    config: Scene3DConfig
    summary_columns: ClassVar[tuple[str, ...]] = ("objects",)

    @classmethod
    def expand(cls, config: Scene3DConfig) -> list[tuple[str, CommonConfig]]:
        if not config.camera_heights:
            return [("", config)]
        for h in config.camera_heights:
            _check_height("camera_heights", h)
        return [(f"height-{h:g}", replace(config, camera_heights=(), camera_height=h)) for h in config.camera_heights]

    def validate(self) -> None:
        self.config.validate_stage()
        self.validate_scene()
        check_available()

    def validate_scene(self) -> None:
        """Generator-specific checks (vocabularies, counts)."""

    def summarize(self, split: str, table: pa.Table) -> dict[str, Any]:
        """Occlusion statistics of the split: mean visibility and the share of objects < 50% visible."""
        vis = pc.list_flatten(table["objects"]).combine_chunks().field("visibility").to_numpy(zero_copy_only=False)
        if len(vis) == 0:
            return {"mean_visibility": None, "frac_visibility_below_half": None}
        return {"mean_visibility": float(vis.mean()), "frac_visibility_below_half": float((vis < 0.5).mean())}

    @abstractmethod
    def layout(self, split: str, index: int, seed: int) -> Layout:
        """Everything random about a scene, drawn from its seed; caches its models in this
        process's renderer."""

    def render(self, split: str, index: int, seed: int) -> tuple[Scene, float]:
        c = self.config
        lay = self.layout(split, index, seed)
        renderer = render3d.get_renderer(c.image_size)
        out = renderer.render(lay.placed, lay.camera, lay.lights, STAGE, shadows=c.shadows)
        objects = []
        for i, (p, fields) in enumerate(zip(lay.placed, lay.objects)):
            centre = p.pose @ np.r_[renderer.model_center(p.model), 1.0]
            px, _front = lay.camera.project(centre[:3], c.image_size)
            objects.append({
                "id": i + 1, **fields,
                "bbox": out.bbox[i], "visible_px": out.visible_px[i], "full_px": out.full_px[i],
                "visibility": out.visibility[i], "pixel_center": [float(v) for v in px[0]],
            })
        extras = {
            "camera_height": c.camera_height,
            "camera_position": list(lay.camera.eye),
            "camera_pose": [float(v) for v in lay.camera.pose().ravel()],
            "camera_fov": c.fov,
            "light_positions": [float(v) for light in lay.lights for v in light.position],
        }
        return Scene(image=out.image, mask=out.mask, objects=objects, extras=extras), lay.h_o_given_f

    def arrange(self, rng: random.Random, models: Sequence[Hashable], scales: Sequence[float],
                radii: Sequence[float], fields: Sequence[dict[str, Any]], h_o_given_f: float) -> Layout:
        """Place and pose cached models, then draw the camera and lights (in that order)."""
        spots = place(rng, radii, self.config)
        yaws = [rng.uniform(0.0, 360.0) for _ in spots]
        camera, lights = camera_and_lights(rng, self.config)
        placed = [Placed(m, render3d.object_pose((x, y, 0.0), yaw, s))
                  for m, (x, y), yaw, s in zip(models, spots, yaws, scales)]
        objects = [{**f, "position": [x, y, 0.0], "rotation": yaw, "scale": s}
                   for f, (x, y), yaw, s in zip(fields, spots, yaws, scales)]
        return Layout(placed, camera, lights, objects, h_o_given_f)
