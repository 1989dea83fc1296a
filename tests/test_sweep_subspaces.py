"""A study's sweep fits a subspace file once and reads it back on every rerun, but only while the
file is the subspace the study asks for: what its name does not say (the spec behind a backbone's
name, the dataset regenerated under its name, the block's limit) is checked from the file's
metadata, and a file fitted on something else is fitted again, saying why."""

from __future__ import annotations

import numpy as np
import pytest

from bench.core.dataset import Dataset
from bench.studies.spec import BackboneEntry
from bench.studies.sweeps import Interventions, fit_subspaces, stale_because, sweep_plan
from evaluators.interventions.subspace import Subspace, load_subspace, random_basis, save_subspace
from tests.helpers import make_dataset

SWEEP = Interventions(kind="random", layer=1, rank=3, seed=0, kinds=("shuffle",), strengths=(1.0,))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("d") / "sweep", n_train=8, n_val=4, n_test=4, seed=0)


def fitted(spec: str, dataset, limit=None, seed: int = 0, rank: int = 3) -> Subspace:
    """A subspace as `fit_subspace` writes it: its metadata is what staleness reads."""
    ds = Dataset(dataset)
    return Subspace(basis=random_basis(8, rank, seed), mean=np.zeros(8), kind="random", backbone=spec,
                    backbone_revision="w", layer=1, dataset=ds.name, dataset_fingerprint=ds.fingerprint("train"),
                    settings={"rank": rank, "seed": seed, "limit": limit, "dtype": "fp32"})


def sweep_of(spec: str, data, folder):
    return sweep_plan(SWEEP, [BackboneEntry("vit", spec)], "sweep", folder)


def test_a_file_is_stale_by_what_its_name_does_not_say(data, tmp_path):
    fit = sweep_of("random:a", data, tmp_path).fits[0]
    fp = Dataset(data).fingerprint("train")
    meta = fitted("random:a", data).metadata()
    assert stale_because(meta, fit, 3, None, fp) is None
    assert stale_because(meta, fit, 3, None, "f" * 64) == f"train split {fp[:16]} (now {'f' * 16})"
    assert stale_because(fitted("random:b", data, limit=4).metadata(), fit, 3, None, fp) == \
        "backbone random:b (now random:a), limit 4 (now None)"
    assert stale_because(meta, fit, 5, None, fp) == "rank 3 (now 5)"


def test_a_rerun_refits_only_the_file_fitted_on_something_else(data, tmp_path, monkeypatch):
    """The same name on another spec: the file is fitted again (and said); on the spec it was fitted
    on, nothing is fitted."""
    import evaluators.interventions.fit as fitting

    calls = []

    def fake_fit(spec, dataset, layer, *, kind, rank, seed, device, limit, progress):
        calls.append(spec)
        return fitted(spec, dataset.path, limit, seed, rank)

    monkeypatch.setattr(fitting, "fit_subspace", fake_fit)
    said: list[str] = []
    plan = sweep_of("random:a", data, tmp_path)
    save_subspace(fitted("random:a", data), plan.fits[0].path)
    assert fit_subspaces(plan, data, say=said.append) == [] and calls == [] and said == []

    moved = sweep_of("random:b", data, tmp_path)
    assert moved.fits[0].path == plan.fits[0].path  # the name alone cannot tell them apart
    assert fit_subspaces(moved, data, say=said.append) == [moved.fits[0].path] and calls == ["random:b"]
    assert said[0] == f"{moved.fits[0].path.name} was fitted on backbone random:a (now random:b): fitting it again"
    assert load_subspace(moved.fits[0].path).backbone == "random:b"
    assert fit_subspaces(moved, data, say=said.append) == [] and calls == ["random:b"]  # and then it holds
