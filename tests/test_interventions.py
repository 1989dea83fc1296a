"""Interventions on a subspace (issue 58): identity strengths are bitwise the base at every layer,
a real one changes the hooked layer only inside the subspace (and every later layer), on tiny
Hugging Face, timm and `py:` module backbones; the planted network's binding subspace is found;
every intervention is its own backbone in the row key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from bench import api
from bench.core.dataset import Dataset
from evaluators.backbones import backbone_metadata, resolve_backbone
from evaluators.cache.extract import extract_activations
from evaluators.interventions import Intervention, apply_intervention, principal_angles
from evaluators.interventions.subspace import Subspace, random_basis, save_subspace
from tests.helpers import TINY_SCENES, make_dataset
from tests.planted_binding import PLANTED_SCENES, S_BASIS
from tests.toy_backbones import EVERY_BLOCK, toy_module

transformers.logging.set_verbosity_error()
PLANTED = Path(__file__).with_name("planted_binding.py").resolve()


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> str:
    """A tiny Dinov2 (3 blocks, width 32, 8 px patches of 32 px) saved as a checkpoint folder."""
    path = tmp_path_factory.mktemp("ckpt") / "dinov2"
    torch.manual_seed(0)
    cfg = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=32,
                                    patch_size=8, mlp_ratio=2)
    transformers.Dinov2Model(cfg).eval().save_pretrained(path)
    transformers.BitImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    """A `py:` module backbone (ModuleBackbone: its own hooks collect the hidden states)."""
    path = tmp_path_factory.mktemp("toy") / "toy.py"
    path.write_text(toy_module("[torch.nn.TransformerEncoderLayer(24, 2, 48, batch_first=True) for _ in range(3)]",
                               EVERY_BLOCK))
    return f"py:{path}:make"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "cs", n_train=12, n_val=4, n_test=4, **TINY_SCENES)


def random_subspace(base_spec: str, layer: int, path: Path, dataset: str = "d", fp: str = "f") -> Path:
    """A rank-4 random subspace stated as fitted on `base_spec` at `layer` (no extraction)."""
    base = resolve_backbone(base_spec)
    width = base.info.width
    sub = Subspace(random_basis(width, 4, 0), np.linspace(-1, 1, width), "random", base_spec, base.info.revision,
                   layer, dataset, fp)
    return save_subspace(sub, path)


BASES = ["tiny_hf", "toy", "timm:vit_tiny_patch16_224"]


def base_spec(request, name: str) -> str:
    if name.startswith("timm:"):  # an untrained timm ViT built from its config: no download
        pytest.importorskip("timm")
        return "random:timm:vit_tiny_patch16_224"
    return request.getfixturevalue(name)


@pytest.mark.parametrize("name", BASES)
def test_identity_strengths_are_bitwise_the_base_and_shuffle_stays_in_the_subspace(name, request, tmp_path):
    spec = base_spec(request, name)
    base = resolve_backbone(spec)
    n, side = base.info.n_layers, base.info.input_size
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(0))
    ref = base.hidden_states(x, list(range(n + 1)))
    layer = 1
    sub = random_subspace(spec, layer, tmp_path / "sub.npz")
    p = torch.from_numpy(np.load(sub)["basis"]).double()
    for kind, s in (("shuffle", 0), ("inject", 1), ("remove", 0), ("shuffle", 0.5)):
        iv = resolve_backbone(f"intervene:{kind}={s},layer={layer},subspace={sub}:{spec}")
        labels = torch.ones(2, ref[0].shape[1] - base.info.n_prefix, dtype=torch.int64)
        out = iv.hidden_states((x, [3, 4], labels), list(range(n + 1)))
        if s == (1 if kind == "inject" else 0):
            assert all(torch.equal(a, b) for a, b in zip(out, ref)), kind
            continue
        assert torch.equal(out[0], ref[0])  # before the hooked layer: untouched
        d = (out[layer] - ref[layer]).double()
        assert torch.equal(d[:, : base.info.n_prefix], torch.zeros_like(d[:, : base.info.n_prefix]))
        change = d[:, base.info.n_prefix:]
        outside = change - change @ p @ p.T
        assert change.abs().max() > 1e-2 and outside.abs().max() < 1e-5 * change.abs().max()
        assert all(not torch.equal(a, b) for a, b in zip(out[layer + 1:], ref[layer + 1:]))  # later layers see it


def test_extracted_activations_of_identity_strengths_equal_the_base(tiny_hf, data, tmp_path):
    """Through `extract_activations` (prepare, columns, bind): shuffle 0 and inject 1 store the
    base's bits at every layer; shuffle 0.5 does not."""
    sub = api.fit_subspace(tiny_hf, data, 2, kind="random", rank=4, progress=False)
    path = api.save_subspace(sub, tmp_path / "random.npz")
    ds = Dataset(data)

    def tokens(spec: str) -> list[np.ndarray]:
        acts = extract_activations(spec, ds, "test", layers="all", token_choices=("all",), progress=False)
        return [np.asarray(acts.get(layer, "all")) for layer in acts.layers]

    base = tokens(tiny_hf)
    for kind, s in (("shuffle", 0), ("inject", 1)):
        assert all(np.array_equal(a, b) for a, b in zip(tokens(f"intervene:{kind}={s},layer=2,subspace={path}:{tiny_hf}"),
                                                        base))
    changed = tokens(f"intervene:shuffle=0.5,layer=2,subspace={path}:{tiny_hf}")
    assert [np.array_equal(a, b) for a, b in zip(changed, base)] == [True, True, False, False]


def test_inject_zero_sets_each_object_to_its_mean_and_leaves_background():
    g = torch.Generator().manual_seed(0)
    patches = torch.randn(2, 6, 8, generator=g)
    basis = torch.from_numpy(random_basis(8, 3, 0)).float()
    labels = torch.tensor([[0, 1, 1, 2, 2, -1], [3, 3, 3, 0, 0, 1]])
    before = patches.clone()
    apply_intervention(patches, basis, torch.zeros(8), Intervention("inject", 0.0), [1, 2], labels)
    coords, old = patches @ basis, before @ basis
    for b in range(2):
        for obj in labels[b].unique().tolist():
            sel = labels[b] == obj
            if obj > 0:
                torch.testing.assert_close(coords[b, sel], old[b, sel].mean(0).expand(int(sel.sum()), -1))
            else:
                assert torch.equal(patches[b, sel], before[b, sel])


def test_shuffle_is_seeded_per_image():
    x = torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(1))
    basis = torch.from_numpy(random_basis(8, 2, 0)).float()
    runs = []
    for seed in (5, 5, 6):
        y = x.clone()
        apply_intervention(y, basis, torch.zeros(8), Intervention("shuffle", 1.0), [seed])
        runs.append(y)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_every_intervention_is_its_own_backbone(tiny_hf, tmp_path):
    """The row key (`info.revision`) differs by kind, strength, seed, layer and subspace, identity
    strengths included, and never equals the base's; metadata agrees with the loaded backbone."""
    a, b = random_subspace(tiny_hf, 1, tmp_path / "a.npz"), random_subspace(tiny_hf, 1, tmp_path / "b.npz", fp="g")
    c = random_subspace(tiny_hf, 2, tmp_path / "c.npz")
    specs = [f"intervene:shuffle=0,layer=1,subspace={a}:{tiny_hf}", f"intervene:inject=1,layer=1,subspace={a}:{tiny_hf}",
             f"intervene:shuffle=0.5,layer=1,subspace={a}:{tiny_hf}",
             f"intervene:shuffle=0.5,layer=1,subspace={a},seed=1:{tiny_hf}",
             f"intervene:shuffle=0.5,layer=1,subspace={b}:{tiny_hf}", f"intervene:shuffle=0.5,layer=2,subspace={c}:{tiny_hf}",
             f"intervene:remove=0.5,layer=1,subspace={a}:{tiny_hf}"]
    loaded = [resolve_backbone(s) for s in specs]
    revisions = [bb.info.revision for bb in loaded]
    assert len(set(revisions + [resolve_backbone(tiny_hf).info.revision])) == len(specs) + 1
    assert [backbone_metadata(s).revision for s in specs] == revisions
    assert [bb.info.spec for bb in loaded] == specs
    assert loaded[0].identity()["intervention"]["kind"] == "shuffle"
    assert api.parse_intervention(specs[3]).seed == 1 and api.parse_intervention(specs[3]).base == tiny_hf


@pytest.mark.slow
def test_planted_binding_subspace_is_recovered(tmp_path):
    """Probe rank 4 at the hidden state block 2 writes (3): all four principal-angle cosines
    with S are ≥ 0.9; the S-zeroed twin is another backbone."""
    ds = make_dataset(tmp_path / "planted", n_train=40, n_val=12, n_test=12, **PLANTED_SCENES)
    sub = api.fit_subspace(f"py:{PLANTED}:planted", ds, 3, kind="binding", rank=4, progress=False)
    cosines = principal_angles(sub, S_BASIS)
    assert len(cosines) == 4 and cosines.min() >= 0.9, cosines
    assert principal_angles(random_basis(128, 4, 0), S_BASIS).max() < 0.9  # a random one is not
    zeroed = resolve_backbone(f"py:{PLANTED}:planted_zeroed")
    assert zeroed.info.revision != resolve_backbone(f"py:{PLANTED}:planted").info.revision


@pytest.mark.slow
def test_planted_binding_interventions_on_instance_segmentation(tmp_path):
    """The planted network's instance segmentation (its last hidden state) under interventions at
    hidden state 3: removing or shuffling all of S reads within 2 points of the S-zeroed twin; a
    random subspace of the fitted one's rank leaves it inside the base's interval; injecting the
    objects' means (α = 0) does not lower it; the fitted subspace takes most of it away.

    Measured (80/30/40 scenes): base 0.969 [0.948, 0.987], zeroed twin 0.031, remove 1 of S 0.031,
    shuffle 1 of S 0.038, random remove 1 0.963, inject 0 0.988; remove 1 of the fitted subspace
    (cosines with S 0.99 … 0.96) 0.23: the small part of S outside it is still read."""
    from evaluators.tasks.segmentation.run import evaluate_segmentation

    ds = make_dataset(tmp_path / "planted", n_train=80, n_val=30, n_test=40, **PLANTED_SCENES)
    base = f"py:{PLANTED}:planted"
    fitted = api.fit_subspace(base, ds, 3, kind="binding", rank=4, progress=False)
    files = {"fitted": fitted,
             "S": dataclasses.replace(fitted, basis=S_BASIS.astype(np.float64)),
             "random": api.fit_subspace(base, ds, 3, kind="random", rank=fitted.rank, progress=False)}
    paths = {name: save_subspace(sub, tmp_path / f"{name}.npz") for name, sub in files.items()}

    def instance(spec: str) -> tuple[float, float, float]:
        row = evaluate_segmentation(spec, ds, heads=("instance",), progress=False)[0]
        return row["instance_miou"], row["instance_miou_lo"], row["instance_miou_hi"]

    def intervened(kind: str, subspace: str) -> str:
        return f"intervene:{kind},layer=3,subspace={paths[subspace]}:{base}"

    value, lo, hi = instance(base)
    zeroed = instance(f"py:{PLANTED}:planted_zeroed")[0]
    assert value - zeroed > 0.5, (value, zeroed)  # the base reads instances through S
    for kind in ("remove=1", "shuffle=1"):
        assert abs(instance(intervened(kind, "S"))[0] - zeroed) <= 0.02, kind
    assert lo <= instance(intervened("remove=1", "random"))[0] <= hi
    assert instance(intervened("inject=0", "fitted"))[0] >= value
    assert instance(intervened("remove=1", "fitted"))[0] < zeroed + 0.5 * (value - zeroed)
