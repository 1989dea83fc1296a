"""Training to convergence: plateau stopping, the `converged` flag, per-family learning rates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluators.probes import DEFAULTS, LR_WIDTH, build_probe, probe_lr
from evaluators.training import ProbeJob, RowReader, TrainConfig, fit_probes

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


def _prior_bits(targets: np.ndarray) -> np.ndarray:
    p = np.where(targets > 0, 0.3, 0.7)
    return -np.log2(p).sum(1)


def test_an_uninformative_input_stops_after_patience_and_keeps_the_prior():
    inputs, targets, prior = _splits(informative=False)
    config = TrainConfig()
    res = fit_probes([ProbeJob("dnn", build_probe("dnn", D, K), targets, prior=prior)], inputs, config)["dnn"]
    assert res.error is None and res.best_epoch == 0 and res.converged
    assert len(res.history) - 1 == config.patience  # stopped on the plateau, not the budget
    np.testing.assert_allclose(res.scene_bits, _prior_bits(targets["test"]), rtol=1e-5)


@pytest.mark.parametrize("family", ["linear", "dnn"])
def test_a_copy_task_converges_well_inside_the_budget(family):
    inputs, targets, prior = _splits(informative=True)
    config = TrainConfig()
    res = fit_probes([ProbeJob(family, build_probe(family, D, K), targets, prior=prior)], inputs, config)[family]
    epochs_run = len(res.history) - 1
    assert res.error is None and res.converged
    assert 0 < res.best_epoch <= 0.9 * config.epochs
    assert epochs_run == res.best_epoch + config.patience < config.epochs
    prior_bits = _prior_bits(targets["test"]).mean()
    assert res.scene_bits.mean() < 0.2 * prior_bits
    val = [v for _, v in res.history]
    assert res.val_bits == val[res.best_epoch] and min(val) >= res.val_bits - config.min_delta


def test_a_budget_too_small_is_not_converged():
    inputs, targets, prior = _splits(informative=True)
    config = TrainConfig(epochs=3)
    res = fit_probes([ProbeJob("linear", build_probe("linear", D, K), targets, prior=prior)], inputs, config)["linear"]
    assert res.error is None and res.best_epoch == 3 and not res.converged
    assert len(res.history) == 4  # epoch 0 (the prior) and the three trained epochs


def test_per_family_learning_rates_scale_with_input_width():
    for family, hp in DEFAULTS.items():
        assert build_probe(family, LR_WIDTH // 2, 4).lr == hp["lr"]  # narrow inputs: the family's rate
        assert build_probe(family, 4 * LR_WIDTH, 4).lr == pytest.approx(hp["lr"] / 2)
    assert build_probe("dnn", 16, 4, lr=0.5).lr == 0.5
    assert probe_lr(1e-2, 1024) == pytest.approx(2.5e-3)
    assert DEFAULTS["dnn"]["lr"] < DEFAULTS["linear"]["lr"]  # the dnn peaked at epoch 1 at the linear rate


def test_an_explicit_learning_rate_overrides_the_familys():
    inputs, targets, prior = _splits(informative=True)
    slow = fit_probes([ProbeJob("l", build_probe("linear", D, K), targets, prior=prior)], inputs,
                      TrainConfig(epochs=2, lr=1e-6))["l"]
    fast = fit_probes([ProbeJob("l", build_probe("linear", D, K), targets, prior=prior)], inputs,
                      TrainConfig(epochs=2))["l"]
    assert slow.val_bits > fast.val_bits + 1.0
