"""dpadmm.sharing.privacy: Theorem 3's sigma and Corollary 1 at the notes' worked values; the ledger."""

from __future__ import annotations

import math

import pytest

from dpadmm.sharing import privacy
from dpadmm.sharing.config import SharingConfig


@pytest.mark.parametrize(("epsilon", "delta", "ratio"), [(1.0, 1e-5, 4.844805), (0.1, 1e-5, 48.448053),
                                                         (1.0, 1e-3, 3.776480)])
def test_sigma_over_c_is_the_worked_value(epsilon: float, delta: float, ratio: float) -> None:
    assert privacy.theorem_3_std(epsilon, delta, 1.0) == pytest.approx(ratio, abs=1e-6)


@pytest.mark.parametrize(("rounds", "epsilon", "total"), [(10, 0.1, 1.622598), (20, 0.1, 2.356308),
                                                          (10, 1.0, 32.357090)])
def test_eq_17_gives_the_worked_values(rounds: int, epsilon: float, total: float) -> None:
    eps, delta = privacy.corollary_1(epsilon, rounds, 1e-6, 1e-5)
    assert eps == pytest.approx(total, abs=1e-6) and delta == pytest.approx(rounds * 1e-6 + 1e-5)


def test_epsilon_above_one_is_refused_where_theorem_3_does_not_hold() -> None:
    with pytest.raises(ValueError, match="0 < epsilon <= 1"):
        privacy.theorem_3_std(1.5, 1e-5, 1.0)
    with pytest.raises(ValueError, match="epsilon=2.0 is not allowed"):
        SharingConfig(epsilon=2.0)


def test_the_ledger_states_the_sensitivity_the_composition_and_what_is_not_covered() -> None:
    config = SharingConfig(epsilon=0.5, rounds=20, x_bound=2.0)
    ledger = privacy.ledger(config, 10000)
    assert ledger.noise_multiplier == pytest.approx(math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5)
    assert "2 b sqrt(N) = 400" in ledger.sensitivity and ledger.covered
    assert ledger.per_step.epsilon_pld <= 0.5  # the Gaussian mechanism's bound is loose, never exceeded
    total = privacy.corollary_1(0.5, 20, 1e-5, 1e-5)[0]
    assert f"{total:.6g}" in ledger.note and "labels" in ledger.note
    assert ledger.whole_run.epsilon_pld < total  # the PLD accountant is tighter than eq. (17)
    paper = privacy.ledger(SharingConfig(epsilon=0.5, noise="paper"), 10000)
    assert not paper.covered and "NOT covered" in paper.note
    with pytest.raises(ValueError, match="not differentially private"):
        privacy.ledger(SharingConfig(epsilon=math.inf), 10000)


def test_corollary_1_states_no_delta_of_one_or_more() -> None:
    """T delta + delta' >= 1 is no guarantee: the note says so instead of printing (411.518, 2)-DP."""
    note = privacy.ledger(SharingConfig(epsilon=1.0, delta=0.01, rounds=200), 32561).note
    assert "2)-DP" not in note and "gives no guarantee here" in note and "= 2," in note
    assert "Corollary 1 (eq. (17)): the run is (" in privacy.ledger(SharingConfig(rounds=20), 32561).note
