"""Helpers the tests share, imported as `from tests.helpers import ...`: conftest.py holds only
fixtures and hooks, which pytest finds by itself (a test that imported conftest ran it a second
time, as another module)."""

from __future__ import annotations

from pathlib import Path

from bench import api

#: A small ColorShape scene: 3 colours x 3 shapes, 3 objects of 12 px on a 64 px image, a quarter of
#: the scenes each for validation and test (`make_dataset(path, n_train=..., **TINY_SCENES)`).
TINY_SCENES = dict(image_size=64, n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                   object_size=12, margin=2, val_fraction=0.25, test_fraction=0.25)


def make_dataset(out: Path, generator: str = "colorshape", preset: str | None = "small", **overrides) -> Path:
    """Generate a dataset with the Python API (the function `bench generate` calls), in this process."""
    return api.generate(generator, out=out, preset=preset, overrides=overrides, workers=1)


def spatial_rows(task) -> dict:
    """Rows of 4 tokens x 8 values a scene for a binding task's three splits, the O code in token 1
    through a random map, the rest noise (`RowReader`s of float32: a spatial fit's inputs)."""
    import numpy as np

    from evaluators.fitting import RowReader
    from evaluators.tasks.binding.task import SPLITS

    rng = np.random.default_rng(1)
    out = {}
    for s in SPLITS:
        o = task.codes[s][1].astype(np.float32)
        z = rng.normal(size=(len(o), 4, 8)).astype(np.float32)
        z[:, 1] += o @ rng.normal(size=(o.shape[1], 8)).astype(np.float32)
        out[s] = RowReader(z)
    return out
