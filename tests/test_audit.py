"""The audits' statistics (dpadmm.privacy.audit) on mechanisms whose epsilon is known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from dpadmm.privacy.audit import (
    clopper_pearson,
    epsilon_lower_bound,
    one_run_audit,
    one_run_bound,
    one_run_p_value,
    release_audit,
)
from dpadmm.privacy.ledger import Release, single_release


def test_clopper_pearson_edges() -> None:
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0 and clopper_pearson(10, 10, 0.05)[1] == 1.0
    low, high = clopper_pearson(50, 100, 0.05)
    assert low == pytest.approx(0.3983, abs=1e-4) and high == pytest.approx(0.6017, abs=1e-4)


def test_a_bound_needs_rates_that_prove_something() -> None:
    assert epsilon_lower_bound(0, 1000, 0, 1000) == 0.0
    assert epsilon_lower_bound(500, 1000, 500, 1000) == 0.0
    strong = epsilon_lower_bound(500, 1000, 50, 1000)
    assert 0 < strong < math.log(10)  # below the plug-in ratio, as a confidence bound is
    assert epsilon_lower_bound(500, 1000, 50, 1000, delta=0.1) < strong  # delta excuses part of the gap


def _laplace(rng: np.random.Generator, centre: np.ndarray, scale: float, trials: int) -> np.ndarray:
    return centre + rng.laplace(scale=scale, size=(trials, centre.size))


def test_a_laplace_release_is_bounded_near_its_epsilon_and_a_halved_scale_refutes_it() -> None:
    rng = np.random.default_rng(0)
    epsilon, trials = 1.0, 200_000
    d, d_prime = np.array([0.5, -0.5, 0.0]), np.array([-0.5, 0.5, 0.0])  # L1 distance 2: scale 2 / eps
    bound, detail = release_audit(_laplace(rng, d, 2 / epsilon, trials),
                                  _laplace(rng, d_prime, 2 / epsilon, trials), "laplace")
    assert 0.8 * epsilon < bound <= epsilon, detail
    broken, _ = release_audit(_laplace(rng, d, 1 / epsilon, trials),
                              _laplace(rng, d_prime, 1 / epsilon, trials), "laplace")
    assert broken > epsilon


def test_a_gaussian_release_is_bounded_below_its_exact_epsilon() -> None:
    rng = np.random.default_rng(1)
    delta, trials = 1e-5, 400_000
    exact = single_release(Release("gaussian", 1.0), delta)  # sensitivity 1, sigma 1
    shift = np.array([1.0, 0.0])
    bound, detail = release_audit(rng.normal(size=(trials, 2)) + shift, rng.normal(size=(trials, 2)),
                                  "projection", delta)
    assert 0.3 * exact < bound <= exact, detail
    half, _ = release_audit(rng.normal(scale=0.25, size=(trials, 2)) + shift,
                            rng.normal(scale=0.25, size=(trials, 2)), "projection", delta)
    assert half > exact


def test_a_release_audit_refuses_what_proves_nothing() -> None:
    with pytest.raises(ValueError, match="too few"):
        release_audit(np.zeros((10, 2)), np.zeros((10, 2)), "projection")
    with pytest.raises(ValueError, match="not finite"):
        release_audit(np.full((100, 2), np.nan), np.zeros((100, 2)), "projection")
    with pytest.raises(ValueError, match="statistic='median'"):
        release_audit(np.zeros((100, 2)), np.zeros((100, 2)), "median")


def test_the_one_run_p_value_is_the_binomial_tail_when_pure() -> None:
    assert one_run_p_value(100, 100, 60, 0.0, 0.0) == pytest.approx(binom.sf(59, 100, 0.5))
    assert one_run_p_value(100, 100, 60, 0.0, 1e-3) > one_run_p_value(100, 100, 60, 0.0, 0.0)
    with pytest.raises(ValueError, match="correct=5"):
        one_run_p_value(10, 4, 5, 1.0, 0.0)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_one_run_bounds_randomised_response_below_its_epsilon(epsilon: float) -> None:
    """m canaries, each in with probability 1/2, observed through eps-DP randomised response: the one-run
    bound stays below eps and comes near it with many canaries (Steinke, Nasr & Jagielski 2023, Fig. 1)."""
    rng = np.random.default_rng(2)
    m = 20_000
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < math.exp(epsilon) / (1 + math.exp(epsilon))
    scores = np.where(truthful, included, ~included).astype(float) + rng.random(m) * 1e-3  # ties broken
    bound, detail = one_run_audit(scores, included)
    assert 0.6 * epsilon < bound <= epsilon, detail
    guesses, correct = detail["guesses"], detail["correct"]
    assert one_run_bound(m, guesses, correct, delta=1e-5) < one_run_bound(m, guesses, correct)  # delta costs
