"""dpadmm.linadmm.privacy: Theorem 1's sigma through the configuration; a ledger that says what it covers."""

from __future__ import annotations

import math

import pytest

from dpadmm.linadmm import privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.privacy.ledger import Release, rdp_epsilon

# NOTES-002 section 3, "Worked values for tests" (c = 1, delta = 1e-3, mu = 0.5): eps, alpha, n, T, sigma.
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
    """NOTES-002's worked value: eps 0.1, delta 1e-3, mu 0.5, T 100, n 32,561 (a9a), c 1: sigma
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
