"""`clevr`: CLEVR-style 3D scenes of colour x shape (x material x size) conjunctions, with
occlusion sweeps (one dataset per camera height, same layouts); the stage is generators.scene3d's."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pyarrow as pa

from bench.core.codes import FeatureSpace
from bench.core.errors import ConfigError
from generators import render3d
from generators.base import SplitPlan, plan_splits, register_generator
from generators.meshes import CLEVR_COLORS, CLEVR_SHAPES, clevr_geometry, unit_rgb
from generators.priors import CoveringSets, omega_size, uniform_priors
from generators.render3d import Part
from generators.sampling import check_object_range, sample_uniform_objects
from generators.scene3d import OBJECT_FIELDS_3D, SCENE_FIELDS_3D, Layout, Scene3DConfig, Scene3DGenerator, check_packing
from generators.splits import FCode, active_counts, fcode_key, fcodes_feasible

#: (metallic, roughness) of CLEVR's two materials.
MATERIALS: dict[str, tuple[float, float]] = {"rubber": (0.0, 0.9), "metal": (0.8, 0.3)}
#: CLEVR object scales: the radius of the footprint's bounding circle.
SIZES: dict[str, float] = {"small": 0.35, "large": 0.7}


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
