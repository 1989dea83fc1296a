"""`toys`: IsSameObject scenes of two identical cars, a car of another make and a boat (the
models are generators.meshes', the stage generators.scene3d's)."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import pyarrow as pa

from bench.core.codes import FeatureSpace
from bench.core.errors import BenchError, ConfigError
from generators import render3d
from generators.base import SplitPlan, register_generator
from generators.meshes import CLEVR_COLORS, TOY_CATEGORIES, toy_parts, toy_radius, unit_rgb
from generators.priors import ListedSets, priors_from_counts
from generators.scene3d import OBJECT_FIELDS_3D, SCENE_FIELDS_3D, Layout, Scene3DConfig, Scene3DGenerator, check_packing
from generators.splits import FCode


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
    are for pairwise analyses (evaluators/tasks/issameobject/toy_analysis.py labels patch pairs from the
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
