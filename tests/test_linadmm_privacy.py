"""dpadmm.linadmm.privacy: Theorem 1's sigma through the configuration; a ledger that says what it covers."""

from __future__ import annotations

import math
import warnings

import pytest

from dpadmm.linadmm import privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.privacy.ledger import Release, rdp_epsilon

# Theorem 1 (eq. (8)) worked out apart from this code (c = 1, delta = 1e-3, mu = 0.5): eps, alpha, n, T,
# sigma.
WORKED = [
    (0.01, 1382.551056, 32561, 100, 1.141939e-01),
    (0.02, 691.775528, 32561, 100, 5.711759e-02),
    (0.05, 277.310211, 32561, 100, 2.287179e-02),
    (0.1, 139.155106, 32561, 100, 1.145650e-02),
    (0.1, 139.155106, 22696, 100, 1.643616e-02),
    (0.1, 139.155106, 49990, 100, 7.462192e-03),
    (0.1, 139.155106, 72876, 100, 5.118763e-03),
    (1.0, 14.815511, 32561, 100, 1.182117e-03),
    (0.01, 1382.551056, 32561, 1000, 3.611128e-01),
]


@pytest.mark.parametrize(("eps", "alpha", "n", "rounds", "sigma"), WORKED)
def test_eq_8_gives_the_worked_sigma_and_its_rdp_conversion_returns_epsilon(
        eps: float, alpha: float, n: int, rounds: int, sigma: float) -> None:
    assert privacy.rdp_order(eps, 1e-3, 0.5) == pytest.approx(alpha, abs=1e-6)  # printed to 6 decimals
    got = privacy.theorem_1_std(eps, 1e-3, 0.5, rounds, 1.0 / n)
    assert got == pytest.approx(sigma, rel=1e-6)
    # the round trip: T Gaussian releases of multiplier sigma / Delta at the order alpha give eps exactly
    assert privacy.single_order_epsilon(got * n, rounds, 1e-3, alpha) == pytest.approx(eps, rel=1e-8)


def test_sigma_is_the_worked_value_and_replace_one_doubles_it() -> None:
    """Theorem 1 (eq. (8)) worked out apart from this code: eps 0.1, delta 1e-3, mu 0.5, T 100, n 32,561
    (a9a), c 1: sigma
    1.145650e-02."""
    config = LinAdmmConfig(target_epsilon=0.1, rounds=100)
    assert privacy.noise_std(config, 32561) == pytest.approx(1.145650e-02, rel=1e-6)
    replaced = LinAdmmConfig(target_epsilon=0.1, rounds=100, neighbouring="replace-one")
    assert privacy.noise_std(replaced, 32561) == pytest.approx(2 * 1.145650e-02, rel=1e-6)
    assert privacy.sensitivity(replaced, 32561) == pytest.approx(2 / 32561)
    assert privacy.noise_std(LinAdmmConfig(target_epsilon=math.inf), 32561) == 0.0


@pytest.mark.parametrize("eps", [0.01, 0.05, 0.1, 1.0])
def test_the_accountants_confirm_theorem_1s_budget(eps: float) -> None:
    """The paper's conversion at one order meets the budget exactly; dp-accounting's RDP (over its orders)
    and PLD accountants, composing the same T Gaussian releases, give no more."""
    config = LinAdmmConfig(target_epsilon=eps, rounds=200)
    ledger = privacy.ledger(config, 32561)
    run = ledger.whole_run
    assert run.releases == 200 and ledger.mechanism == "gaussian"
    assert run.epsilon_pld <= run.epsilon_rdp <= eps * (1 + 1e-9)
    release = Release("gaussian", ledger.noise_multiplier)
    assert run.epsilon_rdp == pytest.approx(rdp_epsilon(release, 200, 1e-3))
    assert f"gives eps = {eps:.6g} at delta = 0.001" in ledger.note


def test_the_ledger_names_the_relation_who_is_trusted_and_what_is_not_covered() -> None:
    ledger = privacy.ledger(LinAdmmConfig(neighbouring="replace-one"), 1000)
    text = ledger.summary()
    assert "neighbouring: replace-one; for the whole training set" in text and "2c/n = 0.002" in text
    assert "the server, central DP" in text and "the graph W" in text and ledger.covered
    paper = privacy.ledger(LinAdmmConfig(dual_init="paper"), 1000)
    assert not paper.covered and "dual-init = paper" in paper.note
    with pytest.raises(ValueError, match="target-epsilon=inf adds no noise"):
        privacy.ledger(LinAdmmConfig(target_epsilon=math.inf), 1000)


@pytest.mark.parametrize(("target", "refusal"), [
    (1e-300, r"target-epsilon=1e-300 cannot be calibrated by Theorem 1 over rounds=200: the noise it needs "
             r"is beyond floating point; the deployed grid costs 1.284e-08 at any noise"),
    (1e-9, r"target-epsilon=1e-09 is not achievable with 200 releases at delta=0.001: Theorem 1's noise "
           r"gives 1.284e-08 on the deployed grid, which costs 1.284e-08 at any noise"),
    (1e9, r"target-epsilon=1e\+09 cannot be calibrated by Theorem 1 over rounds=200: its noise multiplier "
          r"sigma / Delta = 0.0004472 is below the deployed sampler's 2\*\*-10; the largest target it "
          r"reaches is 2.097e\+08"),
])
def test_a_target_theorem_1_cannot_meet_is_refused_in_one_line(target: float, refusal: str) -> None:
    """A tiny target made sigma = inf ("noise sigma = inf" and a note claiming eps = 5e-301); one below what
    the deployed grid costs was claimed by the note; a huge one failed on the multiplier, not naming it."""
    with pytest.raises(ValueError, match=refusal) as refused:
        privacy.ledger(LinAdmmConfig(target_epsilon=target, rounds=200), 32561)
    assert "\n" not in str(refused.value)


def test_the_largest_target_is_where_the_multiplier_reaches_the_samplers_floor() -> None:
    config = LinAdmmConfig(target_epsilon=1.0, rounds=200)
    largest = privacy._largest_target(config)
    sigma = privacy.theorem_1_std(largest, config.delta, config.rdp_mu, 200, 1.0)
    assert sigma == pytest.approx(2.0**-10, rel=1e-9)
    assert privacy.ledger(LinAdmmConfig(target_epsilon=largest * 0.999, rounds=200), 32561).covered


def test_a_billion_rounds_answer_in_seconds_and_meet_their_target_or_are_refused() -> None:
    """T = 1e9: the whole run is stated by a named fast bound, at most the target; the default target 0.05
    is below what 1e9 releases on the deployed grid cost with Theorem 1's sigma, and is refused."""
    run = privacy.ledger(LinAdmmConfig(target_epsilon=100.0, rounds=10**9), 32561).whole_run
    assert run.epsilon_pld <= 100.0 and "the PLD accountant is too slow for more than" in run.method
    with pytest.raises(ValueError, match="target-epsilon=0.05 is not achievable with 1000000000 releases"):
        privacy.ledger(LinAdmmConfig(rounds=10**9), 32561)


def test_a_long_runs_statement_prints_no_numpy_warning() -> None:
    """dp_accounting's Gaussian search meets log(e^x - e^y) at y = x for 30,000 releases; its -inf is right,
    and `dpadmm privacy` must not print NumPy's divide-by-zero warning for it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stated = privacy.ledger(LinAdmmConfig(rounds=30_000), 32_561)
    assert 0 < stated.whole_run.epsilon_pld <= 0.05  # below Theorem 1's target, which is loose
