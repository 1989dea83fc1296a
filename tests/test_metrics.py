"""Binding metrics against hand-computed values (DESIGN §8)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.metrics import Priors, beta_star_checks, binding_metrics

PRIORS = Priors(H_O=10.0, H_F=4.0, H_O_given_F=6.0)


def test_point_estimates_follow_the_design_formulas():
    n = 50
    m = binding_metrics(PRIORS, np.full(n, 5.0), np.full(n, 1.0), np.full(n, 3.0))
    assert m["L_O"] == 5.0 and m["L_F"] == 1.0 and m["L_O_given_F"] == 3.0
    assert m["B_O"] == pytest.approx(5.0) and m["beta_O"] == pytest.approx(0.5)
    assert m["B_F"] == pytest.approx(3.0) and m["beta_F"] == pytest.approx(0.75)
    assert m["B_star"] == pytest.approx(6.0 - (5.0 - 1.0)) and m["beta_star"] == pytest.approx(2.0 / 6.0)
    assert m["B_star_cond"] == pytest.approx(3.0) and m["beta_star_cond"] == pytest.approx(0.5)
    assert (m["H_O"], m["H_F"], m["H_O_given_F"]) == (10.0, 4.0, 6.0)
    # constant per-scene values: every bootstrap resample gives the same number
    assert m["beta_star_lo"] == pytest.approx(m["beta_star"]) == pytest.approx(m["beta_star_hi"])


def test_negative_estimates_are_reported_raw():
    m = binding_metrics(PRIORS, np.full(10, 12.0), np.full(10, 0.5))
    assert m["B_O"] == pytest.approx(-2.0) and m["beta_O"] == pytest.approx(-0.2)
    assert m["B_star"] == pytest.approx(6.0 - 11.5) and m["beta_star"] < -0.9
    assert m["L_O_given_F"] is None and m["B_star_cond"] is None and m["beta_star_cond_lo"] is None


def test_ratios_are_undefined_without_entropy():
    m = binding_metrics(Priors(3.0, 3.0, 0.0), np.full(4, 1.0), np.full(4, 1.0))
    assert m["B_star"] == pytest.approx(0.0) and m["beta_star"] is None and m["beta_star_hi"] is None
    assert m["beta_O"] == pytest.approx(2.0 / 3.0)


def test_accuracies_from_teacher_forced_correct_counts():
    correct = np.array([8, 8, 7, 4])
    m = binding_metrics(PRIORS, np.ones(4), correct_O=correct, n_bits_O=8)
    assert m["bit_accuracy"] == pytest.approx(27 / 32)
    assert m["exact_accuracy"] == pytest.approx(0.5)


def test_bootstrap_interval_is_seeded_and_matches_the_normal_approximation():
    rng = np.random.default_rng(1)
    bits_o = rng.exponential(4.0, size=4000)
    a = binding_metrics(PRIORS, bits_o, n_boot=2000, seed=3)
    b = binding_metrics(PRIORS, bits_o, n_boot=2000, seed=3)
    c = binding_metrics(PRIORS, bits_o, n_boot=2000, seed=4)
    assert a == b and a["L_O_lo"] != c["L_O_lo"]
    half = 1.96 * bits_o.std() / np.sqrt(len(bits_o))
    assert a["L_O_lo"] < a["L_O"] < a["L_O_hi"]
    assert (a["L_O_hi"] - a["L_O_lo"]) / 2 == pytest.approx(half, rel=0.1)
    # B_O = H_O - L_O: its interval is the mirror image
    assert a["B_O_lo"] == pytest.approx(PRIORS.H_O - a["L_O_hi"])


def test_paired_resampling_keeps_the_correlation_of_o_and_f_bits():
    """L_O - L_F is nearly constant when both vary together: its interval must be narrow."""
    rng = np.random.default_rng(0)
    shared = rng.normal(5.0, 2.0, size=2000)
    m = binding_metrics(PRIORS, shared + 1.0, shared)
    assert m["B_star"] == pytest.approx(5.0)
    assert m["B_star_hi"] - m["B_star_lo"] < 1e-9
    assert m["L_O_hi"] - m["L_O_lo"] > 0.1


def test_grouped_bootstrap_resamples_whole_groups():
    """Scenes of one F code share an offset: the interval must reflect 20 groups, not 2,000 scenes."""
    rng = np.random.default_rng(2)
    code = np.repeat(np.arange(20), 100)
    offset = rng.normal(0.0, 2.0, size=20)
    bits_o = 6.0 + offset[code] + rng.normal(0.0, 0.5, size=2000)
    f_codes = np.stack([code % 4, code // 4], axis=1)  # one row per scene, as F codes are
    scenes = binding_metrics(PRIORS, bits_o, n_boot=2000, seed=0)
    grouped = binding_metrics(PRIORS, bits_o, n_boot=2000, seed=0, groups=f_codes)
    assert grouped["L_O"] == scenes["L_O"]
    group_means = np.array([bits_o[code == g].mean() for g in range(20)])
    half = 1.96 * group_means.std() / np.sqrt(20)
    assert (grouped["L_O_hi"] - grouped["L_O_lo"]) / 2 == pytest.approx(half, rel=0.2)
    assert grouped["L_O_hi"] - grouped["L_O_lo"] > 5 * (scenes["L_O_hi"] - scenes["L_O_lo"])



def _noisy(center: float, n: int = 200, spread: float = 0.5, seed: int = 0) -> np.ndarray:
    return center + np.random.default_rng(seed).uniform(-spread, spread, n)


def test_beta_star_checks_flag_only_what_true_entropies_forbid():
    """H(O)=10, H(F)=4, H(O|F)=6: each check fires when its whole interval is impossible."""
    assert beta_star_checks(binding_metrics(PRIORS, _noisy(5.0), _noisy(1.0, seed=1))) == []
    # the pixels/dnn failure: an F-probe far above the F prior, so β* > 1
    failed = beta_star_checks(binding_metrics(PRIORS, _noisy(3.0), _noisy(9.0, seed=1)))
    assert failed == ["L_F > H(F)", "L_O < L_F"]
    # an O-probe worse than the O prior; β* is negative there, and negatives alone are never flagged
    m = binding_metrics(PRIORS, _noisy(11.0), _noisy(1.0, seed=1))
    assert m["beta_star_hi"] < 0 and beta_star_checks(m) == ["L_O > H(O)"]
    assert beta_star_checks(binding_metrics(PRIORS, np.full(10, 9.0), np.full(10, 0.5))) == []
    # at a bound, within the noise: not flagged (the interval straddles H(F))
    m = binding_metrics(PRIORS, _noisy(5.0), _noisy(4.02, spread=1.0, seed=1))
    assert m["B_F_lo"] < 0 < m["B_F_hi"] and beta_star_checks(m) == []


def test_beta_star_checks_read_results_rows_with_missing_columns():
    """Rows of a failed probe or of another task carry None/NaN: nothing to flag."""
    assert beta_star_checks({"B_F_hi": None, "B_O_hi": float("nan")}) == []
    assert beta_star_checks({"beta_star_lo": 1.2}) == ["L_O < L_F"]
