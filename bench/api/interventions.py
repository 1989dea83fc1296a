"""Interventions on the binding subspace (issue 58): fit a subspace of a backbone's layer to a
`.npz`, compare two by their principal angles, and read an `intervene:` spec. The fitted file
names an intervened backbone (`intervene:shuffle=0.5,layer=L,subspace=FILE:<base>`), which every
task evaluates as it does any backbone. Heavy modules (torch) load inside the functions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.core.errors import BenchError

if TYPE_CHECKING:
    import numpy as np

    from bench.core.intervention_specs import InterventionSpec
    from evaluators.interventions.subspace import Subspace

__all__ = ["fit_subspace", "load_subspace", "parse_intervention", "principal_angles", "save_subspace",
           "subspace_angles", "write_subspace"]


def fit_subspace(spec_or_backbone: Any, dataset: str | os.PathLike[str], layer: int, **options: Any) -> "Subspace":
    """`evaluators.interventions.fit.fit_subspace`: one subspace of hidden state `layer`
    (kind, rank, energy, seed, device, dtype, limit, progress as keywords)."""
    from evaluators.interventions.fit import fit_subspace as fit

    return fit(spec_or_backbone, dataset, layer, **options)


def load_subspace(path: str | os.PathLike[str]) -> "Subspace":
    """A subspace file `save_subspace` (or `bench subspace`) wrote."""
    from evaluators.interventions.subspace import load_subspace as load

    return load(path)


def save_subspace(sub: "Subspace", path: str | os.PathLike[str]) -> Path:
    """Write a subspace to one `.npz`, atomically."""
    from evaluators.interventions.subspace import save_subspace as save

    return save(sub, path)


def principal_angles(a: Any, b: Any) -> "np.ndarray":
    """Cosines of the principal angles between two subspaces (Subspaces or bases), descending."""
    from evaluators.interventions.subspace import principal_angles as angles

    return angles(a, b)


def parse_intervention(spec: str) -> "InterventionSpec":
    """The parts of an `intervene:` spec (kind, strength, layer, subspace path, seed, base)."""
    from bench.core.intervention_specs import parse_intervention as parse

    return parse(spec)


def subspace_angles(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> "np.ndarray":
    """The principal-angle cosines between two subspace files."""
    return principal_angles(load_subspace(a), load_subspace(b))


def write_subspace(dataset: str | os.PathLike[str], *, model: str, layer: int, out: str | os.PathLike[str],
                   overwrite: bool = False, **options: Any) -> "Subspace":
    """Fit a subspace and write it to `out` (`bench subspace`). Checked before any work: an
    existing `out` is replaced only when it is a subspace file and `overwrite` is set (a file
    that is no subspace is never replaced), and the model must have the layer."""
    from evaluators.interventions.subspace import load_subspace as load

    target = Path(out).expanduser()
    if target.exists():
        try:
            load(target)
        except BenchError:
            raise BenchError(f"out: {target} exists and is not a subspace file; it is left alone") from None
        if not overwrite:
            raise BenchError(f"out: {target} exists; pass --overwrite to replace it")
    if target.suffix != ".npz":
        raise BenchError(f"out: {target} must end in .npz")
    folder = next((p for p in target.parents if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK):  # said before the fit, not after it
        raise BenchError(f"out: cannot write {target}: {folder} is not a writable folder")
    sub = fit_subspace(model, dataset, layer, **options)
    save_subspace(sub, target)
    return sub
