"""dpadmm.iadmm.privacy: DP-IADMM's ledger against dp-accounting called directly; calibration; clipping."""

from __future__ import annotations

import dataclasses
import math
import time

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from scipy import optimize

from dpadmm.iadmm import calibration, privacy, schedules
from dpadmm.iadmm.config import RunConfig, papers
from dpadmm.models.logistic import AgentData, clip_factors, gradient, probabilities
from dpadmm.privacy.ledger import (
    PLD_INTERVAL,
    Release,
    clipped_sensitivity,
    pld_epsilon,
    single_release,
)


def test_ledger_totals_match_dp_accounting_called_directly() -> None:
    config = papers(algorithm="objpm", epsilon=0.3, local_steps=4, rounds=25, delta=1e-6)
    ledger = privacy.ledger(config)
    accountant = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                                      value_discretization_interval=PLD_INTERVAL)
    for _ in range(25):  # round by round, E steps each: the structure of a run
        accountant.compose(dp_accounting.LaplaceDpEvent(1 / 0.3), 4)
    # the deployed grid mechanism (dpadmm/privacy/secure.py) costs far less than the digits printed
    assert ledger.whole_run.epsilon_pld == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-6)
    assert ledger.whole_run.releases == 100 and ledger.per_round.releases == 4
    # the deployed discrete Laplace on the grid: pure 0.3 + 2**-32 per step (dpadmm/privacy/secure.py)
    assert ledger.per_step.epsilon_basic == pytest.approx(0.3 + 2.0**-32, rel=1e-15)
    assert ledger.whole_run.epsilon_basic == pytest.approx(30.0)
    assert ledger.whole_run.epsilon_pld < ledger.whole_run.epsilon_advanced < ledger.whole_run.epsilon_basic
    assert ledger.covered and "Theorem 1" in ledger.note
    numbers = privacy.ledger(config, total_samples=4000)
    assert "2C/I = 0.1 " in numbers.sensitivity and "0.333333" in numbers.noise_scale
    # an agent that took part in 10 rounds only
    assert privacy.ledger(config, rounds=10).whole_run.releases == 40


def test_the_papers_worked_example() -> None:
    """eps-bar = 0.05 per step, E = 10, T = 20,000: the whole run is far from 0.05."""
    ledger = privacy.ledger(papers(algorithm="objpm", epsilon=0.05, local_steps=10, rounds=20_000))
    assert ledger.per_step.epsilon_pld == pytest.approx(0.05, abs=1e-3)
    assert ledger.per_round.epsilon_pld == pytest.approx(0.49, abs=0.01)
    assert ledger.whole_run.epsilon_pld == pytest.approx(339.5, abs=0.5)
    assert ledger.whole_run.epsilon_basic == pytest.approx(10_000)


def test_outp_ledger_uses_its_gaussian_calibration() -> None:
    config = papers(algorithm="outp", epsilon=0.5, rounds=30)
    rho, inv = 12.0, schedules.outp_inverse_eta(3, 6000, 7840, 0.5, config.outp_delta, 1.0)
    sigma = schedules.outp_sigma(0.5, config.outp_delta, rho, inv)
    multiplier = calibration.outp_multiplier(0.5, config.outp_delta, "replace-one")
    assert multiplier == pytest.approx(sigma / (2 / (rho + inv)))
    ledger = privacy.ledger(config)
    assert ledger.mechanism == "gaussian" and ledger.whole_run.releases == 30
    assert ledger.per_step.epsilon_pld == ledger.per_round.epsilon_pld  # one release per round


def test_data_dependent_ledgers_say_they_are_not_covered() -> None:
    ledger = privacy.ledger(papers(algorithm="objp", epsilon=1.0, sensitivity="data-dependent"))
    assert not ledger.covered and "NOT COVERED" in ledger.summary()


def test_non_private_configurations_have_no_ledger() -> None:
    with pytest.raises(ValueError, match="not differentially private"):
        privacy.ledger(papers(algorithm="iadmm"))


@pytest.mark.parametrize(("algorithm", "target", "rounds"), [("objpm", 8.0, 50), ("objp", 1.0, 100),
                                                              ("outp", 4.0, 40)])
def test_calibration_round_trip(algorithm: str, target: float, rounds: int) -> None:
    calibrated = privacy.calibrate(papers(algorithm=algorithm, target_epsilon=target, rounds=rounds))
    achieved = privacy.ledger(calibrated).whole_run.epsilon_pld
    assert achieved <= target and achieved == pytest.approx(target, rel=0.03)


@pytest.mark.slow
def test_calibration_of_the_papers_setting_recovers_eps_bar() -> None:
    calibrated = privacy.calibrate(papers(algorithm="objpm", local_steps=10, rounds=20_000,
                                             target_epsilon=339.5))
    assert calibrated.epsilon == pytest.approx(0.05, rel=1e-3)


def test_infeasible_targets_name_the_smallest_achievable_value() -> None:
    with pytest.raises(ValueError, match=r"target-epsilon=1e-09 is not achievable .* smallest achievable"):
        privacy.calibrate(papers(algorithm="objpm", target_epsilon=1e-9, rounds=50))


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
    config = papers(algorithm="objpm", epsilon=0.5, local_steps=3, rounds=40)
    assert privacy.spent(config, 0) == 0.0
    for k in (1, 7, 40):
        expected = privacy.ledger(config, rounds=k).whole_run.epsilon_pld
        assert privacy.spent(config, k) == pytest.approx(expected)
    assert privacy.spent(config, 7) < privacy.spent(config, 8)
    assert privacy.spent(papers(algorithm="iadmm"), 5) == math.inf


def test_gaussian_objective_perturbation_ledger_composes_gaussian_plds() -> None:
    """mechanism='gaussian': T*E Gaussian releases of multiplier 1/eps-bar (std Delta_2 / eps-bar)."""
    config = papers(algorithm="objpm", mechanism="gaussian", epsilon=0.8, local_steps=3, rounds=20,
                       delta=1e-6)
    ledger = privacy.ledger(config, total_samples=5000)
    assert ledger.mechanism == "gaussian" and ledger.noise_multiplier == pytest.approx(1 / 0.8)
    assert ledger.whole_run.releases == 60 and ledger.per_round.releases == 3
    expected = pld_epsilon(Release("gaussian", 1 / 0.8), 60, 1e-6)
    # unsampled Gaussian releases compose exactly into one Gaussian: that is quoted, a hair under the PLD's
    assert ledger.whole_run.method == ("exact: 60 Gaussian releases are one Gaussian, tighter than the "
                                       "PLD's 47.92")
    assert ledger.whole_run.epsilon_pld == pytest.approx(expected, rel=1e-6)
    assert ledger.whole_run.epsilon_pld <= expected
    assert ledger.whole_run.epsilon_pld != pytest.approx(pld_epsilon(Release("laplace", 1 / 0.8), 60, 1e-6),
                                                         rel=1e-3)
    assert ledger.per_step.epsilon_pld == pytest.approx(single_release(Release("gaussian", 1.25), 1e-6),
                                                        abs=2 * PLD_INTERVAL)
    # I is the samples of all agents, not of one
    assert ledger.sensitivity == "L2: 2C/I = 0.08 (C = 200, I = 5000 samples of all agents)"
    assert "sigma = Delta x 1.25 = 0.1" in ledger.noise_scale  # a multiplier, no epsilon
    assert ledger.covered and "Gaussian mechanism (noise multiplier sigma / Delta = 1.25)" in ledger.note
    assert "epsilon" not in ledger.note  # the per-step epsilon is the ledger's, not 1 / multiplier
    assert privacy.spent(config, 20) == ledger.whole_run.epsilon_pld


@pytest.mark.parametrize(("target", "rounds", "steps"), [(2.0, 30, 5), (8.0, 100, 2)])
def test_calibration_of_the_gaussian_mechanism_hits_the_target(target: float, rounds: int,
                                                               steps: int) -> None:
    config = papers(algorithm="objpm", mechanism="gaussian", local_steps=steps, rounds=rounds,
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
        privacy.calibrate(papers(algorithm="objp", target_epsilon=1e6, rounds=10))


# ----- Poisson subsampling (sampling-rate q < 1) -----

def _sampled(mechanism: str, **kwargs) -> RunConfig:
    values = {"algorithm": "objpm", "mechanism": mechanism, "clip_norm": 1.0, "sampling_rate": 0.1,
              "neighbouring": "add-remove", "rounds": 10, "local_steps": 10, **kwargs}
    return papers(**values)


def test_a_sampled_gaussian_ledger_agrees_with_opacus_accountants() -> None:
    """T E Poisson-sampled Gaussian steps at rate q, noise multiplier 1/eps-bar: the run's epsilon is
    Opacus's (its PRV accountant against our PLD, its RDP accountant against our RDP)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    config = _sampled("gaussian", epsilon=0.9)
    run = privacy.ledger(config).whole_run
    assert run.releases == 100
    for accountant, ours in ((PRVAccountant(), run.epsilon_pld), (RDPAccountant(), run.epsilon_rdp)):
        accountant.history = [(1 / 0.9, 0.1, 100)]
        assert ours == pytest.approx(accountant.get_epsilon(1e-5), rel=0.01)
    unsampled = privacy.ledger(dataclasses.replace(config, sampling_rate=1.0)).whole_run
    assert run.epsilon_pld < unsampled.epsilon_pld / 5


def _sampled_laplace_epsilon(b: float, q: float, steps: int, delta: float, bin_width: float = 1e-4) -> float:
    """epsilon at delta of ``steps`` Poisson-sampled Laplace releases (scale b, sensitivity 1), add or remove
    one record, computed here from first principles: the privacy loss L of one release, its distribution
    discretised (rounded up: pessimistic) and convolved ``steps`` times with numpy's FFT, and
    delta(eps) = E[(1 - e^(eps - L))+]; the larger epsilon of the two directions.

    Removing the record: P = (1 - q) Lap(0, b) + q Lap(1, b) against Q = Lap(0, b), so
    L(x) = ln(1 - q + q exp((|x| - |x - 1|) / b)): two atoms (x <= 0, x >= 1) and a continuous part on (0, 1).
    Adding it: the roles swap, loss -L(x) with x ~ Lap(0, b).
    """
    x = (np.arange(200_000) + 0.5) / 200_000  # midpoints of (0, 1)
    lap = lambda v: np.exp(-np.abs(v) / b) / (2 * b)  # noqa: E731
    tail = 0.5 * math.exp(-1 / b)
    loss = lambda v: np.log1p(q * np.expm1((np.abs(v) - np.abs(v - 1)) / b))  # noqa: E731
    mixture = ((1 - q) * lap(x) + q * lap(x - 1)) / x.size
    directions = (  # (losses, their probabilities under the first distribution)
        (np.r_[loss(np.array([-1.0, 2.0])), loss(x)],
         np.r_[(1 - q) * 0.5 + q * tail, (1 - q) * tail + q * 0.5, mixture]),
        (np.r_[-loss(np.array([-1.0, 2.0])), -loss(x)], np.r_[0.5, tail, lap(x) / x.size]),
    )
    worst = 0.0
    for losses, mass in directions:
        low = math.floor(losses.min() / bin_width)
        index = np.ceil(losses / bin_width).astype(int) - low
        pmf = np.bincount(index, weights=mass)
        size = steps * (pmf.size - 1) + 1
        composed = np.fft.irfft(np.fft.rfft(pmf, 2 * size) ** steps, 2 * size)[:size].clip(min=0)
        values = (np.arange(size) + steps * low) * bin_width

        def excess(eps: float, composed=composed, values=values) -> float:
            positive = values > eps
            return float((composed[positive] * -np.expm1(eps - values[positive])).sum()) - delta

        hi = float(values[-1])
        worst = max(worst, 0.0 if excess(0.0) <= 0 else optimize.brentq(excess, 0.0, hi, xtol=1e-7))
    return worst


@pytest.mark.parametrize(("eps_bar", "q", "steps"), [(0.5, 0.1, 1), (2.0, 0.05, 1), (0.5, 0.1, 100)])
def test_a_sampled_laplace_ledger_equals_a_first_principles_computation(eps_bar: float, q: float,
                                                                          steps: int) -> None:
    """One step and a hundred, each Poisson-sampled Laplace (L1 clip, multiplier 1/eps-bar): dp-accounting's
    PLD (the ledger) against the privacy loss integrated and composed in numpy. The RDP accountant has no
    bound for it, and the ledger says so (nan, printed n/a)."""
    config = _sampled("laplace", epsilon=eps_bar, sampling_rate=q, rounds=steps, local_steps=1,
                      algorithm="objp")
    run = privacy.ledger(config).whole_run
    reference = _sampled_laplace_epsilon(1 / eps_bar, q, steps, 1e-5)
    assert run.epsilon_pld == pytest.approx(reference, rel=0.01, abs=2e-3)
    assert run.epsilon_pld < eps_bar * steps  # amplified: below the unsampled composition
    assert math.isnan(run.epsilon_rdp) and "RDP n/a" in privacy.ledger(config).summary()
    assert privacy.ledger(config).to_dict()["whole_run"]["epsilon_rdp"] is None  # JSON null, not NaN


def test_a_sampled_ledger_states_the_relation_the_rate_and_the_trust() -> None:
    ledger = privacy.ledger(_sampled("gaussian", epsilon=1.0), total_samples=60_000)
    assert ledger.neighbouring == "add-remove"
    assert "C/(qI) = 0.000166667" in ledger.sensitivity and "q = 0.1" in ledger.sensitivity
    assert "PoissonSampledDpEvent" in ledger.note and "never depends on the data" in ledger.note
    assert "reproducible from the run config" in ledger.randomness  # who must not know the seed, said


def test_budget_first_calibration_credits_the_sampling() -> None:
    """target-epsilon with q < 1: the calibrated eps-bar gives the target through the sampled ledger, and is
    far larger than the full-batch calibration's."""
    config = privacy.calibrate(_sampled("gaussian", target_epsilon=8.0))
    assert privacy.ledger(config).whole_run.epsilon_pld == pytest.approx(8.0, rel=0.01)
    assert privacy.ledger(config).whole_run.epsilon_pld <= 8.0
    full = privacy.calibrate(_sampled("gaussian", target_epsilon=8.0, sampling_rate=1.0))
    assert config.epsilon > 3 * full.epsilon
    assert privacy.spent(config, 10) == pytest.approx(privacy.ledger(config).whole_run.epsilon_pld, rel=1e-9)


# ----- statements that cannot be made, and statements that must come fast -----

def test_an_eps_bar_whose_noise_is_beyond_floating_point_is_refused_in_one_line() -> None:
    """eps-bar = 5e-324 made a multiplier of inf: the ledger printed "b = Delta / eps-bar = inf" and its
    JSON an Infinity token."""
    refusal = r"epsilon=5e-324 is not allowed: the noise it calibrates"
    with pytest.raises(ValueError, match=refusal) as refused:
        privacy.ledger(papers(algorithm="objpm", epsilon=5e-324), total_samples=4000)
    assert "\n" not in str(refused.value)


def test_a_run_without_a_finite_guarantee_ends_on_no_guarantee_not_inf() -> None:
    config = papers(algorithm="objpm", mechanism="gaussian", epsilon=1.0, delta=1e-300, rounds=5,
                       clip_norm=1.0)
    ledger = privacy.ledger(config)
    assert ledger.whole_run.epsilon_pld == math.inf and privacy.spent(config, 5) == math.inf
    line = privacy.headline(ledger, 0.1)
    assert "privacy of the whole run (50 releases): no guarantee: at delta=1e-300" in line
    assert "inf" not in line
    assert privacy.step_line(config).startswith("no guarantee at delta = 1e-300 per local step")


def test_a_sampled_ledger_of_little_noise_is_stated_in_seconds() -> None:
    """The main job with eps-bar 50 set directly (multiplier 0.02, q = 0.2): 150 s before, the single
    sampled release's PLD built for every scope; now the amplification bound, and the run by RDP."""
    config = _sampled("gaussian", epsilon=50.0, sampling_rate=0.2)
    started = time.perf_counter()
    run = privacy.ledger(config).whole_run
    assert time.perf_counter() - started < 30
    assert math.isfinite(run.epsilon_pld) and run.method.startswith("RDP; the PLD accountant is too slow")
