"""Headless 3D rendering with pyrender: RGB, an exact instance mask, and per-object visibility.

One OpenGL context per process, created on first use and reused for every scene:
creating a context costs ~100 ms, a frame a few ms. pyrender comes from
generators.pyrender_setup, on the platform chosen there and with its defects patched.

Occlusion ground truth: `visible_px` counts an object's pixels in the scene's
instance mask; `full_px` counts them with the object drawn alone. Objects whose
projected 3D bounding boxes are disjoint cannot cover each other, so they are
drawn "alone" together in one pass, and an object that nothing can cover (no
overlapping box, or all overlapping boxes entirely behind it) needs no pass at all:
the counts are the same as one pass per object, at a fraction of the cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from bench.core.errors import BenchError
from generators.pyrender_setup import INSTALL, load_pyrender, ordered_scene, platform

#: Margin (px) added around projected boxes when deciding which objects may overlap.
_BOX_MARGIN = 2.0
#: Instance ids live in the red channel of the segmentation pass: at most 255 objects.
MAX_OBJECTS = 255


# -- scene description -------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One uniformly coloured piece of a model (a car's body, its wheels ...)."""

    geometry: Any  # trimesh.Trimesh, in the model's own frame
    color: tuple[float, float, float]  # linear RGB in [0, 1]
    metallic: float = 0.0
    roughness: float = 0.8
    smooth: bool = True


@dataclass(frozen=True)
class Camera:
    """A pinhole camera at `eye` looking at `target`, z up, square image."""

    eye: tuple[float, float, float]
    target: tuple[float, float, float] = (0.0, 0.0, 0.0)
    yfov_deg: float = 49.0
    znear: float = 0.05
    zfar: float = 100.0

    def pose(self) -> np.ndarray:
        """Camera-to-world 4x4 matrix (OpenGL convention: the camera looks down -z)."""
        eye = np.asarray(self.eye, dtype=np.float64)
        forward = np.asarray(self.target, dtype=np.float64) - eye
        forward /= np.linalg.norm(forward)
        right = np.cross(forward, (0.0, 0.0, 1.0))
        if np.linalg.norm(right) < 1e-9:
            raise BenchError("camera: looking straight down or up is not supported (no horizon direction)")
        right /= np.linalg.norm(right)
        up = np.cross(right, forward)
        m = np.eye(4)
        m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, up, -forward, eye
        return m

    def projection(self) -> np.ndarray:
        """The OpenGL projection matrix pyrender uses for this camera (aspect 1)."""
        t = np.tan(np.radians(self.yfov_deg) / 2)
        n, f = self.znear, self.zfar
        return np.array([
            [1 / t, 0, 0, 0],
            [0, 1 / t, 0, 0],
            [0, 0, (f + n) / (n - f), 2 * f * n / (n - f)],
            [0, 0, -1, 0],
        ])

    def project(self, points: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Pixel coordinates (x right, y down; pixel i spans [i, i+1)) of world points,
        and whether each lies in front of the camera."""
        pts = np.atleast_2d(np.asarray(points, dtype=np.float64))
        homo = np.c_[pts, np.ones(len(pts))]
        clip = homo @ (self.projection() @ np.linalg.inv(self.pose())).T
        w = clip[:, 3]
        front = w > 1e-9
        ndc = clip[:, :2] / np.where(front, w, 1.0)[:, None]
        px = np.c_[(ndc[:, 0] + 1) / 2 * size, (1 - ndc[:, 1]) / 2 * size]
        return px, front


@dataclass(frozen=True)
class Light:
    """A light: `directional` (casts the shadows when asked) or `point`; `position` is
    where it shines from (directional lights shine from there towards the origin)."""

    kind: str
    position: tuple[float, float, float]
    intensity: float
    color: tuple[float, float, float] = (1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Placed:
    """An instance of a cached model: its cache key and a 4x4 model-to-world pose."""

    model: Hashable
    pose: np.ndarray


@dataclass
class Stage:
    """What surrounds the objects: a square ground plane and the sky colour behind it."""

    ground_color: tuple[float, float, float] = (0.55, 0.55, 0.55)
    ground_size: float = 24.0
    background: tuple[float, float, float] = (0.62, 0.62, 0.62)
    ambient: float = 0.25


@dataclass
class RenderResult:
    """Outputs of one scene. `mask` holds ids 1..n in the order of the objects given."""

    image: np.ndarray | None
    mask: np.ndarray | None
    visible_px: list[int] = field(default_factory=list)
    full_px: list[int] = field(default_factory=list)
    #: bbox of each object's full (unoccluded) silhouette, [x0, y0, x1, y1) in pixels.
    bbox: list[list[int]] = field(default_factory=list)

    @property
    def visibility(self) -> list[float]:
        return [v / f if f else 0.0 for v, f in zip(self.visible_px, self.full_px)]


def look_at_pose(position: Sequence[float], target: Sequence[float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """A light/camera pose at `position` whose -z axis points at `target`."""
    return Camera(eye=tuple(float(x) for x in position), target=tuple(float(x) for x in target)).pose()


def object_pose(position: Sequence[float], yaw_deg: float, scale: float) -> np.ndarray:
    """Model-to-world: uniform scale, rotation about z, then translation."""
    a = np.radians(yaw_deg)
    c, s = np.cos(a), np.sin(a)
    m = np.eye(4)
    m[:3, :3] = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]) * scale
    m[:3, 3] = position
    return m


# -- the renderer ------------------------------------------------------------------------


class Renderer:
    """An offscreen renderer of square images with a model cache.

    Models are registered once under a key (`add_model`) and uploaded to the GPU
    context once; scenes then refer to them by key.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise BenchError(f"image_size: must be > 0, got {size}")
        self.size = size
        self._pr = load_pyrender()
        try:
            self._gl = self._pr.OffscreenRenderer(size, size)
        except Exception as exc:  # a library that loads but cannot make a context
            raise BenchError(
                f"renderer: cannot create an offscreen OpenGL context with {platform()} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); install it with: {INSTALL[platform()]}"
            ) from None
        self._models: dict[Hashable, tuple[Any, np.ndarray]] = {}
        self._ground: dict[tuple, Any] = {}

    def has_model(self, key: Hashable) -> bool:
        return key in self._models

    def add_model(self, key: Hashable, parts: Sequence[Part]) -> None:
        """Cache a model (a list of coloured parts in one frame) under `key`."""
        pr = self._pr
        prims = []
        corners = []
        for part in parts:
            mat = pr.MetallicRoughnessMaterial(
                baseColorFactor=(*part.color, 1.0), metallicFactor=part.metallic, roughnessFactor=part.roughness
            )
            prims += pr.Mesh.from_trimesh(part.geometry, material=mat, smooth=part.smooth).primitives
            corners.append(part.geometry.bounds)
        lo = np.min([c[0] for c in corners], axis=0)
        hi = np.max([c[1] for c in corners], axis=0)
        box = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
        self._models[key] = (pr.Mesh(primitives=prims), box)

    def model_center(self, key: Hashable) -> np.ndarray:
        """Centre of a cached model's bounding box, in the model's frame."""
        box = self._models[key][1]
        return (box.min(axis=0) + box.max(axis=0)) / 2

    def model(self, key: Hashable, build: Callable[[], Sequence[Part]]) -> Hashable:
        """`key`, after building and caching the model if it is new."""
        if key not in self._models:
            self.add_model(key, build())
        return key

    def _ground_mesh(self, stage: Stage) -> Any:
        key = (stage.ground_color, stage.ground_size)
        if key not in self._ground:
            import trimesh

            box = trimesh.creation.box(extents=(stage.ground_size, stage.ground_size, 0.02))
            box.apply_translation((0, 0, -0.01))
            mat = self._pr.MetallicRoughnessMaterial(
                baseColorFactor=(*stage.ground_color, 1.0), metallicFactor=0.0, roughnessFactor=1.0
            )
            self._ground[key] = self._pr.Mesh.from_trimesh(box, material=mat, smooth=False)
        return self._ground[key]

    def render(
        self,
        objects: Sequence[Placed],
        camera: Camera,
        lights: Sequence[Light],
        stage: Stage | None = None,
        *,
        rgb: bool = True,
        mask: bool = True,
        visibility: bool = True,
        shadows: bool = False,
    ) -> RenderResult:
        """Render a scene: RGB, the instance mask (id i+1 = objects[i]) and per-object
        pixel counts in the scene and alone. Visibility needs the mask pass."""
        if len(objects) > MAX_OBJECTS:
            raise BenchError(f"objects: at most {MAX_OBJECTS} per scene (uint8 ids), got {len(objects)}")
        for o in objects:
            if o.model not in self._models:
                raise BenchError(f"model: {o.model!r} was never added to the renderer")
        pr = self._pr
        stage = stage or Stage()
        scene = ordered_scene()(bg_color=(*stage.background, 1.0), ambient_light=(stage.ambient,) * 3)
        scene.add(self._ground_mesh(stage))
        nodes = [scene.add(self._models[o.model][0], pose=o.pose) for o in objects]
        scene.add(pr.PerspectiveCamera(yfov=np.radians(camera.yfov_deg), znear=camera.znear, zfar=camera.zfar,
                                       aspectRatio=1.0), pose=camera.pose())
        for light in lights:
            if light.kind == "directional":
                node = pr.DirectionalLight(color=light.color, intensity=light.intensity)
            elif light.kind == "point":
                node = pr.PointLight(color=light.color, intensity=light.intensity)
            else:
                raise BenchError(f"light: unknown kind {light.kind!r}; allowed: directional, point")
            scene.add(node, pose=look_at_pose(light.position))
        out = RenderResult(image=None, mask=None)
        if rgb:
            flags = pr.RenderFlags.SHADOWS_DIRECTIONAL if shadows else pr.RenderFlags.NONE
            out.image = self._draw(scene, flags)
        if mask or visibility:
            ids = self._seg(scene, {n: i + 1 for i, n in enumerate(nodes)})
            counts = np.bincount(ids.ravel(), minlength=len(nodes) + 1)[1:]
            out.visible_px = [int(c) for c in counts]
            if mask:
                out.mask = ids
            if visibility:
                out.full_px, out.bbox = self._alone(scene, nodes, objects, camera, ids)
        return out

    # -- passes ------------------------------------------------------------------------
    def _draw(self, scene: Any, flags: int) -> np.ndarray:
        """One colour pass, without the depth read-back pyrender always does (unused here)."""
        gl = self._gl
        if gl._platform.supports_framebuffers():
            color, _depth = gl.render(scene, flags)
            return np.ascontiguousarray(color)
        gl._platform.make_current()
        gl._renderer.viewport_width = gl._renderer.viewport_height = self.size
        gl._renderer.render(scene, flags)
        return np.ascontiguousarray(gl._renderer.read_color_buf())

    def _seg(self, scene: Any, ids: dict[Any, int]) -> np.ndarray:
        """Instance ids of the nodes in `ids` (others are not drawn at all), uint8."""
        color = self._draw_seg(scene, {n: (i, 0, 0) for n, i in ids.items()})
        return np.ascontiguousarray(color[..., 0])

    def _draw_seg(self, scene: Any, seg_map: dict) -> np.ndarray:
        gl = self._gl
        flags = self._pr.RenderFlags.SEG
        if gl._platform.supports_framebuffers():
            return gl.render(scene, flags, seg_node_map=seg_map)[0]
        gl._platform.make_current()
        gl._renderer.viewport_width = gl._renderer.viewport_height = self.size
        gl._renderer.render(scene, flags, seg_map)
        return gl._renderer.read_color_buf()

    def _alone(
        self, scene: Any, nodes: list, objects: Sequence[Placed], camera: Camera, ids: np.ndarray
    ) -> tuple[list[int], list[list[int]]]:
        """Pixel count and bbox of every object drawn without the others.

        Object j can cover object i only if their screen rectangles meet and j is not
        entirely behind i (depth ranges of their 3D boxes); an object nobody can cover
        shows its full silhouette in the scene mask already and needs no pass.
        """
        bounds = [self._screen_bounds(o, camera) for o in objects]
        rects = [b[0] for b in bounds]
        n = len(objects)
        coverable = [
            any(j != i and _intersect(rects[i], rects[j]) and bounds[j][1][0] <= bounds[i][1][1] for j in range(n))
            for i in range(n)
        ]
        # greedy colouring: each pass draws objects whose rects are pairwise disjoint
        groups: list[list[int]] = []
        for i in (i for i in range(n) if coverable[i]):
            for g in groups:
                if not any(_intersect(rects[i], rects[j]) for j in g):
                    g.append(i)
                    break
            else:
                groups.append([i])
        silhouettes: dict[int, np.ndarray] = {}
        for g in groups:
            alone = self._seg(scene, {nodes[i]: i + 1 for i in g})
            for i in g:
                silhouettes[i] = alone == i + 1
        full, boxes = [], []
        for i in range(n):
            sil = silhouettes[i] if i in silhouettes else ids == i + 1
            full.append(int(sil.sum()))
            boxes.append(_bbox(sil))
        return full, boxes

    def _screen_bounds(self, obj: Placed, camera: Camera) -> tuple[tuple[float, ...], tuple[float, float]]:
        """A conservative screen rectangle around an object (the whole plane if it crosses
        the camera plane) and the range of its distance along the view axis."""
        box = self._models[obj.model][1]
        world = np.c_[box, np.ones(8)] @ obj.pose.T
        depth = -(world @ np.linalg.inv(camera.pose()).T)[:, 2]
        px, front = camera.project(world[:, :3], self.size)
        if not front.all():
            return (-np.inf, -np.inf, np.inf, np.inf), (-np.inf, np.inf)
        lo, hi = px.min(axis=0) - _BOX_MARGIN, px.max(axis=0) + _BOX_MARGIN
        return (lo[0], lo[1], hi[0], hi[1]), (float(depth.min()), float(depth.max()))

    def close(self) -> None:
        self._gl.delete()


def _intersect(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _bbox(sil: np.ndarray) -> list[int]:
    """[x0, y0, x1, y1) of a boolean silhouette; all zeros when empty."""
    ys = np.flatnonzero(sil.any(axis=1))
    xs = np.flatnonzero(sil.any(axis=0))
    if len(xs) == 0:
        return [0, 0, 0, 0]
    return [int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1]


_RENDERER: Renderer | None = None


def get_renderer(size: int) -> Renderer:
    """This process's renderer, created on first use (and re-created if the size changes)."""
    global _RENDERER
    if _RENDERER is None or _RENDERER.size != size:
        if _RENDERER is not None:
            _RENDERER.close()
        _RENDERER = Renderer(size)
    return _RENDERER
