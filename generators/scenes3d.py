"""3D scene generators rendered with pyrender (no Blender): `clevr` and `toys`.

Both share a CLEVR-like stage: objects stand on a grey ground plane, placed
uniformly in [-extent, extent]² with a minimum gap between their footprints; the
camera looks at the origin from `camera_distance` away horizontally and
`camera_height` up, with seeded jitter; three lights (key, fill, back) are jittered
too. Every random choice of a scene comes from its own seed, in a fixed order, and
none depends on the camera height: a height sweep renders the *same* layouts from
lower and lower viewpoints, so only occlusion changes.

Ground truth per object: 3D position (the ground contact point), yaw, scale,
the pixel centre (projection of the model's box centre), the bbox of its full
silhouette, and `visible_px` / `full_px` / `visibility` (render3d's exact counts).
"""

from __future__ import annotations

import itertools
import math
import random
from abc import abstractmethod
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, Hashable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.core.codes import FeatureSpace
from bench.core.dataset import Scene
from bench.core.errors import BenchError, ConfigError
from generators import render3d
from generators.base import CommonConfig, SceneGenerator, SplitPlan, plan_splits, register_generator
from generators.priors import CoveringSets, ListedSets, omega_size, priors_from_counts, uniform_priors
from generators.render3d import Camera, Light, Part, Placed, Stage
from generators.sampling import check_object_range, sample_uniform_objects
from generators.splits import FCode, active_counts, fcode_key, fcodes_feasible

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
#: (metallic, roughness) of CLEVR's two materials.
MATERIALS: dict[str, tuple[float, float]] = {"rubber": (0.0, 0.9), "metal": (0.8, 0.3)}
#: CLEVR object scales: the radius of the footprint's bounding circle.
SIZES: dict[str, float] = {"small": 0.35, "large": 0.7}

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


def unit_rgb(rgb: Sequence[int]) -> tuple[float, float, float]:
    """An 8-bit colour as pyrender's base colour factor. pyrender writes shaded values
    without gamma encoding, so passing the sRGB values keeps the palette's look
    where the light is about 1."""
    return tuple(v / 255 for v in rgb)


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
        render3d.check_available()

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


# -- CLEVR ---------------------------------------------------------------------------------


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


@dataclass
class ClevrConfig(Scene3DConfig):
    colors: tuple[str, ...] = ("gray", "red", "blue", "green")
    shapes: tuple[str, ...] = CLEVR_SHAPES
    #: a group of O/F only when it lists more than one value (else every object has that value).
    materials: tuple[str, ...] = ("rubber",)
    sizes: tuple[str, ...] = ("small",)
    min_objects: int = 3
    max_objects: int = 10


@register_generator
class ClevrGenerator(Scene3DGenerator):
    """CLEVR-style scenes. O is the *set* of conjunctions in a scene: objects of a scene
    are distinct conjunctions (as in the multi-hot O), drawn from `uniform`: O uniform
    over all codes with min..max objects, restricted to the split's F codes."""

    name = "clevr"
    version = "1.0"
    description = "CLEVR-style 3D scenes (pyrender): colour x shape (x material x size), occlusion sweeps"
    config_cls = ClevrConfig
    default_preset = "default"
    presets = {
        "default": dict(n_train=8_000, n_val=2_000, n_test=2_000),
        "occlusion-sweep": dict(camera_heights=(0.6, 1.2, 1.9, 2.5, 3.2), n_train=8_000, n_val=2_000, n_test=2_000),
        "small": dict(n_train=400, n_val=100, n_test=100, image_size=224),
    }
    object_fields = {**OBJECT_FIELDS_3D, "material": pa.string(), "size": pa.string()}
    scene_fields = SCENE_FIELDS_3D
    config: ClevrConfig

    def validate_scene(self) -> None:
        c = self.config
        for param, given, allowed in (("colors", c.colors, CLEVR_COLORS), ("shapes", c.shapes, CLEVR_SHAPES),
                                      ("materials", c.materials, MATERIALS), ("sizes", c.sizes, SIZES)):
            if not given:
                raise ConfigError(param, f"needs at least one value; allowed: {', '.join(allowed)}")
            for v in given:
                if v not in allowed:
                    raise ConfigError(param, f"unknown {v!r}; allowed: {', '.join(allowed)}")
            if len(set(given)) != len(given):
                raise ConfigError(param, f"duplicate values in {list(given)}")
        n_conj = len(c.colors) * len(c.shapes) * len(c.materials) * len(c.sizes)
        check_object_range(c.min_objects, c.max_objects, n_conj)
        if c.max_objects > render3d.MAX_OBJECTS:
            raise ConfigError("max_objects", f"at most {render3d.MAX_OBJECTS} objects (uint8 masks)")
        check_packing(c.max_objects, max(SIZES[s] for s in c.sizes), c.min_gap, c.extent, "max_objects")

    def build_feature_space(self) -> FeatureSpace:
        c = self.config
        groups = [("color", c.colors), ("shape", c.shapes), ("material", c.materials), ("size", c.sizes)]
        return FeatureSpace.of([(g, vs) for g, vs in groups if g in ("color", "shape") or len(vs) > 1])

    def plan(self) -> dict[str, SplitPlan]:
        c = self.config
        sizes = self.feature_space.sizes
        codes = fcodes_feasible(sizes, lambda a: omega_size(a, c.min_objects, c.max_objects) > 0)
        plans = plan_splits(c, codes, sizes, lambda split_codes: uniform_priors(
            [active_counts(f) for f in split_codes], c.min_objects, c.max_objects))
        self._support = {split: {fcode_key(f) for f in p.codes} for split, p in plans.items()}
        return plans

    def sample_conjunctions(self, rng: random.Random, split: str) -> tuple[list[int], FCode]:
        """O uniform over codes with min..max objects whose F lies in the split (exact rejection)."""
        c, space = self.config, self.feature_space
        return sample_uniform_objects(rng, space.n_conjunctions, c.min_objects, c.max_objects, space.conj_values,
                                      len(space.sizes), self._support[split])

    def f_support(self, split: str) -> list[tuple[FCode, int]]:
        """`uniform`: P(f) ∝ |Ω(f)| over the split's codes."""
        c = self.config
        return [(f, omega_size(active_counts(f), c.min_objects, c.max_objects)) for f in self.plans[split].codes]

    def o_given_f(self) -> CoveringSets:
        return CoveringSets(self.config.min_objects, self.config.max_objects)

    def attribute(self, conj: int, group: str, default: str) -> str:
        space = self.feature_space
        if group not in space.names:
            return default
        return space.conj_names(conj)[space.names.index(group)]

    def layout(self, split: str, index: int, seed: int) -> Layout:
        c = self.config
        rng = random.Random(seed)
        conjs, code = self.sample_conjunctions(rng, split)
        rng.shuffle(conjs)
        renderer = render3d.get_renderer(c.image_size)
        models, scales, fields = [], [], []
        for conj in conjs:
            color, shape = self.attribute(conj, "color", ""), self.attribute(conj, "shape", "")
            material, size = self.attribute(conj, "material", c.materials[0]), self.attribute(conj, "size", c.sizes[0])
            metallic, roughness = MATERIALS[material]
            key = ("clevr", shape, color, material)
            renderer.model(key, lambda: [Part(clevr_geometry(shape), unit_rgb(CLEVR_COLORS[color]),
                                              metallic, roughness, smooth=shape != "cube")])
            models.append(key)
            scales.append(SIZES[size])
            fields.append({"conj": conj, "material": material, "size": size})
        h = math.log2(omega_size(active_counts(code), c.min_objects, c.max_objects))
        return self.arrange(rng, models, scales, scales, fields, h)


# -- toys ----------------------------------------------------------------------------------

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


@dataclass
class ToysConfig(Scene3DConfig):
    image_size: int = 224
    camera_height: float = 3.0
    #: colour of the four core objects: cars A and B (identical), car C (other make), boat D.
    color: str = "red"
    #: extra objects: distinct conjunctions of the other colours, uniform among all such sets.
    distractors: int = 0
    distractor_colors: tuple[str, ...] = ("blue", "green", "yellow")


@register_generator
class ToysGenerator(Scene3DGenerator):
    """IsSameObject toy scenes: two identical cars (A, B), a car of another make (C), a boat (D).

    Feature space colour x category. O (the set of conjunctions) is the fixed core
    {colour car_make_1, colour car_make_2, colour boat} plus the distractor set; the
    twins A and B share one conjunction, so O has one bit fewer than the scene has
    objects. Without distractors O and F are constant (all priors 0 bits). The toys
    are for pairwise analyses (evaluators/toy_analysis.py labels patch pairs from the
    rows' `id`, `category` and `identity`), so splits differ only in layouts: they
    share F codes.
    """

    name = "toys"
    version = "1.0"
    description = "IsSameObject toys (pyrender): identical cars, a car of another make, a boat"
    config_cls = ToysConfig
    default_preset = "identical-cars"
    presets = {
        "identical-cars": dict(n_train=1_000, n_val=200, n_test=200),
        "identical-cars-distractors": dict(distractors=2, n_train=1_000, n_val=200, n_test=200),
    }
    object_fields = {**OBJECT_FIELDS_3D, "category": pa.string(), "role": pa.string(),
                     "identity": pa.int32(), "twins": pa.list_(pa.int32())}
    scene_fields = SCENE_FIELDS_3D
    config: ToysConfig

    def validate_scene(self) -> None:
        c = self.config
        for param, names in (("color", [c.color]), ("distractor_colors", c.distractor_colors)):
            for v in names:
                if v not in CLEVR_COLORS:
                    raise ConfigError(param, f"unknown {v!r}; allowed: {', '.join(CLEVR_COLORS)}")
        if c.color in c.distractor_colors or len(set(c.distractor_colors)) != len(c.distractor_colors):
            raise ConfigError("distractor_colors", f"must be distinct and differ from color={c.color!r}")
        n_free = len(c.distractor_colors) * len(TOY_CATEGORIES)
        if not 0 <= c.distractors <= n_free:
            raise ConfigError("distractors", f"must be 0..{n_free} (distinct distractor conjunctions), got {c.distractors}")
        if math.comb(n_free, c.distractors) > 2_000_000:
            raise ConfigError("distractors", "too many distractor sets to enumerate exact priors")
        check_packing(4 + c.distractors, max(toy_radius(k) for k in TOY_CATEGORIES), c.min_gap, c.extent, "distractors")

    def build_feature_space(self) -> FeatureSpace:
        c = self.config
        return FeatureSpace.of([("color", (c.color, *c.distractor_colors)), ("category", TOY_CATEGORIES)])

    def _distractor_pool(self) -> list[int]:
        n_cat = len(TOY_CATEGORIES)
        return list(range(n_cat, self.feature_space.n_conjunctions))  # colour 0 is the core colour

    def plan(self) -> dict[str, SplitPlan]:
        """Exact priors by enumerating every distractor set (O uniform over them)."""
        space = self.feature_space
        core = list(range(len(TOY_CATEGORIES)))
        omega: dict[str, int] = {}
        for extra in itertools.combinations(self._distractor_pool(), self.config.distractors):
            key = space.f_key(space.o_to_f(space.encode_o(core + list(extra))))
            omega[key] = omega.get(key, 0) + 1
        self._omega = omega
        counts = list(omega.values())
        priors = priors_from_counts(counts, counts)
        return {split: SplitPlan(n=n, priors=priors) for split, n in self.config.split_sizes.items() if n}

    def f_support(self, split: str) -> list[tuple[FCode, int]]:
        """Every split shares the F codes of all distractor sets, P(f) ∝ the sets giving f."""
        if split not in self.plans:
            raise BenchError(f"split: {split!r} has no scenes; available: {', '.join(self.plans)}")
        sizes = self.feature_space.sizes
        out = []
        for key, n in self._omega.items():
            bits = key.replace("|", "")
            flat = [i for i, b in enumerate(bits) if b == "1"]
            offsets = self.feature_space.offsets
            out.append((tuple(tuple(i - off for i in flat if off <= i < off + s) for off, s in zip(offsets, sizes)), n))
        return out

    def o_given_f(self) -> ListedSets:
        """O uniform over the core plus each distractor set (distinct sets give distinct O)."""
        core = tuple(range(len(TOY_CATEGORIES)))
        return ListedSets(tuple(core + extra for extra in itertools.combinations(self._distractor_pool(),
                                                                               self.config.distractors)))

    def layout(self, split: str, index: int, seed: int) -> Layout:
        c = self.config
        space = self.feature_space
        rng = random.Random(seed)
        extra = sorted(rng.sample(self._distractor_pool(), c.distractors))
        conjs = [0, 0, 1, 2] + extra  # A, B: car_make_1; C: car_make_2; D: boat (core colour)
        roles = ["A", "B", "C", "D"] + ["distractor"] * len(extra)
        renderer = render3d.get_renderer(c.image_size)
        models, radii, fields = [], [], []
        for i, (conj, role) in enumerate(zip(conjs, roles)):
            color, category = space.conj_names(conj)
            key = ("toy", category, color)
            renderer.model(key, lambda: toy_parts(category, unit_rgb(CLEVR_COLORS[color])))
            models.append(key)
            radii.append(toy_radius(category))
            twins = [j + 1 for j, other in enumerate(conjs) if other == conj and j != i]
            fields.append({"conj": conj, "category": category, "role": role, "identity": conj, "twins": twins})
        key = space.f_key(space.o_to_f(space.encode_o(conjs)))
        return self.arrange(rng, models, [1.0] * len(models), radii, fields, math.log2(self._omega[key]))
