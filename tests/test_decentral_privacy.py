"""dpadmm.decentral.privacy: 004's a-priori guarantee and its calibrations, the ex-post loss of eq. (10),
gamma of Theorem 2.3 against a table of eq. (10) integrated numerically apart from this code, and footnote
1's relaxed composition."""

from __future__ import annotations

import math
import time

import pytest
import torch
from scipy import integrate

from dpadmm.decentral import privacy
from dpadmm.decentral.config import DecentralConfig
from dpadmm.privacy.secure import laplace_epsilon_cost

# ------------------------------------------------------------------------------------------ a priori


def test_example_a_worst_case_is_the_notes_total_for_both_index_conventions() -> None:
    """Example (a) of Sec. 5: d = 14, alpha = 1/D = 0.1, B = 0.01, beta_k = 1.02^k, K = 100: 4.4587 for
    k = 1..100 (the convention here), 4.3713 for k = 0..99; beta_100 = 7.2446."""
    betas = privacy.rates(100)
    assert betas[0] == pytest.approx(1.02) and betas[-1] == pytest.approx(7.2446, abs=1e-4)
    assert privacy.worst_case(14, 0.1, betas, 0.01) == pytest.approx(4.4587, abs=5e-5)
    assert privacy.worst_case(14, 0.1, privacy.rates(100, first=0), 0.01) == pytest.approx(4.3713, abs=5e-5)
    # the closed form of the geometric sum: d alpha B * 1.02 (1.02^100 - 1) / 0.02
    assert privacy.worst_case(14, 0.1, betas, 0.01) == pytest.approx(
        14 * 0.1 * 0.01 * 1.02 * (1.02**100 - 1) / 0.02, rel=1e-12)


def test_the_curve_accumulates_the_step_bounds_and_alphas_may_vary() -> None:
    betas = privacy.rates(5, growth=1.1)
    steps = privacy.geometric(0.93, 5)  # Algorithm 2*'s eta_k = 0.93^k
    curve = privacy.worst_case_curve(3, steps, betas, 0.02)
    expected = [sum(3 * steps[j] * betas[j] * 0.02 for j in range(k + 1)) for k in range(5)]
    assert curve == pytest.approx(expected, rel=1e-14)
    assert privacy.step_bound(3, steps[0], betas[0], 0.02) == pytest.approx(3 * 0.93 * 1.1 * 0.02)
    assert privacy.worst_case(3, 0.5, [], 0.02) == 0.0


@pytest.mark.parametrize(("epsilon", "rounds", "d"), [(1.0, 100, 14), (0.3, 7, 3), (8.0, 1, 1)])
def test_theorem_3_3_calibration_makes_algorithm_1_cost_exactly_epsilon(epsilon: float, rounds: int,
                                                                       d: int) -> None:
    beta = privacy.algorithm_1_rate(epsilon, 10.0, 0.01, rounds, d)
    assert beta == pytest.approx(epsilon * 10 / (0.01 * rounds * d))
    assert privacy.worst_case(d, 1 / 10.0, [beta] * rounds, 0.01) == pytest.approx(epsilon, rel=1e-12)


def test_theorem_3_4_calibration_makes_algorithm_2_cost_exactly_epsilon() -> None:
    steps = privacy.geometric(0.9, 50)
    betas = privacy.algorithm_2_rates(2.0, steps, 0.01, 14)
    assert betas[0] == pytest.approx(2.0 / (14 * 50 * 0.9 * 0.01))
    assert privacy.worst_case(14, steps, betas, 0.01) == pytest.approx(2.0, rel=1e-12)
    curve = privacy.worst_case_curve(14, steps, betas, 0.01)
    assert curve[9] == pytest.approx(2.0 * 10 / 50, rel=1e-12)  # epsilon / K per release


@pytest.mark.parametrize(("call", "message"), [
    (lambda: privacy.rates(10, growth=0.9), "growth=0.9"),
    (lambda: privacy.step_bound(0, 0.1, 1.0, 0.01), "d=0"),
    (lambda: privacy.step_bound(3, 0.1, 0.0, 0.01), "beta=0.0"),
    (lambda: privacy.worst_case(3, [0.1, 0.2], [1.0], 0.01), "2 alphas and 1 betas"),
    (lambda: privacy.algorithm_1_rate(-1.0, 10.0, 0.01, 10, 3), "epsilon=-1.0"),
    (lambda: privacy.algorithm_2_rates(1.0, [], 0.01, 3), "0 steps"),
    (lambda: privacy.relaxed_composition([0.1], 1.0), "delta=1.0"),
    (lambda: privacy.relaxed_composition([0.1, -0.2], 0.1), "-0.2"),
    (lambda: privacy.ex_post(0.0, 0.0, 1.0, 0.001, -2.0), "beta with \\[-2.0\\]"),
    (lambda: privacy.ex_post(0.0, 0.0, 1.0, -0.001, 2.0), "shift with \\[-0.001\\]"),
    (lambda: privacy.ex_post(math.nan, 0.0, 1.0, 0.001, 2.0), "x with non-finite"),
    (lambda: privacy.gamma_eq11(0.001, 2.0, 0.001), "omega > alpha B"),
])
def test_bad_arguments_are_refused_with_the_value(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------------------------------ footnote 1


def test_footnote_1_against_a_hand_computed_value() -> None:
    """eps = (0.1, 0.2), delta = 0.01 by hand: 0.1 (e^0.1 - 1)/(e^0.1 + 1) = 0.0049958, 0.2 (e^0.2 - 1)/
    (e^0.2 + 1) = 0.0199336, sqrt(2 (0.01 + 0.04) ln 100) = sqrt(0.4605170) = 0.6786140: 0.7035434."""
    assert privacy.relaxed_composition([0.1, 0.2], 0.01) == pytest.approx(0.7035434, abs=1e-7)
    # a tensor of any shape is flattened
    as_tensor = privacy.relaxed_composition(torch.tensor([[0.1], [0.2]]), 0.01)
    assert as_tensor == pytest.approx(0.7035434, abs=1e-7)
    assert privacy.relaxed_composition([], 0.5) == 0.0


def test_footnote_1_is_far_below_the_basic_sum_for_example_a() -> None:
    """1400 releases of alpha beta_k B = 1e-3 beta_k each: the relaxed value at delta = 1e-5 is 0.663,
    a seventh of the pure 4.4587."""
    per_coordinate = [0.1 * b * 0.01 for b in privacy.rates(100) for _ in range(14)]
    relaxed = privacy.relaxed_composition(per_coordinate, 1e-5)
    squares = sum(e * e for e in per_coordinate)
    assert relaxed == pytest.approx(sum(e * math.tanh(e / 2) for e in per_coordinate)
                                    + math.sqrt(2 * squares * math.log(1e5)), rel=1e-12)
    assert relaxed == pytest.approx(0.66305, abs=1e-5)


# ------------------------------------------------------------------------------------------ ex post

BETA, SHIFT = 4.0, 0.01  # alpha B = 0.01


def _numeric_j(x: float, lo: float, hi: float, beta: float) -> float:
    return integrate.quad(lambda y: math.exp(-beta * abs(x - y)), lo, hi, points=[x] if lo < x < hi else None,
                          epsabs=0, epsrel=1e-13)[0]


@pytest.mark.parametrize(("x", "lo", "hi", "beta"), [
    (-0.3, 0.0, 0.5, 4.0), (0.2, 0.0, 0.5, 4.0), (0.9, 0.0, 0.5, 4.0), (0.5, 0.0, 0.5, 4.0),
    (0.01, 0.0, 1.0, 10.0), (3.0, -1.0, 2.5, 0.5), (-0.7, 2.0, -1.0, 7.0),  # endpoints reversed
])
def test_closed_form_j_matches_quadrature(x: float, lo: float, hi: float, beta: float) -> None:
    assert float(privacy.log_mass(x, lo, hi, beta)) == pytest.approx(
        math.log(_numeric_j(x, min(lo, hi), max(lo, hi), beta)), abs=1e-11)


def test_log_mass_is_stable_far_away_and_minus_infinity_for_a_point() -> None:
    far = privacy.log_mass(-50.0, 0.0, 1.0, 1e3)  # J = e^{-50000} (1 - e^{-1000}) / 1000, far below 1e-308
    assert float(far) == pytest.approx(-50_000 - math.log(1e3), rel=1e-14)
    assert float(privacy.log_mass(0.3, 0.5, 0.5, 2.0)) == -math.inf


def _brute_force(x: float, lo: float, hi: float, shift: float, beta: float) -> float:
    ts = torch.linspace(-shift, shift, 20001, dtype=torch.float64)
    base = privacy.log_mass(x, lo, hi, beta)
    return float((base - privacy.log_mass(x, lo + ts, hi + ts, beta)).abs().max())


@pytest.mark.parametrize("x", [0.003, 0.02, 0.1, 0.245, 0.25, 0.255, 0.4, 0.497])
def test_the_concavity_shortcut_equals_a_search_over_t(x: float) -> None:
    got = float(privacy.ex_post(x, 0.0, 0.5, SHIFT, BETA))
    assert got == pytest.approx(_brute_force(x, 0.0, 0.5, SHIFT, BETA), rel=1e-6, abs=1e-12)


def test_never_above_alpha_beta_b_equal_outside_and_strictly_below_inside() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 10, 14, generator=generator, dtype=torch.float64)  # runs x agents x coordinates
    lo = 0.3 * torch.randn(4, 10, 14, generator=generator, dtype=torch.float64)
    hi = lo + torch.rand(4, 10, 14, generator=generator, dtype=torch.float64)
    beta = torch.tensor([1.0, 3.0, 10.0, 300.0], dtype=torch.float64).view(4, 1, 1)
    shift = torch.full((10, 1), 0.02, dtype=torch.float64)
    eps = privacy.ex_post(x, lo, hi, shift, beta)
    assert eps.shape == (4, 10, 14) and eps.dtype == torch.float64 and torch.isfinite(eps).all()
    worst = (beta * shift).expand_as(eps)
    assert (eps <= worst).all() and (eps >= 0).all()
    outside = (x <= lo) | (x >= hi)
    assert torch.equal(eps[outside], worst[outside]) and outside.sum() > 100
    inside = ~outside
    assert (eps[inside] < worst[inside]).all() and inside.sum() > 100


def test_outside_both_intervals_the_loss_is_the_worst_case_even_for_large_beta_distance() -> None:
    eps = privacy.ex_post(torch.tensor([-1e4, 1e4, -0.5, 2.0]), 0.0, 1.0, 0.001, 1e4)
    assert torch.equal(eps, torch.full((4,), 10.0, dtype=torch.float64))


def test_symmetric_in_t_mirror_and_endpoint_order_do_not_matter() -> None:
    """Mirroring x about the centre of the interval (t <-> -t) or swapping its endpoints changes nothing."""
    x = torch.linspace(-0.2, 0.8, 101, dtype=torch.float64)
    eps = privacy.ex_post(x, 0.1, 0.5, SHIFT, BETA)
    assert torch.allclose(eps, privacy.ex_post(0.6 - x, 0.1, 0.5, SHIFT, BETA), rtol=0, atol=1e-13)
    assert torch.equal(eps, privacy.ex_post(x, 0.5, 0.1, SHIFT, BETA))


def test_a_point_interval_is_the_worst_case_and_a_vanishing_one_tends_to_it() -> None:
    x = torch.linspace(-1, 1, 11, dtype=torch.float64)
    assert torch.equal(privacy.ex_post(x, 0.2, 0.2, SHIFT, BETA), torch.full_like(x, BETA * SHIFT))
    tiny = privacy.ex_post(0.3 + 5e-10, 0.3, 0.3 + 1e-9, SHIFT, BETA)  # inside an interval of length 1e-9
    assert float(tiny) == pytest.approx(BETA * SHIFT, rel=1e-6)
    assert float(tiny) < BETA * SHIFT
    assert privacy.gamma(1e-9, BETA, SHIFT) == pytest.approx(1.0, abs=1e-6)
    assert privacy.gamma(0.0, BETA, SHIFT) == 1.0


def test_no_shift_no_loss() -> None:
    assert torch.equal(privacy.ex_post(torch.tensor([-1.0, 0.5, 2.0]), 0.0, 1.0, 0.0, 3.0), torch.zeros(3,
                       dtype=torch.float64))


# ------------------------------------------------------------------------------------------ gamma

OMEGAS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
BETAS = (2, 4, 6, 8, 10)
# gamma from eq. (10) of Theorem 2.3 by numerical integration (worked out apart from this code), alpha B =
# 0.001: rows omega, columns beta = 2..10
EXACT = (
    (0.9526, 0.9081, 0.8664, 0.8273, 0.7906),
    (0.9072, 0.8257, 0.7540, 0.6908, 0.6348),
    (0.8250, 0.6896, 0.5838, 0.5004, 0.4340),
    (0.7527, 0.5833, 0.4648, 0.3800, 0.3179),
    (0.6889, 0.4996, 0.3797, 0.3006, 0.2463),
    (0.6327, 0.4330, 0.3174, 0.2461, 0.1993),
)
EQ_11 = (
    (0.9517, 0.9065, 0.8643, 0.8248, 0.7878),
    (0.9064, 0.8245, 0.7526, 0.6892, 0.6333),
    (0.8243, 0.6888, 0.5831, 0.4998, 0.4336),
    (0.7522, 0.5828, 0.4645, 0.3798, 0.3178),
    (0.6886, 0.4993, 0.3796, 0.3006, 0.2464),
    (0.6324, 0.4328, 0.3174, 0.2462, 0.1995),
)


def test_gamma_reproduces_the_notes_table() -> None:
    """Both halves of the table (Fig. 1's grid) within 1e-3; in fact within the table's rounding."""
    for row, omega in enumerate(OMEGAS):
        for column, beta in enumerate(BETAS):
            assert privacy.gamma(omega, beta, 0.001) == pytest.approx(EXACT[row][column], abs=1e-3)
            assert privacy.gamma(omega, beta, 0.001) == pytest.approx(EXACT[row][column], abs=6e-5)
            assert privacy.gamma_eq11(omega, beta, 0.001) == pytest.approx(EQ_11[row][column], abs=6e-5)
    # G9: eq. (11) is not an upper bound of the exact value (here it is below it)
    assert privacy.gamma_eq11(0.1, 2, 0.001) < privacy.gamma(0.1, 2, 0.001)


def test_gamma_falls_with_omega_and_beta() -> None:
    """Theorem 2.3's claim: a longer interval and less noise amplify more."""
    grid = [[privacy.gamma(omega, beta, 0.001) for beta in BETAS] for omega in OMEGAS]
    assert all(a > b for row in grid for a, b in zip(row, row[1:], strict=False))
    assert all(a > b for column in zip(*grid, strict=True) for a, b in zip(column, column[1:], strict=False))


def test_gamma_quadrature_has_converged_and_matches_monte_carlo() -> None:
    for omega, beta, shift in ((0.4, 6.0, 0.05), (1.0, 10.0, 0.001), (2.0, 50.0, 0.01), (0.05, 3.0, 0.04)):
        fine = privacy.gamma(omega, beta, shift, panels=512, order=24)
        assert privacy.gamma(omega, beta, shift) == pytest.approx(fine, abs=1e-10)
    generator = torch.Generator().manual_seed(1)
    n, omega, beta, shift = 200_000, 0.4, 6.0, 0.05
    mean = omega * torch.rand(n, generator=generator, dtype=torch.float64)
    noise = -torch.log1p(-torch.rand(n, generator=generator, dtype=torch.float64)) / beta  # Exp(rate beta)
    sign = torch.where(torch.rand(n, generator=generator, dtype=torch.float64) < 0.5, -1.0, 1.0)
    ratio = privacy.ex_post(mean + sign * noise, 0.0, omega, shift, beta) / (beta * shift)
    assert float(ratio.mean()) == pytest.approx(privacy.gamma(omega, beta, shift), abs=4 * float(ratio.std())
                                                / math.sqrt(n))


def test_gamma_eq11_closed_form_matches_its_double_integrals() -> None:
    omega, beta, shift = 0.3, 5.0, 0.02
    c = (omega - shift) / 2

    def phi(y: float, x: float) -> float:
        return beta / (2 * omega) * math.exp(-beta * abs(x - y))

    i1 = integrate.dblquad(phi, 0, c, 0, omega, epsabs=1e-13)[0]
    i2 = integrate.dblquad(phi, 0, c, -shift, omega - shift, epsabs=1e-13)[0]
    printed = math.log(math.exp(beta * shift) * (1 - 2 * i1) + 2 * i2) / (beta * shift)
    assert privacy.gamma_eq11(omega, beta, shift) == pytest.approx(printed, abs=1e-8)


def test_gamma_exact_matches_a_direct_quadrature_of_eq_10() -> None:
    """The expectation over the real line, by scipy, of the loss against the density of Laplace * Uniform."""
    omega, beta, shift = 0.3, 5.0, 0.02

    def integrand(x: float) -> float:
        density = beta / (2 * omega) * _numeric_j(x, 0.0, omega, beta)
        return float(privacy.ex_post(x, 0.0, omega, shift, beta)) * density

    kinks = [0.0, shift, omega / 2 - shift, omega / 2, omega / 2 + shift, omega - shift, omega]
    total = integrate.quad(integrand, -math.inf, 0)[0] + integrate.quad(integrand, omega, math.inf)[0]
    total += sum(integrate.quad(integrand, a, b, epsabs=1e-12)[0]
                 for a, b in zip(kinks, kinks[1:], strict=False))
    assert privacy.gamma(omega, beta, shift) == pytest.approx(total / (beta * shift), abs=1e-7)


# ------------------------------------------------------------------------------------------ any K


def test_rates_beyond_floating_point_are_refused_with_the_last_round_that_fits() -> None:
    """beta_k = 1.02^k overflows past k = 35,842: K = 40,000 ended in an OverflowError traceback (and a rate
    of infinity would be noise of scale 0)."""
    refusal = (r"noise-growth=1.02 over 40000 rounds is not allowed: noise-growth\^k overflows a float past "
               r"k = 35842 .* give at most 35842 rounds")
    with pytest.raises(ValueError, match=refusal):
        privacy.statement(DecentralConfig(rounds=40_000), 14)
    assert len(privacy.rates(35_842)) == 35_842 and math.isfinite(privacy.rates(35_842)[-1])


def test_a_billion_rounds_are_stated_at_once_by_the_closed_form() -> None:
    """The statement and the per-iteration loss sum in closed form; they agree with the sum release by
    release, and a calibrated run's statement, the grid's cost included, is its target."""
    config = DecentralConfig(rounds=10**9, noise_growth=1.0)
    started = time.perf_counter()
    stated = privacy.statement(config, 14)
    assert time.perf_counter() - started < 5
    assert stated.epsilon == pytest.approx(10**9 * 14 * 0.1 * 0.02 + stated.grid, rel=1e-12)
    for config in (DecentralConfig(rounds=30_000, noise_growth=1.00001),
                   DecentralConfig(algorithm="dgd", rounds=500, step_decay=0.99)):
        alphas, betas = privacy.schedule(config, 14)
        curve = privacy.worst_case_curve(14, alphas, betas, config.bound)
        for k in (1, 17, config.rounds):
            assert privacy.loss_through(config, 14, k) == pytest.approx(curve[k - 1], rel=1e-11)
            assert privacy.rate(config, 14, k) == betas[k - 1]
    steps = DecentralConfig(algorithm="dgd", rounds=10**9, noise_growth=1.00000001, step_decay=0.99)
    assert privacy.statement(steps, 14).epsilon == pytest.approx(  # sum of d B (0.99 x 1.00000001)^k
        14 * 0.02 * 0.99 * 1.00000001 / (1 - 0.99 * 1.00000001) + 10**9 * laplace_epsilon_cost(), rel=1e-9)
    calibrated = privacy.statement(DecentralConfig(rounds=10**9, target_epsilon=2.0), 14)
    assert calibrated.epsilon == pytest.approx(2.0, rel=1e-12) and calibrated.grid > 0.2


@pytest.mark.parametrize(("changes", "refusal"), [
    ({"target_epsilon": 1e-300}, r"target-epsilon=1e-300 is not achievable over rounds=100: the deployed "
                                 r"noise's grid alone costs 2.328e-08"),
    ({"target_epsilon": 1.0, "algorithm": "ldp-dgd-star", "rounds": 20_000},
     r"target-epsilon=1 cannot be calibrated over rounds=20000: beta_K = eps / \(d K eta_K B\) with eta_K = "
     r"step-decay\^K = 0 \(Theorem 3.4\) is inf, Laplace noise of scale 0"),
    ({"target_epsilon": 1e308, "penalty": 1e10},
     r"target-epsilon=1e\+308 cannot be calibrated over rounds=100: beta = eps D / \(B K d\) \(Theorem 3.3\) "
     r"is inf"),
])
def test_a_target_no_rates_meet_is_refused_in_one_line(changes: dict, refusal: str) -> None:
    """Tiny targets were "met" while the grid alone cost more; rates past floating point ended in a
    traceback or a statement of noise of scale 0."""
    config = DecentralConfig(**changes)
    for call in (lambda: privacy.statement(config, 14), lambda: privacy.schedule(config, 14)):
        with pytest.raises(ValueError, match=refusal) as refused:
            call()
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("changes", [{}, {"target_epsilon": 2.0},
                                     {"algorithm": "dgd", "step_decay": 0.9, "target_epsilon": 2.0}])
def test_a_stopped_run_states_what_its_first_releases_spent(changes: dict) -> None:
    """A run stopped after k of its K releases spent the sum over its first k rates, which are the planned
    run's (a calibrated rate depends on K), plus k grid costs; after all K it spent the planned statement."""
    config = DecentralConfig(rounds=20, **changes)
    alphas, betas = privacy.schedule(config, 14)
    spent = privacy.spent(config, 14, 7)
    paper = privacy.worst_case(14, alphas[:7], betas[:7], config.bound)
    assert spent.releases == 7 and spent.grid == 7 * laplace_epsilon_cost()
    assert spent.epsilon == pytest.approx(paper + spent.grid, rel=1e-12)
    assert spent.noise == privacy.statement(config, 14).noise
    assert privacy.spent(config, 14, 20).epsilon == pytest.approx(privacy.statement(config, 14).epsilon,
                                                                  rel=1e-12)
