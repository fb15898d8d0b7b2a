"""dpadmm.sharing.privacy: Theorem 3's sigma and Corollary 1 at the notes' worked values; the ledger."""

from __future__ import annotations

import json
import math
import time

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


@pytest.mark.parametrize(("epsilon", "refusal"), [
    (1e-300, r"epsilon=1e-300 is not achievable per round at delta=1e-05: Theorem 3's noise gives 2.328e-10 "
             r"on the deployed grid, which costs 2.328e-10 at any noise"),
    (1e-320, r"epsilon=9.99989e-321 cannot be calibrated by Theorem 3: the noise it needs is beyond floating "
             r"point; the deployed grid costs 2.328e-10 per round"),
])
def test_an_epsilon_the_deployed_mechanism_cannot_meet_is_refused_in_one_line(epsilon: float,
                                                                               refusal: str) -> None:
    """Theorem 3's per-round (1e-300, delta) was printed while each deployed release costs 2**-32."""
    with pytest.raises(ValueError, match=refusal) as refused:
        privacy.ledger(SharingConfig(epsilon=epsilon), 32561)
    assert "\n" not in str(refused.value)


def test_corollary_1_refused_leaves_a_valid_json_statement_of_the_composition() -> None:
    """The reported run (epsilon 1, delta 0.01, 200 rounds): Corollary 1 is said to give no guarantee, the
    composition (here exact: 200 Gaussian releases are one) is the run's, and the JSON is JSON."""
    ledger = privacy.ledger(SharingConfig(epsilon=1.0, delta=0.01, rounds=200), 32561)
    assert "the composition above is the run's guarantee" in ledger.note and "(PLD) is" not in ledger.note
    stated = json.loads(json.dumps(ledger.to_dict(), allow_nan=False))
    assert 0 < stated["whole_run"]["epsilon_pld"] < 411 and stated["whole_run"]["delta"] == 0.01


def test_a_billion_rounds_are_stated_in_seconds_by_the_exact_gaussian_composition() -> None:
    started = time.perf_counter()
    run = privacy.ledger(SharingConfig(rounds=10**9), 32561).whole_run
    assert time.perf_counter() - started < 30
    assert run.method.startswith("exact: 1000000000 Gaussian releases are one Gaussian")
    assert math.isfinite(run.epsilon_pld) and run.epsilon_pld <= run.epsilon_rdp
