"""The offscreen renderer: exact masks, visibility ground truth, projection, no leak, clear errors."""

from __future__ import annotations

import ctypes.util
import importlib.metadata

import numpy as np
import psutil
import pytest

from bench.core.errors import BenchError
from generators import pyrender_setup, render3d
from generators.render3d import Camera, Light, Part, Placed, object_pose
from generators.meshes import clevr_geometry

SIZE = 96
LIGHTS = [Light("directional", (4.0, -3.0, 10.0), 1.4), Light("point", (-5.0, -6.0, 5.0), 20.0)]
CAMERA = Camera(eye=(10.0, 0.0, 1.0), yfov_deg=40.0)


@pytest.fixture(scope="module")
def renderer():
    r = render3d.get_renderer(SIZE)
    for shape in ("cube", "sphere", "cylinder"):
        r.model(("t", shape), lambda shape=shape: [Part(clevr_geometry(shape), (0.7, 0.2, 0.2), smooth=shape != "cube")])
    return r


def put(shape: str, x: float, y: float, scale: float = 0.5, yaw: float = 0.0) -> Placed:
    return Placed(("t", shape), object_pose((x, y, 0.0), yaw, scale))


def test_one_renderer_per_process(renderer):
    assert render3d.get_renderer(SIZE) is renderer


def test_mask_ids_and_counts_match_objects(renderer):
    objs = [put("cube", 0, -1.5), put("sphere", 0, 0), put("cylinder", 0, 1.5), put("sphere", -3, 0.4, 0.7)]
    out = renderer.render(objs, CAMERA, LIGHTS)
    assert out.image.shape == (SIZE, SIZE, 3) and out.image.dtype == np.uint8
    assert out.mask.shape == (SIZE, SIZE) and out.mask.dtype == np.uint8
    ids = set(np.unique(out.mask).tolist()) - {0}
    assert ids == {1, 2, 3, 4}
    assert out.visible_px == [int((out.mask == i).sum()) for i in range(1, 5)]
    assert all(v > 20 for v in out.visible_px)
    # the image shows the objects where the mask says they are: object pixels are reddish, the ground grey
    red = out.image[..., 0].astype(int) - out.image[..., 2].astype(int)
    assert red[out.mask > 0].mean() > 40 > abs(red[out.mask == 0].mean())


def test_object_alone_has_visibility_one(renderer):
    out = renderer.render([put("cylinder", 0.5, -0.3)], CAMERA, LIGHTS)
    assert out.full_px == out.visible_px and out.full_px[0] > 100
    assert out.visibility == [1.0]


def test_object_fully_hidden_behind_another_has_visibility_zero(renderer):
    big_cube = put("cube", 3.0, 0.0, scale=2.0)  # 2.8 units tall, between the camera and the sphere
    small_sphere = put("sphere", -2.0, 0.0, scale=0.2)
    out = renderer.render([big_cube, small_sphere], CAMERA, LIGHTS)
    assert out.visible_px[1] == 0 and out.full_px[1] > 0
    assert out.visibility[1] == 0.0
    assert 2 not in np.unique(out.mask)
    # alone, the sphere shows exactly its full_px
    alone = renderer.render([small_sphere], CAMERA, LIGHTS)
    assert alone.visible_px == [out.full_px[1]]


def test_grouped_alone_passes_equal_one_render_per_object(renderer):
    """render3d draws non-overlapping objects' 'alone' passes together; counts must not change."""
    rng = np.random.default_rng(3)
    shapes = ["cube", "sphere", "cylinder"]
    objs = [put(shapes[i % 3], *rng.uniform(-3, 3, 2), scale=rng.uniform(0.3, 0.7), yaw=rng.uniform(0, 360))
            for i in range(9)]
    low = Camera(eye=(9.0, -2.0, 0.6), yfov_deg=49.0)
    out = renderer.render(objs, low, LIGHTS)
    truth = [renderer.render([o], low, LIGHTS, rgb=False).visible_px[0] for o in objs]
    assert out.full_px == truth
    assert any(v < f for v, f in zip(out.visible_px, out.full_px))  # the scene does have occlusion
    for i, o in enumerate(objs):
        alone = renderer.render([o], low, LIGHTS, rgb=False)
        ys, xs = np.nonzero(alone.mask == 1)
        if len(xs):
            assert out.bbox[i] == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]


def test_projection_matches_the_rendered_silhouette(renderer):
    obj = put("sphere", 1.0, 1.5, scale=0.6)
    out = renderer.render([obj], CAMERA, LIGHTS, rgb=False)
    centre = obj.pose @ np.r_[renderer.model_center(obj.model), 1.0]
    (px, py), = CAMERA.project(centre[:3], SIZE)[0]
    ys, xs = np.nonzero(out.mask == 1)
    assert abs(xs.mean() + 0.5 - px) < 1.0 and abs(ys.mean() + 0.5 - py) < 1.0


def test_switches_skip_passes(renderer):
    objs = [put("cube", 0, 0)]
    only_rgb = renderer.render(objs, CAMERA, LIGHTS, mask=False, visibility=False)
    assert only_rgb.mask is None and only_rgb.full_px == [] and only_rgb.image is not None
    no_rgb = renderer.render(objs, CAMERA, LIGHTS, rgb=False, visibility=False)
    assert no_rgb.image is None and no_rgb.full_px == [] and no_rgb.visible_px[0] > 0


def test_rendering_is_deterministic(renderer):
    objs = [put("cube", 0, -1), put("sphere", 0.3, 0.4)]
    a = renderer.render(objs, CAMERA, LIGHTS, shadows=True)
    b = renderer.render(objs, CAMERA, LIGHTS, shadows=True)
    assert np.array_equal(a.image, b.image) and np.array_equal(a.mask, b.mask)


def test_memory_stays_flat_over_300_renders(renderer):
    """Without the getContext patch each frame leaks ~20 MB under OSMesa (6 GB here)."""
    objs = [put("cube", 0, -1.5), put("sphere", 0, 0), put("cylinder", 0, 1.5)]
    proc = psutil.Process()
    for _ in range(30):
        renderer.render(objs, CAMERA, LIGHTS)
    before = proc.memory_info().rss
    for _ in range(300):
        renderer.render(objs, CAMERA, LIGHTS)
    grown = (proc.memory_info().rss - before) / 2**20
    assert grown < 30, f"RSS grew {grown:.0f} MiB over 300 renders"


def test_missing_opengl_library_is_one_line_with_install_command(monkeypatch):
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    with pytest.raises(BenchError, match="apt-get install libosmesa6") as err:
        pyrender_setup.check_available()
    assert "\n" not in str(err.value)


def test_old_pyopengl_is_refused(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.1.0" if name == "PyOpenGL" else real(name))
    with pytest.raises(BenchError, match=r"PyOpenGL 3\.1\.0 .*3\.1\.10"):
        pyrender_setup.check_available()


def test_unknown_platform_is_refused(monkeypatch):
    monkeypatch.setenv(pyrender_setup.PLATFORM_ENV, "vulkan")
    with pytest.raises(BenchError, match="allowed: osmesa, egl"):
        pyrender_setup.check_available()


def test_camera_pose_looks_at_target():
    cam = Camera(eye=(3.0, 4.0, 2.0), target=(0.0, 0.0, 0.0))
    pose = cam.pose()
    forward = -pose[:3, 2]
    assert np.allclose(forward, -np.array([3.0, 4.0, 2.0]) / np.linalg.norm([3.0, 4.0, 2.0]))
    px, front = cam.project(np.zeros(3), 100)
    assert front.all() and np.allclose(px, [[50.0, 50.0]])
    with pytest.raises(BenchError, match="straight down"):
        Camera(eye=(0.0, 0.0, 5.0)).pose()
