"""dpadmm.iadmm.privacy: DP-IADMM's ledger against dp-accounting called directly; calibration; clipping."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant

from dpadmm.iadmm import privacy, schedules
from dpadmm.iadmm.config import RunConfig
from dpadmm.models.logistic import AgentData, clip_factors, gradient, probabilities
from dpadmm.privacy.ledger import (
    PLD_INTERVAL,
    Release,
    clipped_sensitivity,
    pld_epsilon,
    single_release,
)


def test_ledger_totals_match_dp_accounting_called_directly() -> None:
    config = RunConfig(algorithm="objpm", epsilon=0.3, local_steps=4, rounds=25, delta=1e-6)
    ledger = privacy.ledger(config)
    accountant = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                                      value_discretization_interval=PLD_INTERVAL)
    for _ in range(25):  # round by round, E steps each: the structure of a run
        accountant.compose(dp_accounting.LaplaceDpEvent(1 / 0.3), 4)
    assert ledger.whole_run.epsilon_pld == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-6)
    assert ledger.whole_run.releases == 100 and ledger.per_round.releases == 4
    assert ledger.per_step.epsilon_basic == 0.3 and ledger.whole_run.epsilon_basic == pytest.approx(30.0)
    assert ledger.whole_run.epsilon_pld < ledger.whole_run.epsilon_advanced < ledger.whole_run.epsilon_basic
    assert ledger.covered and "Theorem 1" in ledger.note
    numbers = privacy.ledger(config, total_samples=4000)
    assert "2C/I = 0.1 " in numbers.sensitivity and "0.333333" in numbers.noise_scale
    # an agent that took part in 10 rounds only
    assert privacy.ledger(config, rounds=10).whole_run.releases == 40


def test_the_papers_worked_example() -> None:
    """eps-bar = 0.05 per step, E = 10, T = 20,000: the whole run is far from 0.05."""
    ledger = privacy.ledger(RunConfig(algorithm="objpm", epsilon=0.05, local_steps=10, rounds=20_000))
    assert ledger.per_step.epsilon_pld == pytest.approx(0.05, abs=1e-3)
    assert ledger.per_round.epsilon_pld == pytest.approx(0.49, abs=0.01)
    assert ledger.whole_run.epsilon_pld == pytest.approx(339.5, abs=0.5)
    assert ledger.whole_run.epsilon_basic == pytest.approx(10_000)


def test_outp_ledger_uses_its_gaussian_calibration() -> None:
    config = RunConfig(algorithm="outp", epsilon=0.5, rounds=30)
    rho, inv = 12.0, schedules.outp_inverse_eta(3, 6000, 7840, 0.5, config.outp_delta, 1.0)
    sigma = schedules.outp_sigma(0.5, config.outp_delta, rho, inv)
    multiplier = privacy.outp_multiplier(0.5, config.outp_delta, "replace-one")
    assert multiplier == pytest.approx(sigma / (2 / (rho + inv)))
    ledger = privacy.ledger(config)
    assert ledger.mechanism == "gaussian" and ledger.whole_run.releases == 30
    assert ledger.per_step.epsilon_pld == ledger.per_round.epsilon_pld  # one release per round


def test_data_dependent_ledgers_say_they_are_not_covered() -> None:
    ledger = privacy.ledger(RunConfig(algorithm="objp", epsilon=1.0, sensitivity="data-dependent"))
    assert not ledger.covered and "NOT COVERED" in ledger.summary()


def test_non_private_configurations_have_no_ledger() -> None:
    with pytest.raises(ValueError, match="not differentially private"):
        privacy.ledger(RunConfig(algorithm="iadmm"))


@pytest.mark.parametrize(("algorithm", "target", "rounds"), [("objpm", 8.0, 50), ("objp", 1.0, 100),
                                                              ("outp", 4.0, 40)])
def test_calibration_round_trip(algorithm: str, target: float, rounds: int) -> None:
    calibrated = privacy.calibrate(RunConfig(algorithm=algorithm, target_epsilon=target, rounds=rounds))
    achieved = privacy.ledger(calibrated).whole_run.epsilon_pld
    assert achieved <= target and achieved == pytest.approx(target, rel=0.03)


def test_calibration_of_the_papers_setting_recovers_eps_bar() -> None:
    calibrated = privacy.calibrate(RunConfig(algorithm="objpm", local_steps=10, rounds=20_000,
                                             target_epsilon=339.5))
    assert calibrated.epsilon == pytest.approx(0.05, rel=1e-3)


def test_infeasible_targets_name_the_smallest_achievable_value() -> None:
    with pytest.raises(ValueError, match=r"target-epsilon=1e-09 is not achievable .* smallest achievable"):
        privacy.calibrate(RunConfig(algorithm="objpm", target_epsilon=1e-9, rounds=50))


def test_clipping_bounds_each_term_and_the_sensitivity() -> None:
    gen = torch.Generator().manual_seed(0)
    counts, j, k, total, clip = [30, 30], 6, 4, 60, 0.7
    xs = [torch.rand(c, j, generator=gen, dtype=torch.float64) for c in counts]
    ys = [torch.randint(0, k, (c,), generator=gen) for c in counts]
    # agent 1 holds agent 0's data with one sample replaced: neighbouring data sets
    xs[1], ys[1] = xs[0].clone(), ys[0].clone()
    xs[1][3] = torch.rand(j, generator=gen, dtype=torch.float64) * 5
    ys[1][3] = (ys[0][3] + 1) % k
    data = AgentData.from_blocks(xs, ys, num_classes=k, total=total, agents=[0, 1])
    z = torch.randn(1, j, k, generator=gen, dtype=torch.float64).expand(2, -1, -1).contiguous()
    residual = probabilities(data.x, z) - data.y
    terms = data.x_l1 * (residual * clip_factors(data, residual, clip).unsqueeze(2)).abs().sum(2)
    assert float(terms.max()) <= clip + 1e-12 and float((data.x_l1 * residual.abs().sum(2)).max()) > clip
    g = gradient(data, z, scale=1 / total, reg=0.0, clip=clip)
    assert float((g[0] - g[1]).abs().sum()) <= clipped_sensitivity(clip, total, "replace-one") + 1e-12
    assert clipped_sensitivity(clip, total, "add-remove") == pytest.approx(clip / total)


def test_privacy_spent_composes_the_rounds_an_agent_took_part_in() -> None:
    config = RunConfig(algorithm="objpm", epsilon=0.5, local_steps=3, rounds=40)
    assert privacy.spent(config, 0) == 0.0
    for k in (1, 7, 40):
        expected = privacy.ledger(config, rounds=k).whole_run.epsilon_pld
        assert privacy.spent(config, k) == pytest.approx(expected)
    assert privacy.spent(config, 7) < privacy.spent(config, 8)
    assert privacy.spent(RunConfig(algorithm="iadmm"), 5) == math.inf


def test_gaussian_objective_perturbation_ledger_composes_gaussian_plds() -> None:
    """mechanism='gaussian': T*E Gaussian releases of multiplier 1/eps-bar (std Delta_2 / eps-bar)."""
    config = RunConfig(algorithm="objpm", mechanism="gaussian", epsilon=0.8, local_steps=3, rounds=20,
                       delta=1e-6)
    ledger = privacy.ledger(config, total_samples=5000)
    assert ledger.mechanism == "gaussian" and ledger.noise_multiplier == pytest.approx(1 / 0.8)
    assert ledger.whole_run.releases == 60 and ledger.per_round.releases == 3
    expected = pld_epsilon(Release("gaussian", 1 / 0.8), 60, 1e-6)
    assert ledger.whole_run.epsilon_pld == pytest.approx(expected, rel=1e-12)
    assert ledger.whole_run.epsilon_pld != pytest.approx(pld_epsilon(Release("laplace", 1 / 0.8), 60, 1e-6),
                                                         rel=1e-3)
    assert ledger.per_step.epsilon_pld == pytest.approx(single_release(Release("gaussian", 1.25), 1e-6),
                                                        abs=2 * PLD_INTERVAL)
    assert ledger.sensitivity.startswith("L2: 2C/I = 0.08 ")
    assert "sigma = Delta / eps-bar = 0.1" in ledger.noise_scale
    assert ledger.covered and "Gaussian mechanism" in ledger.note
    assert privacy.spent(config, 20) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("target", "rounds", "steps"), [(2.0, 30, 5), (8.0, 100, 2)])
def test_calibration_of_the_gaussian_mechanism_hits_the_target(target: float, rounds: int,
                                                               steps: int) -> None:
    config = RunConfig(algorithm="objpm", mechanism="gaussian", local_steps=steps, rounds=rounds,
                       target_epsilon=target, model="mlp")
    calibrated = privacy.calibrate(config)
    achieved = privacy.ledger(calibrated).whole_run.epsilon_pld
    assert achieved <= target and achieved == pytest.approx(target, rel=0.03)
    laplace = privacy.calibrate(dataclasses.replace(config, mechanism="laplace"))
    assert calibrated.epsilon != pytest.approx(laplace.epsilon, rel=1e-2)  # a different mechanism's eps-bar


def test_targets_beyond_the_searched_range_name_its_end() -> None:
    """The bracket search stops at the range's smallest multiplier (20 per release for Laplace)."""
    refusal = r"target-epsilon=1e\+06 needs more than 20 per release \(10 releases"
    with pytest.raises(ValueError, match=refusal):
        privacy.calibrate(RunConfig(algorithm="objp", target_epsilon=1e6, rounds=10))
