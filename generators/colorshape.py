"""ColorShape: flat coloured shapes on a white canvas (docs/explanation/architecture.md §1, paper setups).

Each object is painted into the image and the instance mask through the same
boolean stencil, so image, mask and objects list agree pixel for pixel by construction.
Shapes are drawn without anti-aliasing: every object pixel has exactly its colour.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from bench.core.codes import FeatureSpace
from bench.core.dataset import Scene
from bench.core.errors import ConfigError
from generators.base import CommonConfig, SceneGenerator, SplitPlan, plan_splits, register_generator
from generators.priors import CoveringSets, balanced_priors, coverage_count, omega_size, uniform_priors
from generators.sampling import check_object_range, sample_covering_cells, sample_uniform_objects
from generators.splits import FCode, active_counts, fcode_key, fcodes_exact, fcodes_feasible

#: The paper's palette, in order (RGB).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 20, 60),
    "blue": (30, 144, 255),
    "green": (34, 139, 34),
    "yellow": (255, 215, 0),
    "purple": (138, 43, 226),
    "orange": (255, 140, 0),
    "cyan": (0, 206, 209),
    "gray": (128, 128, 128),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "pentagon", "hexagon", "cross", "star")
BACKGROUND = (255, 255, 255)
#: Flat colours: images are palette PNGs, index 0 the background, index k+1 colour k.
_PNG_PALETTE = np.array([BACKGROUND, *PALETTE.values()], dtype=np.uint8)
#: Supersampling factor for drawing stencils (then thresholded: no blending).
_SS = 8


@dataclass
class ColorShapeConfig(CommonConfig):
    #: `uniform`: O uniform over all codes with min..max objects; `balanced`: exact c colours, s shapes, n objects.
    distribution: str = "balanced"
    n_colors: int = 8
    n_shapes: int = 8
    colors_per_scene: int = 6
    shapes_per_scene: int = 6
    n_objects: int = 18
    min_objects: int = 1
    max_objects: int = 16
    object_size: int = 16
    margin: int = 4
    #: `none`: boxes keep `margin` apart; `allow`: boxes may overlap (later objects on top).
    overlap: str = "none"
    #: complexity sweep: one balanced dataset per n with n colours, n shapes, n objects.
    sweep: tuple[int, ...] = ()


def fit_capacity(image_size: int, object_size: int, margin: int) -> int:
    """Objects that fit without overlap: the margin-spaced grid packing (a guaranteed bound)."""
    per_side = (image_size - margin) // (object_size + margin)
    return max(per_side, 0) ** 2


@lru_cache(maxsize=None)
def stencil(shape: str, size: int) -> np.ndarray:
    """Boolean size x size footprint of a shape (drawn supersampled, thresholded at 1/2)."""
    s = size * _SS
    im = Image.new("L", (s, s), 0)
    d = ImageDraw.Draw(im)
    c = (s - 1) / 2
    r = s / 2
    if shape == "circle":
        d.ellipse([0, 0, s - 1, s - 1], fill=255)
    elif shape == "square":
        d.rectangle([0, 0, s - 1, s - 1], fill=255)
    elif shape == "triangle":
        d.polygon([(c, 0), (s - 1, s - 1), (0, s - 1)], fill=255)
    elif shape == "diamond":
        d.polygon([(c, 0), (s - 1, c), (c, s - 1), (0, c)], fill=255)
    elif shape in ("pentagon", "hexagon"):
        n = 5 if shape == "pentagon" else 6
        d.polygon([(c + r * math.sin(2 * math.pi * i / n), c - r * math.cos(2 * math.pi * i / n)) for i in range(n)], fill=255)
    elif shape == "cross":
        w = s / 3
        d.rectangle([w, 0, s - 1 - w, s - 1], fill=255)
        d.rectangle([0, w, s - 1, s - 1 - w], fill=255)
    elif shape == "star":
        pts = []
        for i in range(10):
            rad = r if i % 2 == 0 else r * 0.45
            a = math.pi * i / 5
            pts.append((c + rad * math.sin(a), c - rad * math.cos(a)))
        d.polygon(pts, fill=255)
    else:
        raise ConfigError("shape", f"unknown {shape!r}; allowed: {', '.join(SHAPES)}")
    small = np.asarray(im, dtype=np.float32).reshape(size, _SS, size, _SS).mean(axis=(1, 3))
    return small >= 127.5


@lru_cache(maxsize=None)
def stencil_area(shape: str, size: int) -> int:
    """Pixels of a shape drawn alone: an object's `full_px`."""
    return int(stencil(shape, size).sum())


@register_generator
class ColorShapeGenerator(SceneGenerator):
    name = "colorshape"
    version = "1.0"
    description = "2D coloured shapes on white (the papers' ColorShape / BalancedColorShape)"
    config_cls = ColorShapeConfig
    default_preset = "balanced"
    presets = {
        "balanced": dict(distribution="balanced", n_train=39_200, n_val=9_800, n_test=9_800),
        "uniform": dict(distribution="uniform", n_colors=7, n_shapes=7, min_objects=1, max_objects=16,
                        n_train=39_200, n_val=9_800, n_test=9_800),
        "complexity-sweep": dict(distribution="balanced", sweep=(1, 2, 3, 4, 5, 6, 7),
                                 n_train=5_000, n_val=1_000, n_test=1_000),
        "small": dict(distribution="balanced", n_train=2_000, n_val=500, n_test=500),
        # the backbone zoo's scenes (evaluators/zoo/recipes.py says why): two 32-px objects, two
        # colours and two shapes, so O given F is exactly one bit: which colour goes with which shape
        "zoo": dict(distribution="balanced", image_size=128, object_size=32, colors_per_scene=2,
                    shapes_per_scene=2, n_objects=2, n_train=2_000, n_val=200, n_test=200),
    }
    config: ColorShapeConfig

    @classmethod
    def render_bytes(cls, config: ColorShapeConfig) -> int:
        """The image and mask, plus a shape's stencil: drawn `_SS` times larger as 8-bit pixels
        and averaged down as float32, both held at once."""
        return super().render_bytes(config) + (_SS * config.object_size) ** 2 * (1 + 4)

    @classmethod
    def expand(cls, config: ColorShapeConfig) -> list[tuple[str, CommonConfig]]:
        if not config.sweep:
            return [("", config)]
        if any(n < 1 for n in config.sweep):
            raise ConfigError("sweep", f"objects per scene must be ≥ 1, got {list(config.sweep)}")
        return [
            (f"n{n}", replace(config, sweep=(), distribution="balanced", colors_per_scene=n, shapes_per_scene=n, n_objects=n))
            for n in config.sweep
        ]

    # -- configuration -------------------------------------------------------------------
    def validate(self) -> None:
        c = self.config
        if c.distribution not in ("uniform", "balanced"):
            raise ConfigError("distribution", f"unknown {c.distribution!r}; allowed: uniform, balanced")
        if c.overlap not in ("none", "allow"):
            raise ConfigError("overlap", f"unknown {c.overlap!r}; allowed: none, allow")
        if not 1 <= c.n_colors <= len(PALETTE):
            raise ConfigError("n_colors", f"must be 1..{len(PALETTE)} (the palette), got {c.n_colors}")
        if not 1 <= c.n_shapes <= len(SHAPES):
            raise ConfigError("n_shapes", f"must be 1..{len(SHAPES)}, got {c.n_shapes}")
        if c.object_size <= 0:
            raise ConfigError("object_size", f"must be > 0, got {c.object_size}")
        if c.margin < 0:
            raise ConfigError("margin", f"must be ≥ 0, got {c.margin}")
        if c.object_size + 2 * c.margin > c.image_size:
            raise ConfigError("object_size", f"{c.object_size} px plus margins does not fit a {c.image_size} px image")
        n_conj = c.n_colors * c.n_shapes
        if c.distribution == "balanced":
            if not 1 <= c.colors_per_scene <= c.n_colors:
                raise ConfigError("colors_per_scene", f"must be 1..n_colors={c.n_colors}, got {c.colors_per_scene}")
            if not 1 <= c.shapes_per_scene <= c.n_shapes:
                raise ConfigError("shapes_per_scene", f"must be 1..n_shapes={c.n_shapes}, got {c.shapes_per_scene}")
            lo, hi = max(c.colors_per_scene, c.shapes_per_scene), c.colors_per_scene * c.shapes_per_scene
            if not lo <= c.n_objects <= hi:
                raise ConfigError("n_objects", f"{c.n_objects} cannot cover {c.colors_per_scene} colours x "
                                  f"{c.shapes_per_scene} shapes with distinct conjunctions; allowed {lo}..{hi}")
            most = c.n_objects
        else:
            check_object_range(c.min_objects, c.max_objects, n_conj)
            most = c.max_objects
        if most > 255:
            raise ConfigError("max_objects" if c.distribution == "uniform" else "n_objects", "at most 255 objects (uint8 masks)")
        cap = fit_capacity(c.image_size, c.object_size, c.margin)
        if c.overlap == "none" and most > cap:
            param = "max_objects" if c.distribution == "uniform" else "n_objects"
            raise ConfigError(param, f"{most} objects of {c.object_size} px with {c.margin} px margin do not fit "
                              f"a {c.image_size} px image (at most {cap}); use overlap=allow or smaller objects")

    def build_feature_space(self) -> FeatureSpace:
        c = self.config
        return FeatureSpace.of([("color", list(PALETTE)[: c.n_colors]), ("shape", SHAPES[: c.n_shapes])])

    # -- splits and priors ---------------------------------------------------------------
    def plan(self) -> dict[str, SplitPlan]:
        c = self.config
        sizes = (c.n_colors, c.n_shapes)
        if c.distribution == "balanced":
            codes = fcodes_exact(sizes, (c.colors_per_scene, c.shapes_per_scene))
            return plan_splits(c, codes, sizes, lambda split_codes: balanced_priors(
                len(split_codes), (c.colors_per_scene, c.shapes_per_scene), c.n_objects))
        codes = fcodes_feasible(sizes, lambda a: omega_size(a, c.min_objects, c.max_objects) > 0)
        plans = plan_splits(c, codes, sizes, lambda split_codes: uniform_priors(
            [active_counts(f) for f in split_codes], c.min_objects, c.max_objects))
        self._uniform_support = {split: {fcode_key(f) for f in p.codes} for split, p in plans.items()}
        return plans

    def sample_conjunctions(self, rng: random.Random, split: str) -> tuple[list[int], FCode]:
        """Draw an object code (list of conjunction ids) from the split's distribution."""
        c = self.config
        if c.distribution == "balanced":
            code = self.plans[split].codes[rng.randrange(len(self.plans[split].codes))]
            cells = sample_covering_cells(rng, (len(code[0]), len(code[1])), c.n_objects)
            return [code[0][i] * c.n_shapes + code[1][j] for i, j in cells], code
        return sample_uniform_objects(rng, c.n_colors * c.n_shapes, c.min_objects, c.max_objects,
                                      lambda x: divmod(x, c.n_shapes), 2, self._uniform_support[split])

    def f_support(self, split: str) -> list[tuple[FCode, int]]:
        """`balanced`: F uniform over the split's codes; `uniform`: P(f) ∝ |Ω(f)|."""
        codes = self.plans[split].codes
        if self.config.distribution == "balanced":
            return [(f, 1) for f in codes]
        return [(f, self._omega(active_counts(f))) for f in codes]

    def o_given_f(self) -> CoveringSets:
        c = self.config
        if c.distribution == "balanced":
            return CoveringSets(c.n_objects, c.n_objects)
        return CoveringSets(c.min_objects, c.max_objects)

    def layout(self, rng: random.Random, n: int) -> list[tuple[int, int]]:
        """Top-left corners for n boxes: rejection sampling, then a jittered grid as fallback."""
        c = self.config
        s, m, w = c.object_size, c.margin, c.image_size
        lo, hi = m, w - m - s
        if c.overlap == "allow":
            return [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]
        gap = s + m
        for _attempt in range(20):
            boxes: list[tuple[int, int]] = []
            for _ in range(n):
                for _try in range(200):
                    x, y = rng.randint(lo, hi), rng.randint(lo, hi)
                    if all(abs(x - bx) >= gap or abs(y - by) >= gap for bx, by in boxes):
                        boxes.append((x, y))
                        break
                else:
                    break
            if len(boxes) == n:
                return boxes
        per_side = (w - m) // gap
        slots = rng.sample(range(per_side * per_side), n)
        return [(m + (i % per_side) * gap, m + (i // per_side) * gap) for i in slots]

    def render(self, split: str, index: int, seed: int) -> tuple[Scene, float]:
        c = self.config
        rng = random.Random(seed)
        conjs, code = self.sample_conjunctions(rng, split)
        rng.shuffle(conjs)
        corners = self.layout(rng, len(conjs))
        size = c.object_size
        mask = np.zeros((c.image_size, c.image_size), dtype=np.uint8)
        image = np.zeros((c.image_size, c.image_size), dtype=np.uint8)  # indices into _PNG_PALETTE
        for i, (conj, (x, y)) in enumerate(zip(conjs, corners), start=1):
            color, shape = divmod(conj, c.n_shapes)
            st = stencil(SHAPES[shape], size)
            mask[y : y + size, x : x + size][st] = i
            image[y : y + size, x : x + size][st] = color + 1
        full_px = [stencil_area(SHAPES[conj % c.n_shapes], size) for conj in conjs]
        if c.overlap == "allow":  # later objects may cover earlier ones
            visible = np.bincount(mask.ravel(), minlength=len(conjs) + 1)[1:].tolist()
        else:
            visible = full_px
        objects = []
        for i, (conj, (x, y), full, vis) in enumerate(zip(conjs, corners, full_px, visible), start=1):
            objects.append({
                "id": i, "conj": conj, "bbox": [x, y, x + size, y + size],
                "visible_px": int(vis), "full_px": full, "visibility": vis / full,
            })
        omega = self._omega(active_counts(code))
        return Scene(image=image, mask=mask, objects=objects, palette=_PNG_PALETTE), math.log2(omega)

    def _omega(self, a: tuple[int, ...]) -> int:
        c = self.config
        if c.distribution == "balanced":
            return coverage_count(c.n_objects, a)
        return omega_size(a, c.min_objects, c.max_objects)
