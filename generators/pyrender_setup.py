"""pyrender, imported once per process on the chosen OpenGL platform, with its upstream defects
patched, so no caller needs to know.

OSMesa (software, no display, no GPU) is the default; `BINDINGBENCH_GL=egl` selects EGL where
a GPU driver is installed. The defects:

- pyrender 0.1.45 uses `np.infty`, which numpy 2 removed;
- under OSMesa, PyOpenGL keys its per-context caches on the current context
  *pointer*, which pyrender's offscreen path makes look new on every frame: shaders
  are recompiled each draw (4-9x slower) and ~20 MB leak per frame. There is one
  context per process here (generators.render3d), so `OpenGL.contextdata.getContext`
  can return a constant.
- pyrender keeps a scene's nodes in sets, iterated in memory-address order, which
  changes from run to run: the shader then sums the lights' contributions in another
  order and a few pixels a few hundred images differ by one intensity level. Scenes
  here iterate their lights and meshes in the order they were added (`ordered_scene`).
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import multiprocessing
import os
from typing import Any

import numpy as np

from bench.core.errors import BenchError

#: Environment variable choosing the OpenGL platform: `osmesa` (default) or `egl`.
PLATFORM_ENV = "BINDINGBENCH_GL"
PLATFORMS = ("osmesa", "egl")
#: PyOpenGL releases before this lack OSMesaCreateContextAttribs (pyrender pins 3.1.0).
MIN_PYOPENGL = (3, 1, 7)
#: Side of the shadow map (pyrender's 2048 costs ~4x more per frame in software).
SHADOW_MAP_SIZE = 1024

#: How to install each platform's library, named in the errors that find it missing.
INSTALL = {"osmesa": "apt-get install libosmesa6", "egl": "apt-get install libegl1"}
_LIBRARY = {"osmesa": "OSMesa", "egl": "EGL"}


def platform() -> str:
    """The OpenGL platform this process renders with (from $BINDINGBENCH_GL)."""
    name = os.environ.get(PLATFORM_ENV, "osmesa").strip().lower() or "osmesa"
    if name not in PLATFORMS:
        raise BenchError(f"{PLATFORM_ENV}: unknown OpenGL platform {name!r}; allowed: {', '.join(PLATFORMS)}")
    return name


def check_available() -> None:
    """Fail fast, in one line, when the OpenGL library or a working PyOpenGL is missing.

    Cheap (no context is created), so generators call it while validating their
    config, before any worker starts.
    """
    name = platform()
    if ctypes.util.find_library(_LIBRARY[name]) is None:
        raise BenchError(
            f"renderer: the {_LIBRARY[name]} library (offscreen OpenGL) is not installed; "
            f"install it with: {INSTALL[name]}"
        )
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("PyOpenGL")
    except PackageNotFoundError:
        found = "none"
    parts = tuple(int(p) for p in found.split(".")[:3] if p.isdigit())
    if name == "osmesa" and parts < MIN_PYOPENGL:
        raise BenchError(
            f"renderer: PyOpenGL {found} cannot create OSMesa contexts (need ≥ 3.1.7); "
            "install it with: pip install 'PyOpenGL==3.1.10'"
        )


_PYRENDER: Any = None


def load_pyrender() -> Any:
    """Import pyrender once, on the chosen platform, with the defects above patched."""
    global _PYRENDER
    if _PYRENDER is not None:
        return _PYRENDER
    check_available()
    os.environ["PYOPENGL_PLATFORM"] = platform()
    if multiprocessing.parent_process() is not None:
        # a worker of a process pool: parallelism comes from the workers, and llvmpipe's
        # own rasterizer threads (one per core by default) would only contend with them
        os.environ.setdefault("LP_NUM_THREADS", "0")
    if not hasattr(np, "infty"):
        np.infty = np.inf  # type: ignore[attr-defined]
    if platform() == "osmesa" and importlib.util.find_spec("triton") is not None:
        # OSMesa's llvmpipe loads the system LLVM; triton (shipped with torch's CUDA build, and
        # imported by torch at a process's first optimizer) bundles its own, and loaded after
        # Mesa's it segfaults. Loaded first, both coexist — `bench toys-analysis` renders, then trains.
        import triton  # noqa: F401
    import OpenGL.contextdata

    OpenGL.contextdata.getContext = lambda context=None: 1
    import pyrender
    import pyrender.light
    import pyrender.renderer

    pyrender.light.SHADOW_TEX_SZ = SHADOW_MAP_SIZE
    pyrender.renderer.SHADOW_TEX_SZ = SHADOW_MAP_SIZE
    _PYRENDER = pyrender
    return pyrender


_ORDERED_SCENE: Any = None


def ordered_scene() -> Any:
    """A pyrender Scene whose light and mesh nodes iterate in insertion order.

    Float sums are not associative: with sets, the order of the lights in the shader's
    sum (and of equally distant meshes in the draw list) depends on object addresses,
    so the same scene rendered in two processes could differ by one intensity level.
    """
    global _ORDERED_SCENE
    if _ORDERED_SCENE is None:
        base = load_pyrender().Scene

        class OrderedScene(base):  # type: ignore[misc, valid-type]
            def add_node(self, node: Any, parent_node: Any = None) -> None:
                super().add_node(node, parent_node=parent_node)
                order = self.__dict__.setdefault("_insertion", {})
                order.setdefault(node, len(order))

            def _ordered(self, nodes: Any) -> list:
                return sorted(nodes, key=self.__dict__.get("_insertion", {}).__getitem__)

            @property
            def light_nodes(self) -> list:
                return self._ordered(super().light_nodes)

            @property
            def mesh_nodes(self) -> list:
                return self._ordered(super().mesh_nodes)

        _ORDERED_SCENE = OrderedScene
    return _ORDERED_SCENE
