"""Patch labels for segmentation: each patch's instance and class at the backbone's grid.

A patch's instance is the one covering most of it, background competing as one region
(`evaluators.tasks.issameobject.patch_labels.patch_labels` with no minimum share, so every patch
has a label). Its class is that object's conjunction (`objects[].conj`, the scene code's class:
colour x shape on ColorShape, the object classes of CLEVR, the toys and imported datasets;
ADE20K as imported, its top classes and "other") plus one, background class 0."""

from __future__ import annotations

import numpy as np

from bench.core.dataset import Dataset, decode_mask
from evaluators.tasks.issameobject.patch_labels import patch_labels

BACKGROUND_CLASS = "background"


def class_names(ds: Dataset) -> list[str]:
    """The semantic classes of a dataset, background first, then each conjunction by its values."""
    space = ds.feature_space
    return [BACKGROUND_CLASS, *("-".join(space.conj_names(c)) for c in range(space.n_conjunctions))]


def split_labels(ds: Dataset, split: str, grid: tuple[int, int],
                 limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(instances, classes), each (N, rows * cols) int32 in dataset order, row-major like the spatial
    tokens: the instance id of each patch (0 = background) and its class (0 = background, else
    the object's conjunction + 1; a mask id that names no object counts as background)."""
    instances, classes = [], []
    for batch in ds.iter_batches(split, columns=["mask", "objects"]):
        for m, objects in zip(batch.column("mask").to_pylist(), batch.column("objects").to_pylist()):
            if limit is not None and len(instances) >= limit:
                break
            ids = patch_labels(decode_mask(m), grid, min_share=0.0).ravel()
            lut = np.zeros(max([int(ids.max()), *(int(o["id"]) for o in objects)]) + 1, np.int32)
            for o in objects:
                lut[int(o["id"])] = int(o["conj"]) + 1
            instances.append(ids)
            classes.append(lut[ids])
    if not instances:
        empty = np.zeros((0, grid[0] * grid[1]), np.int32)
        return empty, empty.copy()
    return np.stack(instances).astype(np.int32), np.stack(classes).astype(np.int32)
