"""Binding metrics against hand-computed values (docs/explanation/architecture.md §3)."""

from __future__ import annotations

import numpy as np
import pytest

from evaluators.tasks.binding.metrics import Priors, binding_metrics, metric_checks

PRIORS = Priors(H_O=10.0, H_F=4.0, H_O_given_F=6.0)


def _full(n: int, value: float) -> np.ndarray:
    return np.full(n, value)


def test_chain_rule_point_estimates_follow_the_design_formulas():
    n = 50
    m = binding_metrics(PRIORS, {"F": _full(n, 1.0), "O|F": _full(n, 3.0)})
    assert m["L_F"] == 1.0 and m["L_O_given_F"] == 3.0 and m["L_O"] == 4.0
    assert m["B_F"] == pytest.approx(3.0) and m["beta_F"] == pytest.approx(0.75)
    assert m["B_star"] == pytest.approx(3.0) and m["beta_star"] == pytest.approx(0.5)
    # B_O = B_F + B*: the chain rule holds exactly
    assert m["B_O"] == pytest.approx(m["B_F"] + m["B_star"]) and m["beta_O"] == pytest.approx(0.6)
    assert (m["H_O"], m["H_F"], m["H_O_given_F"]) == (10.0, 4.0, 6.0)
    # constant per-scene values: every bootstrap resample gives the same number
    assert m["beta_star_lo"] == pytest.approx(m["beta_star"]) == pytest.approx(m["beta_star_hi"])
    assert m["beta_star_paper"] is None and m["B_O_paper_lo"] is None


def test_paper_estimator_is_the_difference_of_the_direct_probes():
    m = binding_metrics(PRIORS, {"O_paper": _full(10, 5.0), "F_paper": _full(10, 1.0)})
    assert m["B_star_paper"] == pytest.approx(6.0 - (5.0 - 1.0)) and m["beta_star_paper"] == pytest.approx(2 / 6)
    assert m["B_O_paper"] == pytest.approx(5.0) and m["beta_O_paper"] == pytest.approx(0.5)
    assert m["B_F_paper"] == pytest.approx(3.0)
    assert m["beta_star"] is None and m["L_O"] is None


def test_references_are_the_test_scenes_own_prior_code_lengths():
    """Scenes of differing H(O|F=f): an O|F-probe that codes each at its own prior reads B* = 0
    exactly, though the split's expectation (6 bits) differs from the sample's mean."""
    h = np.array([2.0, 4.0, 9.0, 3.0])
    ref_f = np.array([1.0, 2.0, 3.0, 2.0])
    m = binding_metrics(PRIORS, {"F": ref_f.copy(), "O|F": h.copy()}, ref_F=ref_f, ref_O_given_F=h)
    assert m["H_O_given_F"] == pytest.approx(4.5) and m["H_F"] == pytest.approx(2.0) and m["H_O"] == pytest.approx(6.5)
    assert m["B_star"] == 0.0 and m["beta_star"] == 0.0 and m["B_F"] == 0.0 and m["B_O"] == 0.0
    assert m["beta_star_lo"] == 0.0 == m["beta_star_hi"]


def test_negative_estimates_are_reported_raw():
    m = binding_metrics(PRIORS, {"O_paper": _full(10, 12.0), "F_paper": _full(10, 0.5)})
    assert m["B_O_paper"] == pytest.approx(-2.0) and m["beta_O_paper"] == pytest.approx(-0.2)
    assert m["B_star_paper"] == pytest.approx(6.0 - 11.5) and m["beta_star_paper"] < -0.9


def test_ratios_are_undefined_without_entropy():
    m = binding_metrics(Priors(3.0, 3.0, 0.0), {"F": _full(4, 1.0), "O|F": _full(4, 0.0)})
    assert m["B_star"] == pytest.approx(0.0) and m["beta_star"] is None and m["beta_star_hi"] is None
    assert m["beta_O"] == pytest.approx(2.0 / 3.0)


def test_unknown_probe_targets_are_refused():
    with pytest.raises(ValueError, match="unknown probe targets"):
        binding_metrics(PRIORS, {"O": _full(3, 1.0)})


def test_accuracies_from_teacher_forced_correct_counts():
    correct = np.array([8, 8, 7, 4])
    m = binding_metrics(PRIORS, {"O|F": np.ones(4)}, correct=correct, n_bits=8)
    assert m["bit_accuracy"] == pytest.approx(27 / 32)
    assert m["exact_accuracy"] == pytest.approx(0.5)


def test_bootstrap_interval_is_seeded_and_matches_the_normal_approximation():
    rng = np.random.default_rng(1)
    bits = rng.exponential(4.0, size=4000)
    a = binding_metrics(PRIORS, {"O|F": bits}, n_boot=2000, seed=3)
    b = binding_metrics(PRIORS, {"O|F": bits}, n_boot=2000, seed=3)
    c = binding_metrics(PRIORS, {"O|F": bits}, n_boot=2000, seed=4)
    assert a == b and a["L_O_given_F_lo"] != c["L_O_given_F_lo"]
    half = 1.96 * bits.std() / np.sqrt(len(bits))
    assert a["L_O_given_F_lo"] < a["L_O_given_F"] < a["L_O_given_F_hi"]
    assert (a["L_O_given_F_hi"] - a["L_O_given_F_lo"]) / 2 == pytest.approx(half, rel=0.1)
    # B* = H(O|F) - L_O|F: its interval is the mirror image
    assert a["B_star_lo"] == pytest.approx(PRIORS.H_O_given_F - a["L_O_given_F_hi"])


def test_paired_resampling_keeps_the_correlation_of_probe_and_reference():
    """B* = h - L is nearly constant when both vary together: its interval must be narrow."""
    rng = np.random.default_rng(0)
    h = rng.normal(5.0, 2.0, size=2000)
    m = binding_metrics(PRIORS, {"O|F": h - 1.0}, ref_O_given_F=h)
    assert m["B_star"] == pytest.approx(1.0)
    assert m["B_star_hi"] - m["B_star_lo"] < 1e-9
    assert m["L_O_given_F_hi"] - m["L_O_given_F_lo"] > 0.1


def test_grouped_bootstrap_resamples_whole_groups():
    """Scenes of one F code share an offset: the interval must reflect 20 groups, not 2,000 scenes."""
    rng = np.random.default_rng(2)
    code = np.repeat(np.arange(20), 100)
    offset = rng.normal(0.0, 2.0, size=20)
    bits = 6.0 + offset[code] + rng.normal(0.0, 0.5, size=2000)
    f_codes = np.stack([code % 4, code // 4], axis=1)  # one row per scene, as F codes are
    scenes = binding_metrics(PRIORS, {"O|F": bits}, n_boot=2000, seed=0)
    grouped = binding_metrics(PRIORS, {"O|F": bits}, n_boot=2000, seed=0, groups=f_codes)
    assert grouped["L_O_given_F"] == scenes["L_O_given_F"]
    group_means = np.array([bits[code == g].mean() for g in range(20)])
    half = 1.96 * group_means.std() / np.sqrt(20)
    width = {k: v["L_O_given_F_hi"] - v["L_O_given_F_lo"] for k, v in (("s", scenes), ("g", grouped))}
    assert width["g"] / 2 == pytest.approx(half, rel=0.2)
    assert width["g"] > 5 * width["s"]


def _noisy(center: float, n: int = 200, spread: float = 0.5, seed: int = 0) -> np.ndarray:
    return center + np.random.default_rng(seed).uniform(-spread, spread, n)


def _paper(o: np.ndarray, f: np.ndarray) -> dict:
    return binding_metrics(PRIORS, {"O_paper": o, "F_paper": f})


def test_paper_checks_flag_only_what_true_entropies_forbid():
    """H(O)=10, H(F)=4, H(O|F)=6: each check fires when its whole interval is impossible."""
    assert metric_checks(_paper(_noisy(5.0), _noisy(1.0, seed=1)), "beta_star_paper") == []
    # the pixels/dnn failure: an F-probe far above the F prior, so β*_paper > 1
    failed = metric_checks(_paper(_noisy(3.0), _noisy(9.0, seed=1)), "beta_star_paper")
    assert failed == ["L_F > H(F)", "L_O < L_F"]
    # an O-probe worse than the O prior; β* is negative there, and negatives alone are never flagged
    m = _paper(_noisy(11.0), _noisy(1.0, seed=1))
    assert m["beta_star_paper_hi"] < 0 and metric_checks(m, "beta_star_paper") == ["L_O > H(O)"]
    assert metric_checks(_paper(_full(10, 9.0), _full(10, 0.5)), "beta_star_paper") == []
    # at a bound, within the noise: not flagged (the interval straddles H(F))
    m = _paper(_noisy(5.0), _noisy(4.02, spread=1.0, seed=1))
    assert m["B_F_paper_lo"] < 0 < m["B_F_paper_hi"] and metric_checks(m, "beta_star_paper") == []
    # the paper's failures are not the headline's: its own probes are judged separately
    assert metric_checks(_paper(_noisy(3.0), _noisy(9.0, seed=1))) == []


def test_headline_checks_flag_probes_worse_than_their_prior_and_unconverged_fits():
    ok = binding_metrics(PRIORS, {"F": _noisy(4.0, spread=1.0), "O|F": _noisy(6.0, spread=1.0, seed=1)})
    assert ok["B_star_lo"] < 0 < ok["B_star_hi"] and metric_checks(ok) == []
    worse = binding_metrics(PRIORS, {"F": _noisy(5.0), "O|F": _noisy(7.0, seed=1)})
    assert metric_checks(worse) == ["L_F > H(F)", "L_O|F > H(O|F)"]
    assert metric_checks({**ok, "converged": False}) == ["not converged"]
    # a probe that stayed at its prior, off by float32 round-off only: not a failure
    h = np.full(100, 32.90786873)
    at_prior = binding_metrics(PRIORS, {"F": np.zeros(100), "O|F": (h + 3e-6).astype(np.float32)}, ref_F=np.zeros(100),
                               ref_O_given_F=h)
    assert at_prior["B_star_hi"] < 0 and metric_checks(at_prior) == []
    # each estimator is judged by its own probes' convergence
    assert metric_checks({**ok, "converged": False}, "beta_star_paper") == []
    assert metric_checks({**ok, "converged_paper": False}, "beta_star_paper") == ["not converged"]
    assert metric_checks({**ok, "converged_paper": False}) == []


def test_checks_read_results_rows_with_missing_columns():
    """Rows of a failed probe or of another task carry None/NaN: nothing to flag."""
    assert metric_checks({"B_F_hi": None, "B_star_hi": float("nan")}) == []
    assert metric_checks({"beta_star_paper_lo": 1.2}, "beta_star_paper") == ["L_O < L_F"]
    assert metric_checks({"converged": None}) == []


def test_intervals_are_the_same_bytes_whatever_numpy_blas_threads():
    """A BLAS splits a product between its threads and rounds it by the split: the bootstrap's
    products run on one thread, so a row's intervals do not depend on the machine's cores (nor
    on whether a worker process or the run's own fitted it)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from evaluators.tasks.binding.metrics import bootstrap_means, _group_draws

    blas = threadpoolctl.ThreadpoolController()
    if max((lib["num_threads"] for lib in blas.info() if lib["user_api"] == "blas"), default=1) < 2:
        pytest.skip("numpy's BLAS has one thread here")
    bits = np.random.default_rng(0).random((500, 24)) * 30
    weights = _group_draws(500, 256, 0, 256)[0].astype(np.float64)
    with blas.limit(limits=1, user_api="blas"):
        one = weights @ bits
    with blas.limit(limits=2, user_api="blas"):
        assert not np.array_equal(weights @ bits, one)  # the rounding this test is about
        two = bootstrap_means(bits, 1000, 0)
    with blas.limit(limits=1, user_api="blas"):
        assert np.array_equal(bootstrap_means(bits, 1000, 0), two)
