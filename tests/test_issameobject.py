"""IsSameObject: pair sampling, symmetric scorers, metrics against hand-computed values,
and end to end on oracle-style patch tokens (per-patch attribute one-hots)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from bench.core.results import make_table
from evaluators.backbones.base import AttentionQK
from evaluators.probes.families import ISSAMEOBJECT_PROBES
from evaluators.tasks.issameobject.pairs import PairConfig, Pairs, sample_pairs
from evaluators.tasks.issameobject.scorers import PairTrainConfig, attention_qk_scores, build_probe, fit_bias, fit_scorer
from evaluators.tasks.issameobject.attention import attention_correlation, pair_attention, permutation_correlation
from evaluators.tasks.issameobject.evaluate import evaluate_activations, layer_data
from evaluators.tasks.issameobject.metrics import pair_metrics, weighted_auroc
from evaluators.tasks.issameobject.patch_labels import IGNORE, split_patch_labels
from tests.helpers import make_dataset

# ---------------------------------------------------------------- pairs


def test_balanced_sampling_takes_a_quarter_of_each_pair_kind():
    labels = np.array([[0, 0, 1, 1, 1, 2, IGNORE, 0], [3, 3, 3, 3, 3, 3, 3, 3]])
    pairs = sample_pairs(labels, PairConfig(pairs_per_image=8), seed=0)
    first = pairs.image == 0
    a, b = labels[0, pairs.i[first]], labels[0, pairs.j[first]]
    kinds = [(x == y and x > 0, x == y == 0, x != y and x > 0 and y > 0, (x == 0) != (y == 0)) for x, y in zip(a, b)]
    assert np.sum(kinds, axis=0).tolist() == [2, 2, 2, 2]  # same object, bg-bg, two objects, object-bg
    # the one-object image has only same-object pairs: it contributes its quota of them
    assert (pairs.image == 1).sum() == 2 and pairs.same[pairs.image == 1].all()
    assert np.all(pairs.i < pairs.j)
    assert np.all(pairs.same == (labels[pairs.image, pairs.i] == labels[pairs.image, pairs.j]))
    assert IGNORE not in labels[pairs.image, pairs.i] and IGNORE not in labels[pairs.image, pairs.j]
    assert len({(a, b, c) for a, b, c in zip(pairs.image, pairs.i, pairs.j)}) == len(pairs)  # no duplicates


def test_exclude_background_and_natural_sampling():
    labels = np.array([[0, 0, 0, 1, 1, 2]])
    no_bg = sample_pairs(labels, PairConfig(pairs_per_image=100, exclude_background=True), seed=1)
    assert set(labels[0, no_bg.i]) | set(labels[0, no_bg.j]) <= {1, 2}
    assert (no_bg.same.sum(), (~no_bg.same).sum()) == (1, 2)  # (3,4) same; (3,5), (4,5) different
    few = sample_pairs(np.array([[1, 1, 1, 1, 2, 2]]), PairConfig(pairs_per_image=4, exclude_background=True), seed=0)
    assert (few.same.sum(), (~few.same).sum()) == (2, 2)  # half each of the two object kinds
    natural = sample_pairs(labels, PairConfig(pairs_per_image=100, sampling="natural"), seed=1)
    assert len(natural) == 15 and natural.same.sum() == 3 + 1  # all C(6,2) pairs; bg-bg 3, (3,4)
    again = sample_pairs(labels, PairConfig(pairs_per_image=4, sampling="natural"), seed=1)
    assert len(again) == 4
    with pytest.raises(BenchError, match="sampling"):
        sample_pairs(labels, PairConfig(sampling="stratified"), seed=0)


# ---------------------------------------------------------------- scorers


@pytest.mark.parametrize("name", ["linear", "diag-quadratic", "quadratic", "pointwise-identity"])
def test_trained_probe_forms_are_symmetric(name):
    torch.manual_seed(0)
    probe = build_probe(name, 12, PairTrainConfig(rank=4, slots=5))
    with torch.no_grad():
        for p in probe.parameters():  # random, non-trivial weights (zero init would be trivially symmetric)
            p.copy_(torch.randn_like(p))
        x, y = torch.randn(50, 12), torch.randn(50, 12)
        a, b = probe(x, y), probe(y, x)
    assert a.std() > 0.1
    torch.testing.assert_close(a, b)


def test_quadratic_matches_its_matrix():
    torch.manual_seed(1)
    probe = build_probe("quadratic", 6, PairTrainConfig(rank=3))
    w = (probe.u.T @ probe.v + probe.v.T @ probe.u) / 2  # (UᵀV + VᵀU)/2 in D x D
    x, y = torch.randn(8, 6), torch.randn(8, 6)
    with torch.no_grad():
        probe.w.copy_(torch.randn(6))
    expected = torch.einsum("bi,ij,bj->b", x, w, y) + (x + y) @ probe.w + probe.b
    torch.testing.assert_close(probe(x, y), expected)
    assert torch.linalg.matrix_rank(w.detach()) <= 6


def _toy_split(rng, protos, n_img=30, t=12, d=6):
    """Tokens = object prototype + noise: same-object pairs share a prototype."""
    labels = rng.integers(0, 5, size=(n_img, t))
    tokens = protos[labels] + rng.normal(size=(n_img, t, d)) * 0.3
    return tokens.astype(np.float16), labels


@pytest.mark.parametrize("name", ISSAMEOBJECT_PROBES.names())
def test_fitted_scorers_are_symmetric_and_learn(name):
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(5, 6)) * 3
    data = {}
    for split in ("train", "val", "test"):
        tokens, labels = _toy_split(rng, protos)
        pairs = sample_pairs(labels, PairConfig(pairs_per_image=20), seed=3)
        data[split] = layer_data(tokens, pairs)
    qk = random_qk(6, heads=2) if name == "attention-qk" else None
    scorer = fit_scorer(name, data["train"], data["val"], PairTrainConfig(epochs=15, batch_size=64, lr=2e-2, rank=4, slots=8),
                        qk=qk)
    u, ix, iy, same = data["test"]
    s_xy, s_yx = scorer.score(u[ix], u[iy]), scorer.score(u[iy], u[ix])
    np.testing.assert_allclose(s_xy, s_yx, rtol=1e-5, atol=1e-6)
    assert np.all((s_xy >= 0) & (s_xy <= 1))
    acc = np.mean((s_xy >= 0.5) == same)
    if name in ("diag-quadratic", "quadratic", "pointwise-identity", "dot", "cosine", "distance"):
        assert acc > 0.8, acc  # prototypes far apart: similarity alone separates the pairs
    if name == "linear":
        assert acc < 0.65, acc  # w·(x + y) sees the pair's sum, not whether its halves agree
    if name == "majority":
        assert len(set(s_xy.tolist())) == 1


def random_qk(d: int, heads: int, seed: int = 0) -> AttentionQK:
    """A block's norm and q/k projections with random, non-trivial weights and biases."""
    torch.manual_seed(seed)
    norm, q, k = torch.nn.LayerNorm(d), torch.nn.Linear(d, d), torch.nn.Linear(d, d)
    with torch.no_grad():
        for p in (*norm.parameters(), *q.parameters(), *k.parameters()):
            p.copy_(torch.randn_like(p))
    return AttentionQK(norm, q, k, heads)


def test_attention_qk_is_symmetric_and_matches_its_formula():
    qk = random_qk(8, heads=2, seed=3)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 8)).astype(np.float32), rng.normal(size=(40, 8)).astype(np.float32)
    s_xy, s_yx = attention_qk_scores(qk, x, y), attention_qk_scores(qk, y, x)
    assert s_xy.std() > 0.1
    np.testing.assert_allclose(s_xy, s_yx, rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # by hand: per head h, (q_h(n(x))·k_h(n(y)) + q_h(n(y))·k_h(n(x))) / 2 / sqrt(4), averaged
        nx, ny = qk.norm(torch.from_numpy(x)), qk.norm(torch.from_numpy(y))
        qx, kx, qy, ky = (m(n).reshape(40, 2, 4) for m, n in ((qk.query, nx), (qk.key, nx), (qk.query, ny), (qk.key, ny)))
        expected = (((qx * ky).sum(-1) + (qy * kx).sum(-1)) / 2 / 2.0).mean(-1)
    np.testing.assert_allclose(s_xy, expected.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- metrics


def test_pair_metrics_hand_computed():
    scores = np.array([0.9, 0.8, 0.3, 0.6, 0.2])
    same = np.array([True, False, True, False, False])
    m = pair_metrics(scores, same, np.arange(5), majority=False, n_boot=200)
    # predictions 1 1 0 1 0: one TP, one TN -> 2/5; TPR 1/2, TNR 1/3
    assert m["accuracy"] == pytest.approx(0.4)
    assert m["balanced_accuracy"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    # positives 0.9 beats 3 negatives, 0.3 beats 1 -> 4 of 6
    assert m["auroc"] == pytest.approx(4 / 6)
    assert m["majority_accuracy"] == pytest.approx(3 / 5)
    for k in ("accuracy", "balanced_accuracy", "auroc", "majority_accuracy"):
        assert m[f"{k}_lo"] <= m[k] <= m[f"{k}_hi"]
    assert m["accuracy_hi"] - m["accuracy_lo"] > 0.2  # five pairs: a wide interval


def test_auroc_ties_and_weights_match_brute_force():
    assert weighted_auroc(np.array([0.5, 0.5]), np.array([True, False]), np.ones(2)) == pytest.approx(0.5)
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 40).astype(float)  # many ties
    same = rng.random(40) < 0.4
    w = rng.integers(0, 3, size=(3, 40)).astype(float)
    for b in range(3):
        num = den = 0.0
        for p, q in itertools.product(np.flatnonzero(same), np.flatnonzero(~same)):
            pair = w[b, p] * w[b, q]
            num += pair * ((scores[p] > scores[q]) + 0.5 * (scores[p] == scores[q]))
            den += pair
        assert weighted_auroc(scores, same, w)[b] == pytest.approx(num / den)


def test_baseline_bias_is_the_maximum_likelihood_threshold():
    rng = np.random.default_rng(0)
    z = rng.normal(size=20_000)
    same = rng.random(20_000) < 1 / (1 + np.exp(-(z - 1.0)))  # true bias -1
    assert fit_bias(z, same) == pytest.approx(-1.0, abs=0.05)
    # separable and saturating (Newton from 0 diverges here): the threshold falls between the classes
    b = fit_bias(np.array([500.0, 510, 520, 530]), np.array([False, False, True, True]))
    assert 510 < -b < 520


def test_a_baseline_whose_similarities_overflow_fails_naming_inf():
    """Finite tokens whose dot products overflow: the bias fit raised scipy's ValueError
    `Optimization bounds must be finite scalars`, which no layer's row caught."""
    u = np.array([[1e200, 0.0], [1e200, 0.0], [0.0, 1.0], [0.0, 2.0]])
    pairs = (u, np.array([0, 2, 0]), np.array([1, 3, 2]), np.array([True, True, False]))
    with pytest.raises(FloatingPointError, match="dot similarities of the training pairs hold NaN or inf"):
        fit_scorer("dot", pairs, pairs)


def test_bootstrap_resamples_images_not_pairs():
    # two images: one all correct, one all wrong -> accuracy intervals reach 0 and 1 exactly
    scores = np.array([0.9] * 10 + [0.9] * 10)
    same = np.array([True] * 10 + [False] * 10)
    m = pair_metrics(scores, same, np.repeat([7, 9], 10), majority=True, n_boot=400, seed=1)
    assert m["accuracy"] == 0.5 and m["accuracy_lo"] == 0.0 and m["accuracy_hi"] == 1.0
    assert m["auroc"] == 0.5 and m["majority_accuracy"] == 0.5


# ---------------------------------------------------------------- end to end on oracle-style tokens


@dataclass
class FakeInfo:
    spec: str = "fake:patches"
    family: str = "oracle"
    revision: str = "test"
    n_layers: int = 1


class FakeActivations:
    """The extraction contract's shape: `.get(layer, "all")` -> (N, T, D) row-major over `.grid`."""

    def __init__(self, per_layer: dict[int, np.ndarray], grid: tuple[int, int]) -> None:
        self.info, self.layers, self.grid = FakeInfo(), sorted(per_layer), grid
        self.n = len(next(iter(per_layer.values())))
        self._per_layer = per_layer

    def get(self, layer: int, tokens: str) -> np.ndarray:
        assert tokens == "all"
        return self._per_layer[layer]


def oracle_patch_tokens(ds: Dataset, split: str, grid: tuple[int, int]) -> np.ndarray:
    """Per-patch attribute one-hots of the labelled object (zeros for background), as oracle:patches."""
    onehots = ds.feature_space.conj_to_feature.astype(np.float16)
    labels = split_patch_labels(ds, split, grid, min_share=0.0)
    objects = ds.table(split, ["objects"])["objects"].to_pylist()
    out = np.zeros((*labels.shape, onehots.shape[1]), np.float16)
    for n, objs in enumerate(objects):
        for o in objs:
            out[n, labels[n] == o["id"]] = onehots[o["conj"]]
    return out


@pytest.fixture(scope="module")
def big_objects(tmp_path_factory) -> Path:
    """ColorShape with 48 px objects: each spans several 16 px patches, so same-object pairs exist."""
    return make_dataset(tmp_path_factory.mktemp("data") / "big", n_train=120, n_val=30, n_test=30,
                        colors_per_scene=3, shapes_per_scene=3, n_objects=6, object_size=48)


@pytest.fixture(scope="module")
def oracle_acts(big_objects):
    ds = Dataset(big_objects)
    grid = (16, 16)
    rng = np.random.default_rng(0)
    acts = {}
    for split in ("train", "val", "test"):
        oracle = oracle_patch_tokens(ds, split, grid)
        noise = rng.normal(size=oracle.shape).astype(np.float16)
        acts[split] = FakeActivations({0: noise, 1: oracle}, grid)
    return ds, acts


@pytest.mark.slow
def test_oracle_patch_tokens_quadratic_is_near_perfect(oracle_acts):
    ds, acts = oracle_acts
    rows = evaluate_activations(
        acts, ds, probes=("quadratic", "linear", "majority"), pair_config=PairConfig(min_share=0.0),
        train_config=PairTrainConfig(epochs=25), progress=False, n_boot=200,
    )
    make_table(rows)  # every column is in the results schema
    by = {(r["layer"], r["probe"]): r for r in rows}
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    quad, maj, lin = by[(1, "quadratic")], by[(1, "majority")], by[(1, "linear")]
    assert quad["accuracy"] >= 0.98 and quad["auroc"] >= 0.99
    assert quad["accuracy_lo"] > maj["accuracy_hi"]
    # two different objects vs two patches of one object: w·(x + y) cannot compare them
    assert lin["accuracy"] < 0.9
    assert 0.4 <= maj["accuracy"] <= 0.6  # balanced sampling
    assert by[(0, "quadratic")]["accuracy"] < 0.65  # noise tokens carry nothing
    r = by[(1, "quadratic")]
    assert (r["task"], r["tokens"], r["split"], r["backbone"]) == ("issameobject", "all", "test", "fake:patches")
    assert r["dataset_fingerprint"] == ds.fingerprint("test") and r["n_test"] > 500
    assert json.loads(r["config"])["probe"] == "quadratic"


def test_exclude_background_drops_background_pairs(oracle_acts):
    ds, acts = oracle_acts
    labels = split_patch_labels(ds, "test", (16, 16))
    pairs = sample_pairs(labels, PairConfig(exclude_background=True), seed=0)
    assert len(pairs) > 0
    assert np.all(labels[pairs.image, pairs.i] > 0) and np.all(labels[pairs.image, pairs.j] > 0)


def test_unknown_probe_is_one_line_error(oracle_acts):
    ds, acts = oracle_acts
    with pytest.raises(BenchError, match="unknown 'cosin'"):
        evaluate_activations(acts, ds, probes=("cosin",), progress=False)
    with pytest.raises(BenchError, match="attention-qk needs the backbone's query/key projections"):
        evaluate_activations(acts, ds, probes=("attention-qk",), progress=False)


# ---------------------------------------------------------------- attention-qk on real (tiny) models


@pytest.mark.parametrize("kind", ["dinov2", "clip", "vit"])
def test_attention_qk_is_the_blocks_own_attention_logit(kind, tmp_path):
    """The score of a token pair equals the logits the model's own attention computes at that block."""
    from evaluators.backbones import resolve_backbone
    from tests.test_backbones import encoder_of, tiny_checkpoint

    model, path = tiny_checkpoint(kind, tmp_path / kind, seed=1)
    with torch.no_grad():  # non-trivial biases (init leaves them at zero) and q/k weights (init std 0.02)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "q_proj" in name or "k_proj" in name:
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    bb = resolve_backbone(str(path))
    model.set_attn_implementation("eager")  # sdpa returns no attention probabilities
    encoder = encoder_of(kind, model).eval()
    blocks = bb.blocks()
    captured: dict[str, torch.Tensor] = {}
    layer = 1
    attn = [m for n, m in encoder.named_modules() if n.endswith(f"{layer}.attention") or n.endswith(f"{layer}.self_attn")]
    assert len(attn) == 1
    hooks = [attn[0].q_proj.register_forward_hook(lambda m, i, o: captured.__setitem__("q", o)),
             attn[0].k_proj.register_forward_hook(lambda m, i, o: captured.__setitem__("k", o))]
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = encoder(pixel_values=x, output_hidden_states=True, output_attentions=True)
    for h in hooks:
        h.remove()
    assert len(blocks) == 2 and len(out.hidden_states) == 3
    tokens = bb.hidden_states(x, [layer])[0][0]  # what extraction caches
    torch.testing.assert_close(tokens, out.hidden_states[layer][0])

    qk = bb.attention_qk(layer)
    heads, t = 2, tokens.shape[0]
    q, k = (captured[n][0].reshape(t, heads, 16) for n in ("q", "k"))
    logits = torch.einsum("ihd,jhd->hij", q, k) / 4.0  # d_head 16
    # the model's attention probabilities are the softmax of exactly these logits
    torch.testing.assert_close(logits.softmax(-1), out.attentions[layer][0], atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # and AttentionQK rebuilds them from the hidden state alone
        pq, pk = qk.project(tokens)
    torch.testing.assert_close(torch.einsum("ihd,jhd->hij", pq, pk) / 4.0, logits, atol=1e-4, rtol=1e-4)

    i, j = np.triu_indices(t, k=1)
    h = tokens.numpy()
    scores = attention_qk_scores(qk, h[i], h[j])
    expected = ((logits + logits.transpose(1, 2)) / 2).mean(0).numpy()[i, j]
    assert expected.std() > 0.1
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(attention_qk_scores(qk, h[j], h[i]), scores, atol=1e-6, rtol=1e-6)
    other = attention_qk_scores(bb.attention_qk(0), h[i], h[j])  # block 0's projections differ
    assert np.abs(other - scores).max() > 0.1
    with pytest.raises(BenchError, match="the last hidden state 2 feeds none"):
        bb.attention_qk(2)


def test_bench_evaluate_attention_qk(big_objects, tmp_path, capsys):
    """A tiny DINOv2 end to end: attention-qk rows for hidden states 0 and 1, none for the last
    (no block reads it; a note says so, no error row); backbones without projections stop with
    one line (exit 2) that names the backbone."""
    from bench.cli import main
    from bench.core.results import read_results
    from tests.test_backbones import tiny_checkpoint

    _, path = tiny_checkpoint("dinov2", tmp_path / "dinov2")
    results = tmp_path / "results"
    args = ["evaluate", "--task", "issameobject", "--dataset", str(big_objects), "--model", str(path),
            "--probes", "attention-qk,cosine", "--device", "cpu", "--results", str(results), "--format", "json"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "hidden state 2 (the last) feeds no block, so it gets no attention-qk row" in err
    by = {(r["layer"], r["probe"]): r for r in read_results(results).to_pylist()}
    assert set(by) == {(layer, p) for layer in (0, 1, 2) for p in ("attention-qk", "cosine")} - {(2, "attention-qk")}
    assert all(r["status"] == "ok" for r in by.values())
    for layer in (0, 1):
        r = by[(layer, "attention-qk")]
        assert 0 <= r["accuracy"] <= 1 and r["n_test"] > 0 and 0 <= r["val_accuracy"] <= 1
    assert main(args) == 0  # nothing is owed: the unread layer is not retried
    assert "nothing to do" in capsys.readouterr().err

    for model in ("pixels", "oracle:patches", "oracle:objects"):
        assert main(["evaluate", "--task", "issameobject", "--dataset", str(big_objects), "--model", model,
                     "--probes", "attention-qk", "--results", str(tmp_path / "none")]) == 2
        err = capsys.readouterr().err.strip()
        assert f"attention-qk needs a backbone that exposes its blocks' query/key projections" in err, err
        assert f"{model} has none" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())


@pytest.mark.slow
def test_bench_evaluate_issameobject_oracle_and_pixels(big_objects, tmp_path, capsys):
    """`bench evaluate --task issameobject` end to end: real extraction (cache), results rows, re-run skip.

    oracle:patches tokens are the one-hots of each patch's owner under the labelling rule,
    so a quadratic probe must separate same from different pairs; pixels are reported
    against the baselines on the same pairs.
    """
    from bench.cli import main
    from bench.core.results import read_results

    results = tmp_path / "results"
    args = ["evaluate", "--task", "issameobject", "--dataset", str(big_objects), "--model", "oracle:patches",
            "--model", "pixels", "--probes", "quadratic,distance,majority", "--epochs", "20", "--device", "cpu",
            "--results", str(results), "--format", "json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {(r["backbone"], r["probe"]) for r in summary} == {
        (b, p) for b in ("oracle:patches", "pixels") for p in ("quadratic", "distance", "majority")}
    rows = read_results(results).to_pylist()
    by = {(r["backbone"], r["probe"]): r for r in rows}
    assert all(r["status"] == "ok" and r["task"] == "issameobject" and r["tokens"] == "all" for r in rows)
    assert all(r["run_id"] and r["package_versions"] and r["dataset"] == "big" for r in rows)
    quad, maj = by[("oracle:patches", "quadratic")], by[("oracle:patches", "majority")]
    assert quad["accuracy"] >= 0.98 and quad["accuracy_lo"] > maj["accuracy_hi"]
    assert quad["backbone_family"] == "oracle" and quad["layer"] == 0
    pix = {p: by[("pixels", p)]["accuracy"] for p in ("quadratic", "distance", "majority")}
    assert 0.4 <= pix["majority"] <= 0.6 and pix["quadratic"] > pix["majority"] + 0.1

    assert main(args) == 0  # every key present: nothing runs
    assert "nothing to do" in capsys.readouterr().err
    assert main(["evaluate", "--task", "issameobject", "--dataset", str(big_objects), "--model", "oracle:objects",
                 "--results", str(results)]) == 2
    assert "no spatial tokens" in capsys.readouterr().err
    assert main(["evaluate", "--task", "issameobject", "--dataset", str(big_objects), "--model", "pixels",
                 "--tokens", "cls", "--results", str(results)]) == 2
    assert "use --tokens all" in capsys.readouterr().err

# ---------------------------------------------------------------- correlation with attention


def test_pair_attention_is_the_models_attention_over_patches(tmp_path):
    """A_ij of a tiny DINOv2 block equals the model's own attention probabilities (eager,
    output_attentions) restricted to the patch tokens the cache holds and renormalised,
    head-averaged and symmetrised; the correlation of scores = A with A is 1."""
    from evaluators.backbones import resolve_backbone
    from tests.test_backbones import tiny_checkpoint

    model, path = tiny_checkpoint("dinov2", tmp_path / "dinov2", seed=1)
    with torch.no_grad():  # sharper attention than the init's (q/k std 0.02), with biases
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    bb = resolve_backbone(str(path))
    model.set_attn_implementation("eager")
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(pixel_values=x, output_hidden_states=True, output_attentions=True)
    n_prefix = bb.info.n_prefix
    assert n_prefix == 1
    for layer in (0, 1):
        tokens = out.hidden_states[layer][:, n_prefix:].numpy()  # the cached "all" view: patches only
        t = tokens.shape[1]
        probs = out.attentions[layer][:, :, n_prefix:, n_prefix:]  # (B, H, T, T) over patch columns
        model_a = (probs / probs.sum(-1, keepdim=True)).mean(1)
        model_sym = ((model_a + model_a.transpose(1, 2)) / 2).numpy()
        rng = np.random.default_rng(layer)
        image = np.repeat(np.arange(3), 20)
        i, j = rng.integers(0, t, size=(2, 60))
        pairs = Pairs(image, i, j, np.zeros(60, bool))
        got = pair_attention(bb.attention_qk(layer), tokens, pairs, max_elements=2 * 2 * t * t)  # 2 images a chunk
        expected = model_sym[image, i, j]
        assert expected.std() > 0.2 * expected.mean()  # far from uniform: a wrong softmax would show
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
        unsym = (probs / probs.sum(-1, keepdim=True)).mean(1).numpy()[image, i, j]
        unnorm = ((probs.mean(1) + probs.mean(1).transpose(1, 2)) / 2).numpy()[image, i, j]
        assert np.abs(got - unsym).max() > 1e-2 and np.abs(got - unnorm).max() > 1e-3
        assert not np.allclose(got, pair_attention(bb.attention_qk(1 - layer), tokens, pairs), atol=1e-4)
        corr = attention_correlation(bb.attention_qk(layer), tokens, pairs, expected, n_perm=200, seed=0)
        assert corr["r"] == pytest.approx(1.0, abs=1e-5) and corr["p"] == pytest.approx(1 / 201)


def test_permutation_correlation_signal_noise_and_determinism():
    rng = np.random.default_rng(0)
    a = rng.normal(size=400)
    same = permutation_correlation(a, 3 * a + 1, n_perm=500, seed=1)
    assert same["r"] == pytest.approx(1.0) and same["p"] == pytest.approx(1 / 501)
    neg = permutation_correlation(a, -a, n_perm=500, seed=1)  # two-sided
    assert neg["r"] == pytest.approx(-1.0) and neg["p"] == pytest.approx(1 / 501)
    weak = permutation_correlation(a, a + 4 * rng.normal(size=400), n_perm=500, seed=1)
    assert 0.1 < weak["r"] < 0.5 and weak["p"] < 0.05
    noise = permutation_correlation(a, rng.normal(size=400), n_perm=500, seed=1)
    assert abs(noise["r"]) < 0.15 and noise["p"] > 0.05
    b = rng.normal(size=400)
    assert permutation_correlation(a, b, seed=7) == permutation_correlation(a, b, seed=7)
    assert permutation_correlation(a, b, seed=7)["r"] == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert permutation_correlation(a, np.ones(400)) == {"r": None, "p": None}
    # image-level confound only (each image shifts both), no relation within images:
    # a global permutation calls it significant, a within-image one does not
    image = np.repeat(np.arange(20), 20)
    shift = rng.normal(size=20)[image] * 3
    x, y = shift + rng.normal(size=400), shift + rng.normal(size=400)
    assert permutation_correlation(x, y, n_perm=500, seed=1)["p"] < 0.01
    assert permutation_correlation(x, y, n_perm=500, seed=1, groups=image)["p"] > 0.05
    # under the null the p-values are roughly uniform: few below 0.05
    ps = [permutation_correlation(rng.normal(size=50), rng.normal(size=50), n_perm=199, seed=s)["p"] for s in range(40)]
    assert sum(p < 0.05 for p in ps) <= 6 and max(ps) > 0.5


def test_bench_evaluate_writes_attention_correlation(big_objects, tmp_path, capsys):
    """Trained probe rows of a tiny DINOv2 get attention_r/attention_p for hidden states
    0 and 1 (blocks 0 and 1 read them), null for the last and for baselines."""
    from bench.cli import main
    from bench.core.results import read_results
    from tests.test_backbones import tiny_checkpoint

    _, path = tiny_checkpoint("dinov2", tmp_path / "dinov2")
    results = tmp_path / "results"
    args = ["evaluate", "--task", "issameobject", "--dataset", str(big_objects), "--model", str(path),
            "--probes", "linear,cosine", "--epochs", "2", "--device", "cpu", "--results", str(results),
            "--format", "json"]
    assert main(args) == 0
    capsys.readouterr()
    table = read_results(results)
    assert {"attention_r", "attention_p"} <= set(table.schema.names)
    by = {(r["layer"], r["probe"]): r for r in table.to_pylist()}
    assert set(by) == {(layer, p) for layer in (0, 1, 2) for p in ("linear", "cosine")}
    assert all(r["status"] == "ok" for r in by.values())
    for layer in (0, 1):
        r = by[(layer, "linear")]
        assert -1 <= r["attention_r"] <= 1 and 0 < r["attention_p"] <= 1
        assert by[(layer, "cosine")]["attention_r"] is None
    assert by[(2, "linear")]["attention_r"] is None and by[(2, "linear")]["attention_p"] is None
