"""dpadmm.privacy.ledger: releases as DP events, against closed forms and dp-accounting called directly."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy.stats import norm

from dpadmm.privacy.ledger import (
    GRID_BITS,
    GRID_RATIO,
    GRID_TAIL,
    PLD_INTERVAL,
    Release,
    advanced_composition,
    basic_composition,
    calibrate_multiplier,
    composed_epsilon,
    fast_epsilon,
    ledger,
    pld_epsilon,
    rdp_epsilon,
    relation,
    single_release,
)


def test_single_laplace_release_is_pure_eps_bar() -> None:
    laplace = Release("laplace", 20.0)
    assert single_release(laplace, 0.0) == pytest.approx(0.05)
    # the PLD accountant agrees (its discretisation is pessimistic by at most the interval)
    assert pld_epsilon(laplace, 1, 1e-5) == pytest.approx(0.05, abs=PLD_INTERVAL)
    assert pld_epsilon(laplace, 1, 1e-5) <= 0.05 + 1e-9


def test_single_gaussian_release_matches_the_analytic_gaussian_mechanism() -> None:
    """delta(eps) = Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s)) (Balle & Wang 2018), s = sigma/Delta."""
    s, delta = 3.0, 1e-5
    eps = single_release(Release("gaussian", s), delta)
    analytic = norm.cdf(-eps * s + 1 / (2 * s)) - math.exp(eps) * norm.cdf(-eps * s - 1 / (2 * s))
    assert analytic == pytest.approx(delta, rel=1e-3)
    assert pld_epsilon(Release("gaussian", s), 1, delta) == pytest.approx(eps, abs=2 * PLD_INTERVAL)


def test_basic_and_advanced_composition_closed_forms() -> None:
    assert basic_composition(0.05, 200_000) == pytest.approx(10_000)
    k, eps, d = 200_000, 0.05, 1e-5
    expected = math.sqrt(2 * k * math.log(1 / d)) * eps + k * eps * (math.exp(eps) - 1)
    assert advanced_composition(eps, k, d) == pytest.approx(expected)
    assert advanced_composition(0.05, 200_000, 1e-5) == pytest.approx(620.2, abs=0.5)


def test_a_sampled_release_is_dp_accountings_poisson_sampled_event() -> None:
    """The event algebra: sampling wraps the mechanism, a count composes it; amplification lowers epsilon.
    What is composed is the deployed mechanism: the grid's multiplier, and its ratio's cost (secure.py)."""
    sampled = Release("gaussian", 1.1, sampling=0.01)
    deployed = 1 / (1 / 1.1 + 2.0**-GRID_BITS)
    assert sampled.deployed_multiplier == pytest.approx(deployed, rel=1e-15) and deployed < 1.1
    direct = pld_privacy_accountant.PLDAccountant(relation(), value_discretization_interval=PLD_INTERVAL)
    direct.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(deployed)), 1000)
    spendable = (1e-5 - 1000 * GRID_TAIL) * math.exp(-1000 * GRID_RATIO)
    expected = direct.get_epsilon(spendable) + 2 * 1000 * GRID_RATIO
    assert pld_epsilon(sampled, 1000, 1e-5) == pytest.approx(expected, rel=1e-12)
    # the grid's cost is far below what a statement prints
    continuous = pld_privacy_accountant.PLDAccountant(relation(), value_discretization_interval=PLD_INTERVAL)
    continuous.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000)
    assert pld_epsilon(sampled, 1000, 1e-5) == pytest.approx(continuous.get_epsilon(1e-5), rel=1e-6)
    assert pld_epsilon(sampled, 1000, 1e-5) < pld_epsilon(Release("gaussian", 1.1), 1000, 1e-5) / 10
    gaussian = dp_accounting.GaussianDpEvent(deployed)
    assert sampled.event(1) == dp_accounting.PoissonSampledDpEvent(0.01, gaussian)


def test_a_gaussian_multiplier_below_the_samplers_range_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 2\\*\\*-10"):
        Release("gaussian", 2.0**-11)


@pytest.mark.parametrize(("mechanism", "multiplier", "sampling"),
                         [("laplace", 0.0, 1.0), ("exponential", 1.0, 1.0), ("gaussian", 1.0, 0.0),
                          ("gaussian", 1.0, 1.5), ("gaussian", float("nan"), 1.0)])
def test_a_release_outside_the_algebra_is_an_error_naming_the_value(mechanism: str, multiplier: float,
                                                                     sampling: float) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        Release(mechanism, multiplier, sampling)


def test_a_ledger_states_three_scopes_of_the_same_releases() -> None:
    book = ledger(algorithm="x", release=Release("laplace", 10.0), per_round=3, rounds=7, delta=1e-6,
                  epsilon_bar=0.1, calibration="clipped", sensitivity="L1: C/n", noise_scale="b = 10 Delta",
                  covered=True, neighbouring="add-remove", note="a note")
    assert (book.per_step.releases, book.per_round.releases, book.whole_run.releases) == (1, 3, 21)
    assert book.whole_run.epsilon_basic == pytest.approx(2.1)
    assert book.per_step.epsilon_pld <= book.per_round.epsilon_pld <= book.whole_run.epsilon_pld
    assert "add-remove" in book.summary() and book.to_dict()["steps_per_round"] == 3


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_calibrate_multiplier_meets_its_target(mechanism: str) -> None:
    multiplier = calibrate_multiplier(mechanism, 50, 4.0, 1e-5)
    reached = pld_epsilon(Release(mechanism, multiplier), 50, 1e-5)
    assert reached <= 4.0 + 1e-9 and reached == pytest.approx(4.0, rel=0.02)
    with pytest.raises(ValueError, match="target-epsilon=1e.06 needs more than 20 per release"):
        calibrate_multiplier(mechanism, 1, 1e6, 1e-5)


def test_the_rdp_accountants_warnings_leave_logging_as_it_was(capfd: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's release (q = 0.2, sigma 1.444): dp-accounting leaves out orders it cannot compute and
    warns through absl, whose log() configures a root logger that has no handler, after which every Flower
    line of the process printed twice. Nothing is printed and the root logger stays without a handler (as
    in a fresh process: pytest's own handlers are set aside for the call)."""
    monkeypatch.setattr(logging.root, "handlers", [])
    epsilon = rdp_epsilon(Release("gaussian", 1.443987, sampling=0.2), 100, 1e-5)
    assert logging.root.handlers == []
    assert 8.0 < epsilon < 9.5  # RDP's bound, above PLD's 8 for the same releases
    assert "absl" not in capfd.readouterr().err


@pytest.mark.parametrize(("release", "count", "method"), [
    (Release("laplace", 20.0), 10**7, "RDP; the PLD accountant is too slow for more than 1000000 releases"),
    (Release("gaussian", 1.0), 10**7, "exact: 10000000 Gaussian releases are one Gaussian; the PLD"),
    (Release("gaussian", 38.0, 0.2), 10**7, "RDP; the PLD accountant is too slow for more than"),
    (Release("laplace", 2.0, 0.1), 10**7, "advanced composition; the PLD accountant is too slow for more"),
    (Release("laplace", 1e-6), 1, "pure composition; the PLD accountant is too slow for an epsilon above"),
])
def test_any_count_of_releases_is_stated_in_seconds_by_a_named_valid_bound(release: Release, count: int,
                                                                          method: str) -> None:
    """Where the PLD accountant would take minutes (or run out of memory), the tightest of the fast bounds,
    each an upper bound, is stated with its name: never below the exact value where one is known."""
    started = time.perf_counter()
    epsilon, how = composed_epsilon(release, count, 1e-5)
    assert time.perf_counter() - started < 15 and how.startswith(method)
    assert math.isfinite(epsilon)
    assert epsilon <= basic_composition(single_release(release, 1e-5 / count), count)
    if release.mechanism == "gaussian" and release.sampling == 1:  # the exact composition, as dp-accounting's
        one = dp_accounting.get_epsilon_gaussian(release.deployed_multiplier / math.sqrt(count), 1e-5)
        assert epsilon == pytest.approx(one, rel=1e-6)
    if release.mechanism == "laplace" and release.sampling == 1 and count == 1:
        assert epsilon == pytest.approx(1e6)  # a pure release's epsilon is 1/multiplier


def test_no_statement_prints_an_epsilon_that_is_not_finite() -> None:
    """Advanced composition of releases of epsilon 1e6 overflows: the statement says there is no finite
    bound, and the JSON stays JSON (null, not Infinity)."""
    assert advanced_composition(1e6, 10, 1e-5) == math.inf
    book = ledger(algorithm="objpm", release=Release("laplace", 1e-6), per_round=10, rounds=5, delta=1e-5,
                  epsilon_bar=1e6, calibration="clipped", sensitivity="L1", noise_scale="b", covered=True,
                  neighbouring="replace-one", note="")
    assert "advanced none (not finite)" in book.summary() and "inf" not in book.summary()
    text = json.dumps(book.to_dict())
    assert "Infinity" not in text and json.loads(text)["whole_run"]["epsilon_advanced"] is None


def test_a_release_without_finite_noise_is_refused() -> None:
    """An infinite multiplier (eps-bar 5e-324 gives one) is no noise anyone can draw; it printed "inf"."""
    with pytest.raises(ValueError, match="noise multiplier inf is not allowed; it must be finite and > 0"):
        Release("laplace", math.inf)


def test_a_delta_the_grid_alone_spends_is_stated_as_no_guarantee_in_words_and_in_json() -> None:
    """At delta = 1e-300 the deployed Gaussian's far tails (2**-64 a release) already take more than delta:
    every scope says "no guarantee" and why, the JSON says it too, with null for the epsilons."""
    book = ledger(algorithm="objpm", release=Release("gaussian", 1.0, 0.2), per_round=10, rounds=10,
                  delta=1e-300, epsilon_bar=1.0, calibration="clipped", sensitivity="L2", noise_scale="sigma",
                  covered=True, neighbouring="add-remove", note="")
    for g in (book.per_step, book.per_round, book.whole_run):
        assert g.epsilon_pld == math.inf
        assert g.method.startswith("no guarantee: at delta=1e-300 the deployed noise's far tails alone")
    assert "per run        (100 releases): no guarantee: at delta=1e-300" in book.summary()
    assert "inf" not in book.summary() and "eps =" not in book.summary()
    whole = json.loads(json.dumps(book.to_dict(), allow_nan=False))["whole_run"]
    assert whole["epsilon_pld"] is None and whole["method"].startswith("no guarantee")
    with pytest.raises(ValueError, match="no noise gives a finite epsilon there") as refused:
        calibrate_multiplier("gaussian", 100, 1e-12, 1e-300)
    assert "target-epsilon=1e-12" in str(refused.value) and "\n" not in str(refused.value)


def test_a_sampled_release_of_little_noise_is_stated_in_seconds_by_amplification() -> None:
    """One Poisson-sampled Gaussian release of multiplier 0.02 (eps-bar 50): its PLD took 46 s to build and
    a ledger asked for it six times. Its epsilon is now amplification by sampling of the unsampled one,
    log(1 + q (e^eps - 1)) at delta / q, which never exceeds the unsampled epsilon."""
    sampled, q = Release("gaussian", 0.02, 0.2), 0.2
    started = time.perf_counter()
    book = ledger(algorithm="objpm", release=sampled, per_round=10, rounds=10, delta=1e-5, epsilon_bar=50.0,
                  calibration="clipped", sensitivity="L2", noise_scale="sigma", covered=True,
                  neighbouring="add-remove", note="")
    assert time.perf_counter() - started < 20
    unsampled = single_release(Release("gaussian", 0.02), 1e-5 / q)
    amplified = unsampled + math.log(q + (1 - q) * math.exp(-unsampled))
    assert single_release(sampled, 1e-5) == pytest.approx(amplified, rel=1e-12)
    assert single_release(sampled, 1e-5) < single_release(Release("gaussian", 0.02), 1e-5)
    assert "the PLD accountant is too slow for an epsilon above 10000" in book.whole_run.method
    assert math.isfinite(book.whole_run.epsilon_pld)
    # above the cut, a sampled release's epsilon is still its PLD's, as before
    assert single_release(Release("gaussian", 1.1, 0.01), 1e-5) == pld_epsilon(Release("gaussian", 1.1, 0.01),
                                                                                1, 1e-5)


def test_between_the_fine_and_the_fast_bounds_the_pld_is_asked_at_the_coarser_interval() -> None:
    """1000 unsampled Laplace releases of eps-bar 2: their fast bounds are above 1000, where the PLD at 1e-3
    is slow; it is asked at 1e-2, said so, and is far below pure composition."""
    epsilon, method = composed_epsilon(Release("laplace", 0.5), 1000, 1e-5)
    assert method == "PLD at the coarser interval 0.01"
    assert epsilon == pld_epsilon(Release("laplace", 0.5), 1000, 1e-5, 1e-2) and epsilon < 2000


@pytest.mark.parametrize(("mechanism", "count", "target", "sampling"), [
    ("gaussian", 10_000, 1000.0, 0.2),  # the PLD calibrates to 1000, the statement's RDP said 2441
    ("gaussian", 10**7, 8.0, 0.2),  # beyond the PLD accountant: the fast bound is inverted
    ("laplace", 10**7, 30.0, 0.2),  # no RDP bound: refused before, now calibrated on advanced composition
    ("laplace", 10**6, 5000.0, 1.0),  # a target above the PLD's range: the PLD at 1e-2 took 32 s
])
def test_a_calibrated_statement_meets_its_target_in_seconds(mechanism: str, count: int, target: float,
                                                             sampling: float) -> None:
    started = time.perf_counter()
    multiplier = calibrate_multiplier(mechanism, count, target, 1e-5, sampling)
    stated, _ = composed_epsilon(Release(mechanism, multiplier, sampling), count, 1e-5)
    assert time.perf_counter() - started < 60
    assert stated <= target and stated > target / 3


def test_one_line_says_which_figure_is_the_guarantee() -> None:
    """A ledger prints an epsilon per step, per round and per run by four methods, and a theorem's (002's
    Theorem 1: 0.05 where the PLD says 0.0143) in its note: one line names the whole run's figure as the one
    to quote, with enough digits (a per-step epsilon of 2e-10 is not printed as 0); none where there is
    none."""
    book = ledger(algorithm="dp-admm", release=Release("gaussian", 1000.0), per_round=1, rounds=200,
                  delta=1e-3, epsilon_bar=0.05, calibration="Theorem 1 (002)", sensitivity="L2",
                  noise_scale="sigma", covered=True, neighbouring="add-remove", note="Theorem 1 of 002: ...",
                  holder="for the whole training set")
    line = book.guarantee()
    assert line == (f"guarantee: eps = {book.whole_run.epsilon_pld:.4g} at delta = 0.001 for the whole run, "
                    "for the whole training set: the per-run figure below, the one to quote; the other "
                    "methods' figures are looser bounds, the per-step and per-round ones parts of the run, "
                    "and the note's theorem is the paper's own, looser bound for the same noise")
    # the figure to quote first, then the run, a round, a step: the whole-run (eps, delta) leads
    summary = book.summary().splitlines()
    assert summary[1] == f"  {line}"
    assert [s.split("(")[0].split()[1] for s in summary[2:5]] == ["run", "round", "step"]
    assert "  Theorem 1 of 002: ..." in summary
    assert 0 < book.per_step.epsilon_pld < 1e-6 and "eps = 0 " not in book.summary()
    assert f"eps = {book.per_step.epsilon_pld:.4g} (" in book.summary()
    clipped = ledger(algorithm="objpm", release=Release("gaussian", 1.0, 0.2), per_round=10, rounds=10,
                     delta=1e-5, epsilon_bar=1.0, calibration="clipped", sensitivity="L2",
                     noise_scale="sigma", covered=True, neighbouring="add-remove", note="")
    assert clipped.guarantee().endswith("the per-step and per-round ones parts of the run")
    none = ledger(algorithm="objpm", release=Release("gaussian", 1.0, 0.2), per_round=10, rounds=10,
                  delta=1e-300, epsilon_bar=1.0, calibration="clipped", sensitivity="L2", noise_scale="sigma",
                  covered=True, neighbouring="add-remove", note="")
    assert none.guarantee().startswith("guarantee: none for the whole run (no guarantee: at delta=1e-300")
    # a run the statement does not cover (002's dual-init=paper: an un-noised gradient) has no figure to quote
    uncovered = dataclasses.replace(clipped, covered=False)
    assert uncovered.guarantee() == ("guarantee: none: the statement does not cover this run (its note says "
                                     f"why); eps = {clipped.whole_run.epsilon_pld:.4g} at delta = 1e-05 for "
                                     "the whole run is nominal only")


def test_past_the_exact_bounds_reach_the_smallest_valid_one_leads() -> None:
    """10^12 unsampled Gaussian releases: the grid's cost leaves the exact composition no delta, and the
    headline used to be advanced composition's 7.6e12 while basic composition's 1.7e12 stood beside it."""
    release = Release("gaussian", 1.0)
    epsilon, method = fast_epsilon(release, 10**12, 1e-5)
    assert method == "basic composition"
    assert epsilon == basic_composition(single_release(release, 1e-5 / 10**12), 10**12)
    assert epsilon < advanced_composition(single_release(release, 1e-5 / (2 * 10**12)), 10**12, 1e-5 / 2)
