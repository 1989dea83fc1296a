"""Fitting probes: the linear stage's penalty path, the gradient stage's plateau stopping, the guard."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evaluators.fitting import ProbeJob, RowReader, TrainConfig, class_directions, fit_probes, moments, saving_and_se
from evaluators.probes.build import LR_WIDTH, build_probe, probe_lr, probe_optim
from evaluators.probes.families import BINDING_PROBES, family_defaults

N = {"train": 2000, "val": 500, "test": 500}
K, D = 16, 32


def _splits(informative: bool, seed: int = 0) -> tuple[dict, dict, dict]:
    """(inputs, targets, exact prior logits): bits o_k ~ Bernoulli(0.3); z copies them through
    noise (informative) or is pure noise. The prior logit(0.3) is exact for o."""
    rng = np.random.default_rng(seed)
    inputs, targets, prior = {}, {}, {}
    for s, n in N.items():
        o = (rng.random((n, K)) < 0.3).astype(np.uint8)
        noise = rng.normal(size=(n, D)).astype(np.float32)
        z = noise if not informative else np.concatenate([o + 0.25 * noise[:, :K], noise[:, K:]], axis=1)
        inputs[s], targets[s] = RowReader(z.astype(np.float32)), o
        prior[s] = np.full((n, K), math.log(0.3 / 0.7), dtype=np.float32)
    return inputs, targets, prior


def _xor_splits(seed: int = 0) -> tuple[dict, dict, dict]:
    """Bit k = [z_2k · z_2k+1 > 0]: a sign product no linear function of z reads (p = 1/2 per bit)."""
    rng = np.random.default_rng(seed)
    inputs, targets, prior = {}, {}, {}
    for s, n in N.items():
        z = rng.normal(size=(n, D)).astype(np.float32)
        o = (z[:, 0:2 * K:2] * z[:, 1:2 * K:2] > 0).astype(np.uint8)
        inputs[s], targets[s], prior[s] = RowReader(z), o, np.zeros((n, K), dtype=np.float32)
    return inputs, targets, prior


def _prior_bits(targets: np.ndarray) -> np.ndarray:
    p = np.where(targets > 0, 0.3, 0.7)
    return -np.log2(p).sum(1)


def test_an_uninformative_input_stops_after_patience_and_keeps_the_prior():
    inputs, targets, prior = _splits(informative=False)
    config = TrainConfig()
    res = fit_probes([ProbeJob("dnn", build_probe("dnn", D, K), targets, prior=prior, optim=probe_optim("dnn", D))], inputs, config)["dnn"]
    assert res.error is None and res.converged and res.guard == "prior"
    # the gradient stage stopped on its family's plateau, not the budget
    assert len(res.history) - 1 == res.setting["patience"] == BINDING_PROBES.get("dnn").patience == 3
    np.testing.assert_allclose(res.scene_bits, _prior_bits(targets["test"]), rtol=1e-6)
    assert res.val_bits == pytest.approx(_prior_bits(targets["val"]).mean(), rel=1e-6)


def test_without_the_guard_a_noise_fit_moves_the_zero():
    """The guard is what keeps an uninformative input at exactly the prior: with it off, the
    validation-selected fit of pure noise codes test differently from the prior."""
    inputs, targets, prior = _splits(informative=False, seed=3)
    off = fit_probes([ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))], inputs,
                     TrainConfig(guard_se=-math.inf))["l"]
    on = fit_probes([ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))], inputs, TrainConfig())["l"]
    prior_test = _prior_bits(targets["test"])
    assert off.guard == "fit" and abs(off.scene_bits.mean() - prior_test.mean()) > 1e-3
    assert on.guard == "prior" and np.array_equal(on.scene_bits.astype(np.float64).round(4), prior_test.round(4))


def test_the_linear_stage_solves_a_copy_task_on_its_l2_path():
    inputs, targets, prior = _splits(informative=True)
    res = fit_probes([ProbeJob("linear", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))], inputs)["linear"]
    assert res.error is None and res.converged and res.guard == "fit"
    assert res.best_epoch == 0 and len(res.history) == 1  # no gradient stage: the L-BFGS solution is the fit
    # the L2 path and two strengths either side of its best per refinement (`TrainConfig.l2_refine`)
    assert len(res.l2_path) == len(TrainConfig().l2_path) + 2 * len(TrainConfig().l2_refine)
    assert len(res.l1_path) == len(TrainConfig().l1_path)
    assert res.scene_bits.mean() < 0.12 * _prior_bits(targets["test"]).mean()  # ~ the noise's Bayes rate
    assert res.val_bits == pytest.approx(res.val_scene_bits.mean())


def test_the_solvers_iterations_read_and_write_only_tensors_that_stay_in_place(monkeypatch):
    """On CUDA an L-BFGS iteration is replayed from a graph, which reads and writes the memory its
    capture saw: every tensor an iteration touches must be the solver's own, updated in place for
    the whole path (a rebound one would leave a replay reading a stale copy), and what a solve
    returns must not be overwritten by the next."""
    from evaluators.fitting import lbfgs

    seen, returned = [], []
    iterate, solve = lbfgs.BatchedLBFGS.iterate, lbfgs.BatchedLBFGS.solve

    def watched_iterate(self, kind):
        seen.append(tuple(t.data_ptr() for t in (self.theta, *self.data, self.f, self.g, self.h, self.step,
                                                  self.penalty, self.s, self.y, self.rho)))
        return iterate(self, kind)

    def watched_solve(self, *args):
        theta, data, remaining = solve(self, *args)
        returned.append((theta, theta.clone()))
        return theta, data, remaining

    monkeypatch.setattr(lbfgs.BatchedLBFGS, "iterate", watched_iterate)
    monkeypatch.setattr(lbfgs.BatchedLBFGS, "solve", watched_solve)
    inputs, targets, prior = _splits(informative=True)
    job = ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))
    fit_probes([job], inputs)
    assert len(seen) > 100 and len(set(seen)) == 1  # the whole path: L2, refined and L1 strengths
    assert len(returned) == len(TrainConfig().l2_path) + 2 * len(TrainConfig().l2_refine) + len(TrainConfig().l1_path)
    assert all(torch.equal(theta, kept) for theta, kept in returned)


def test_the_penalty_path_keeps_the_strength_best_on_validation():
    inputs, targets, prior = _splits(informative=True)
    res = fit_probes([ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))], inputs)["l"]
    path = {("l2", s): v for s, v in res.l2_path} | {("l1", s): v for s, v in res.l1_path}
    chosen = path[(res.setting["penalty"], res.setting["strength"])]
    assert chosen == min(path.values()) == pytest.approx(res.val_bits)
    assert chosen < path[("l2", max(dict(res.l2_path)))] - 1.0  # the strongest penalty is far from it


def test_a_refined_decade_path_chooses_what_the_quarter_decade_path_chose():
    """Decade L2 steps with each target's best refined a half and then a quarter decade either side
    choose the strength the quarter-decade path chose where validation has one minimum; unrefined,
    the decade path cannot (planted linear teacher, 384-d: LINEAR_TEACHER_BITS below)."""
    inputs, targets, prior = _splits(informative=True)
    quarter = tuple(float(10.0 ** -(e / 4)) for e in range(25))
    fits = {}
    for name, config in {"quarter": TrainConfig(l2_path=quarter, l1_path=(), l2_refine=()),
                         "refined": TrainConfig(l1_path=()),
                         "decade": TrainConfig(l1_path=(), l2_refine=())}.items():
        job = ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))
        fits[name] = fit_probes([job], inputs, config)["l"]
    chosen = fits["quarter"].setting["strength"]
    assert chosen not in TrainConfig().l2_path  # between two of the decade path's strengths
    assert fits["refined"].setting["strength"] == pytest.approx(chosen)
    assert fits["refined"].val_bits == pytest.approx(fits["quarter"].val_bits, rel=2e-3)
    assert fits["decade"].setting["strength"] != pytest.approx(chosen)
    assert [s for s, _ in fits["refined"].l2_path] == sorted((s for s, _ in fits["refined"].l2_path), reverse=True)
    job = ProbeJob("l", build_probe("linear", D, K), targets, prior=prior, optim=probe_optim("linear", D))
    one = fit_probes([job], inputs, TrainConfig(l1_path=(), l2_refine=10 ** 0.5))["l"]  # a single ratio, as before
    assert len(one.l2_path) == len(TrainConfig().l2_path) + 2


def test_each_family_stops_on_its_own_plateau_unless_the_config_sets_one():
    """The pooled families stop after 3 epochs without improvement (their best epochs lie within the
    first few), the attention probe, which learns for about 100 epochs, after 5; a number in the
    config holds for every family."""
    assert (probe_optim("dnn", D).patience, probe_optim("dnn", D).lr_patience) == (3, 1)
    assert (probe_optim("attention", D).patience, probe_optim("attention", D).lr_patience) == (5, 2)
    inputs, targets, prior = _splits(informative=False)
    job = ProbeJob("dnn", build_probe("dnn", D, K), targets, prior=prior, optim=probe_optim("dnn", D))
    res = fit_probes([job], inputs, TrainConfig(patience=6))["dnn"]
    assert res.setting["patience"] == 6 and len(res.history) - 1 == 6


def _sparse_splits(d: int, seed: int = 0) -> tuple[dict, dict, dict]:
    """Few training scenes, wide inputs: bit k is copied (through noise) into input k only, and
    every other input is noise. (inputs, targets, exact prior logits at p = 1/2.)"""
    rng = np.random.default_rng(seed)
    inputs, targets, prior = {}, {}, {}
    for s, n in {"train": 1000, "val": 500, "test": 2000}.items():
        o = (rng.random((n, 4)) < 0.5).astype(np.uint8)
        z = rng.normal(size=(n, d)).astype(np.float32)
        z[:, :4] += 1.5 * o
        inputs[s], targets[s], prior[s] = RowReader(z), o, np.zeros((n, 4), dtype=np.float32)
    return inputs, targets, prior


def test_the_l1_path_keeps_a_few_strong_inputs_without_the_noise_of_the_rest():
    """A binding a few inputs carry among many: L2 shrinks the few as hard as it shrinks the
    noise of all the others, L1 keeps them. Measured as the test bits lost against a probe that
    is told which inputs matter."""
    inputs, targets, prior = _sparse_splits(400)
    told = {s: RowReader(np.ascontiguousarray(r.array[:, :4])) for s, r in inputs.items()}

    def test_bits(data: dict, config: TrainConfig) -> float:
        job = ProbeJob("l", build_probe("linear", data["train"].row_shape[-1], 4), targets, prior=prior, optim=probe_optim("linear", data["train"].row_shape[-1]))
        return float(fit_probes([job], data, config)["l"].scene_bits.mean())

    best = test_bits(told, TrainConfig(l1_path=()))
    l2_only, with_l1 = test_bits(inputs, TrainConfig(l1_path=())), test_bits(inputs, TrainConfig())
    assert l2_only - best > 0.4  # L2 alone pays for the noise of 396 inputs (0.71 bits, measured)
    assert with_l1 - best < 0.6 * (l2_only - best)  # 0.35 of it with the L1 path


def test_jobs_with_one_linear_key_share_the_linear_solution():
    inputs, targets, prior = _splits(informative=True)
    jobs = [ProbeJob(f, build_probe(f, D, K, seed=i), targets, prior=prior, linear_key="O", optim=probe_optim(f, D))
            for i, f in enumerate(("linear", "quadratic", "dnn"))]
    fit_probes(jobs, inputs, TrainConfig(epochs=1))
    ref = jobs[0].model.w.weight
    for j in jobs[1:]:
        torch.testing.assert_close(j.model.w.weight, ref)  # frozen through the gradient stage


def test_the_gradient_stage_learns_what_the_linear_stage_cannot():
    inputs, targets, prior = _xor_splits()
    res = fit_probes([ProbeJob("dnn", build_probe("dnn", D, K), targets, prior=prior, optim=probe_optim("dnn", D))], inputs)["dnn"]
    start = res.history[0][1]  # the linear stage's solution: no better than the prior on a sign product
    assert start > 0.95 * K and res.best_epoch > 0 and res.val_bits < 0.7 * start


def test_the_gradient_stage_refits_the_bias_a_quadratic_term_shifts():
    """Bit k = [|z_k| > 0.674] (p = 1/2): a quadratic term s·z_k² reads it only beside a bias of
    about −s·0.674², which the linear stage (no better than the prior here) leaves at 0."""
    rng = np.random.default_rng(0)
    inputs, targets, prior = {}, {}, {}
    for s, n in N.items():
        z = rng.normal(size=(n, D)).astype(np.float32)
        targets[s] = (np.abs(z[:, :K]) > 0.674).astype(np.uint8)
        inputs[s], prior[s] = RowReader(z), np.zeros((n, K), dtype=np.float32)
    job = ProbeJob("q", build_probe("quadratic", D, K), targets, prior=prior, optim=probe_optim("quadratic", D))
    res = fit_probes([job], inputs)["q"]
    assert res.history[0][1] > 0.95 * K  # the linear stage's start: the prior's K bits
    assert res.scene_bits.mean() < 0.5 * K and job.model.bias.detach().max() < -1.0

    inputs, targets, prior = _xor_splits()
    res = fit_probes([ProbeJob("dnn", build_probe("dnn", D, K), targets, prior=prior, optim=probe_optim("dnn", D))], inputs,
                     TrainConfig(epochs=3))["dnn"]
    assert res.error is None and res.best_epoch == 3 and not res.converged
    assert len(res.history) == 4  # epoch 0 (the linear solution) and the three trained epochs


def test_per_family_learning_rates_scale_with_input_width():
    for family, hp in ((n, f.defaults) for n, f in BINDING_PROBES.items()):
        assert probe_optim(family, LR_WIDTH // 2).lr == hp["lr"]  # narrow inputs: the family's rate
        wide = hp["lr"] if family == "attention" else hp["lr"] / 2  # attention reads a learned encoder's width
        assert probe_optim(family, 4 * LR_WIDTH).lr == pytest.approx(wide)
    assert probe_optim("dnn", 16, lr=0.5).lr == 0.5
    assert not hasattr(build_probe("dnn", 16, 4), "lr")  # the optimiser's settings ride on the job, not the module
    assert probe_lr(1e-2, 1024) == pytest.approx(2.5e-3)


def test_an_explicit_learning_rate_overrides_the_familys():
    inputs, targets, prior = _xor_splits()
    slow = fit_probes([ProbeJob("d", build_probe("dnn", D, K), targets, prior=prior, optim=probe_optim("dnn", D))], inputs,
                      TrainConfig(epochs=6, lr=1e-7, batch_size=32, patience=6))["d"]
    fast = fit_probes([ProbeJob("d", build_probe("dnn", D, K), targets, prior=prior, optim=probe_optim("dnn", D))], inputs,
                      TrainConfig(epochs=6, batch_size=32, patience=6))["d"]
    best = {r.setting["lr"]: min(v for _, v in r.history) for r in (slow, fast)}
    assert best[1e-7] > best[family_defaults("dnn")["lr"] * math.sqrt(LR_WIDTH / D) if D > LR_WIDTH else
                             family_defaults("dnn")["lr"]] + 0.5


def test_the_savings_standard_error_resamples_whole_groups():
    d = np.array([1.0, 1.0, 3.0, 3.0])
    groups = np.array([[0], [0], [1], [1]])
    mean, se = saving_and_se(d, np.zeros(4), groups)
    # two groups with sums -2 and +2 about the mean 2: SE = sqrt(2/1 * 8) / 4
    assert mean == 2.0 and se == pytest.approx(math.sqrt(16) / 4)
    assert saving_and_se(d, np.zeros(4), np.zeros((4, 1)))[1] == math.inf  # one group: no SE


@pytest.fixture(params=["householder", "gram-schmidt"])
def orthonormal(request, monkeypatch) -> str:
    """The moment stage's subspace iteration as a CPU runs it (Householder QR) and as CUDA does
    (`moments.gram_schmidt`), here on the CPU."""
    if request.param == "gram-schmidt":
        monkeypatch.setattr(moments, "_orthonormal", moments.gram_schmidt)
    return request.param


def test_class_directions_find_a_planted_quadratic_direction_and_only_it(orthonormal):
    """Bit k is 1 where (p_k · z)² > 1: the class covariances differ along p_k only, so a second
    direction is the training rows' noise, which the other half of the rows does not confirm."""
    rng = np.random.default_rng(0)
    p = np.linalg.qr(rng.normal(size=(D, 4)))[0].T  # 4 orthonormal directions
    z = rng.normal(size=(4000, D)).astype(np.float32)
    o = ((z @ p.T) ** 2 > 1).astype(np.uint8)
    model = build_probe("quadratic", D, 4)
    model.set_standardization(z.mean(0), z.std(0))
    job = ProbeJob("q", model, {"train": o})
    top = class_directions(RowReader(z), job, dims=D, rank=2).numpy()  # 4 x 2 x D
    cosines = np.abs((top[:, 0] * p).sum(1))
    assert (cosines > 0.95).all()
    assert np.abs(top[:, 1]).max() == 0.0


def test_the_dense_class_difference_sums_what_the_selected_scenes_sum(balanced_small):
    """CUDA's one product per chunk and half (`moments._add_dense`) against the CPU's sums over each
    bit's selected scenes, on a dataset whose priors fix some bits in some scenes (both kinds of bit)."""
    from bench.core.dataset import Dataset
    from evaluators.tasks.binding.task import binding_task

    task = binding_task(Dataset(balanced_small))
    rng = np.random.default_rng(0)
    o = task.codes["train"][1]
    z = (rng.normal(size=(len(o), D)) + o @ rng.normal(size=(o.shape[1], D))).astype(np.float32)
    model = build_probe("quadratic", D, o.shape[1])
    model.set_standardization(z.mean(0), z.std(0))
    # the exact prior fixes most bits in some scenes (±inf); without it every bit is free everywhere
    for prior in ({"train": task.anchors["train"][1]}, None):
        job = ProbeJob("q", model, {"train": o}, prior=prior)
        selected = moments._class_difference(RowReader(z), job, D, "cpu")[1]
        try:
            moments.DENSE_DEVICES = ("cpu",)
            dense = moments._class_difference(RowReader(z), job, D, "cpu")[1]
        finally:
            moments.DENSE_DEVICES = ("cuda",)
        assert selected.abs().max() > 0
        torch.testing.assert_close(dense, selected, rtol=1e-4, atol=1e-5 * float(selected.abs().max()))


def test_gram_schmidt_spans_what_householder_qr_spans_and_zeroes_dependent_columns():
    rng = torch.Generator().manual_seed(0)
    x = torch.randn(6, 300, 10, generator=rng)
    x[:, :, 4] = 2 * x[:, :, 1] - x[:, :, 0]  # in the span of the columns before it
    x[:, :, 7] *= 1e-4  # small, not dependent: kept
    q = moments.gram_schmidt(x)
    assert (q[:, :, 4] == 0).all()
    kept = [j for j in range(10) if j != 4]
    gram = q[:, :, kept].transpose(1, 2) @ q[:, :, kept]
    torch.testing.assert_close(gram, torch.eye(9).expand(6, -1, -1), atol=1e-5, rtol=0)
    householder = torch.linalg.qr(x[:, :, kept]).Q
    cosines = torch.linalg.svdvals(householder.transpose(1, 2) @ q[:, :, kept])  # principal angles
    assert cosines.min() > 1 - 1e-5


def test_a_warm_started_job_trains_after_its_source_and_starts_from_its_encoder():
    """An attention probe's other targets start from the token encoder its O|F-probe learned:
    they are trained after it, and still start at their prior (only encoder, keys and values carry over)."""
    from evaluators.fitting import warm_start_from

    rng = np.random.default_rng(0)
    n = {"train": 64, "val": 32, "test": 32}
    x = {s: RowReader(rng.normal(size=(k, 5, 6)).astype(np.float32)) for s, k in n.items()}
    targets = {s: (rng.random((k, 3)) < 0.5).astype(np.uint8) for s, k in n.items()}
    prior = {s: np.zeros((k, 3), dtype=np.float32) for s, k in n.items()}
    source = ProbeJob("a/O|F", build_probe("attention", 6, 3, seed=1), targets, prior=prior, optim=probe_optim("attention", 6))
    wide = build_probe("attention", 9, 3, seed=2)  # three more input dims (a planted probe's)
    before = wide.encoder.weight.detach().clone()
    fit_probes([source], x, TrainConfig(epochs=1))
    warm_start_from(wide, source.model)
    torch.testing.assert_close(wide.encoder.weight[:, :6], source.model.encoder.weight)
    torch.testing.assert_close(wide.encoder.weight[:, 6:], before[:, 6:])
    torch.testing.assert_close(wide.keys.weight, source.model.keys.weight)
    assert not torch.equal(wide.query, source.model.query) and (wide.s == 0).all()  # its own queries, zero readout
    order = []
    job = ProbeJob("a/F", build_probe("attention", 6, 3, seed=3), targets, prior=prior, warm_start="a/O|F", optim=probe_optim("attention", 6))
    fresh = ProbeJob("a/O|F", build_probe("attention", 6, 3, seed=1), targets, prior=prior, optim=probe_optim("attention", 6))
    fit_probes([job, fresh], x, TrainConfig(epochs=1), progress=lambda _: order.append(len(order)))
    assert len(order) == 2  # one epoch of the source, then one of the warm-started job


def test_a_warm_started_job_keeps_the_encoder_it_copied_whole():
    """The per-token encoder is most of an attention probe's step: a warm-started job that reads
    the same tokens keeps its source's as it came, and trains its keys and values on."""
    rng = np.random.default_rng(0)
    n = {"train": 64, "val": 32, "test": 32}
    x = {s: RowReader(rng.normal(size=(k, 5, 6)).astype(np.float32)) for s, k in n.items()}
    targets = {s: (rng.random((k, 3)) < 0.5).astype(np.uint8) for s, k in n.items()}
    # no prior, so no guard: the fitted weights are what the test compares
    source = ProbeJob("a/O|F", build_probe("attention", 6, 3, seed=1), targets, optim=probe_optim("attention", 6))
    job = ProbeJob("a/F", build_probe("attention", 6, 3, seed=3), targets, warm_start="a/O|F", optim=probe_optim("attention", 6))
    keys = []
    fit_probes([job, source], x, TrainConfig(epochs=3, patience=5),
               progress=lambda _: keys.append(job.model.keys.weight.detach().clone()))
    torch.testing.assert_close(job.model.encoder.weight, source.model.encoder.weight)
    torch.testing.assert_close(job.model.encoder.bias, source.model.encoder.bias)
    assert not torch.equal(keys[-1], keys[3])  # its keys moved during its own epochs
    assert all(p.requires_grad for p in job.model.parameters())  # frozen for its fit only


def test_a_planted_probe_trains_the_encoder_it_widened():
    """Only an encoder copied whole is frozen: the planted probe's tokens are wider than its
    source's, and the columns that read the plant must learn."""
    from evaluators.fitting import warm_start_from

    source = build_probe("attention", 6, 3, seed=1)
    same, wider = build_probe("attention", 6, 3, seed=2), build_probe("attention", 9, 3, seed=2)
    warm_start_from(same, source)
    warm_start_from(wider, source)
    assert same.frozen_names == {"encoder.weight", "encoder.bias"}
    assert wider.frozen_names == frozenset()


def test_targets_that_keep_one_frozen_encoder_compute_its_product_once_per_batch(monkeypatch):
    """Two targets warm-started from one O|F-probe hold equal frozen encoders and meet each batch
    in turn: the second reuses the first's product (`TokenEncoder`), and nothing they code changes."""
    from evaluators.probes.token_encoder import TokenEncoder

    rng = np.random.default_rng(0)
    n = {"train": 64, "val": 32, "test": 32}
    x = {s: RowReader(rng.normal(size=(k, 5, 6)).astype(np.float32)) for s, k in n.items()}
    targets = {s: (rng.random((k, 3)) < 0.5).astype(np.uint8) for s, k in n.items()}
    products = []
    linear = torch.nn.Linear.forward

    def counted(self, inp):
        products.append(1)
        return linear(self, inp)

    monkeypatch.setattr(torch.nn.Linear, "forward", counted)

    def fit() -> tuple[int, list[np.ndarray]]:
        products.clear()
        jobs = [ProbeJob("a/O|F", build_probe("attention", 6, 3, seed=1), targets, optim=probe_optim("attention", 6))]
        jobs += [ProbeJob(f"a/{t}", build_probe("attention", 6, 3, seed=i), targets, warm_start="a/O|F", optim=probe_optim("attention", 6))
                 for i, t in ((2, "F"), (3, "O"))]
        res = fit_probes(jobs, x, TrainConfig(epochs=3, patience=5))
        encoded = sum(1 for _ in products)  # every Linear call; the encoder's differ between the runs
        return encoded, [res[j.name].scene_bits for j in jobs]

    cached, bits = fit()
    monkeypatch.setattr(TokenEncoder, "forward", counted)  # every call computes its product
    uncached, bits_uncached = fit()
    assert cached < uncached
    for a, b in zip(bits, bits_uncached):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("family", ["quadratic", "quadratic-shared"])
def test_a_quadratic_family_fits_inputs_narrower_than_its_rank(family):
    """Six input dimensions (oracle:features on 3 colours x 3 shapes) under a rank-8 family: the
    moment stage finds at most six directions per bit, and the probe still fits."""
    rng = np.random.default_rng(0)
    inputs, targets = {}, {}
    for s, n in {"train": 300, "val": 100, "test": 100}.items():
        o = (rng.random((n, 9)) < 0.3).astype(np.uint8)
        z = (o[:, :6] + 0.1 * rng.normal(size=(n, 6))).astype(np.float32)
        inputs[s], targets[s] = RowReader(z), o
    res = fit_probes([ProbeJob("q", build_probe(family, 6, 9), targets)], inputs, TrainConfig(epochs=3))["q"]
    assert res.error is None
    assert res.scene_bits.mean() < _prior_bits(targets["test"]).mean() - 1.0  # it reads the six copied bits


@pytest.mark.parametrize("df", [1, 3, 30, 3000])
def test_the_guards_t_quantile_is_scipy_stats_to_the_ends(df):
    """`t_quantile` stands in for scipy.stats' t.ppf (whose import costs a run 1.5 s): the same floats,
    its ends included, where scipy.special's stdtrit alone gives +inf at p = 0 and a guard of −1e9
    standard errors (keep every fit) reset every fit to its prior."""
    import scipy.special
    import scipy.stats

    from evaluators.fitting.scoring import t_quantile

    for z in (-1e9, -40.0, -8.0, -2.0, 0.0, 2.0, 8.0, 40.0, 1e9):
        assert t_quantile(scipy.special.ndtr(z), df) == float(scipy.stats.t.ppf(scipy.stats.norm.cdf(z), df=df))
