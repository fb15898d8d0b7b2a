"""The privacy accountant of paper 004 (Xiao, Ye & Devadas): the a-priori guarantee, the ex-post loss of
eq. (10), the amplification constant gamma of Theorem 2.3 and footnote 1's relaxed composition.

The noise. Agent i adds to every coordinate of its k-th release x_i^k an independent Laplace variate in
the paper's RATE form, density (beta_k / 2) exp(-beta_k |y|): scale 1/beta_k, variance 2/beta_k^2 (the
paper writes "Lap(0, beta_k)"). The mean of x_i^k[l] is Term A (uniform on an interval tau = [lo, hi] when
the agent randomises its aggregation weights, one point when it does not) minus alpha_k times a gradient
of f_i, plus public offsets; alpha_k = 1/D_i for Algorithm 1, eta_k for Algorithms 2 and 2*.

Index convention (the paper's sums run over k = 0..K-1 in places, 1..K in others). Iterations are k = 1..K:
beta_k and alpha_k are the noise rate and the gradient factor of the update that produces x^k (the paper's
beta_{k+1}, alpha_{k+1} for k = 0..K-1), so the default schedule is beta_k = 1.02^k for k = 1..K
(:func:`rates`). Example (a)'s worst-case total is then 4.4587 (d = 14, alpha = 0.1, B = 0.01, K = 100);
starting the powers at 0 would give 4.3713.

What each number is.

* The A-PRIORI (worst-case) loss, ``d alpha_k beta_k B`` per release and its sum over k (Theorem 2.2's
  bound and its corollary, :func:`worst_case`), is THE GUARANTEE: each agent's transcript of exchanged
  iterates is pure epsilon-LDP (delta = 0) against all other agents colluding, who see every exchanged
  iterate of every round. Neighbouring: the agent's loss f_i replaced by any f_i' of its family F_i, with
  sup_x ||grad f_i(x) - grad f_i'(x)||_inf <= B = B_inf (the paper prints the sensitivity on function
  values; the proofs of Theorems 2.2 and 2.3 shift the mean by alpha_k times the gradient difference).
  Trusted: nobody; the agent's weights, its D_i and its noise stay with it. It holds whether or not the agent
  randomises its weights, and it does not depend on the data. :func:`relaxed_composition` (footnote 1)
  turns the same per-release values into an (epsilon', delta) guarantee.
* The EX-POST loss of eq. (10) (:func:`ex_post`) is the privacy loss of the realised output, given the
  true interval tau of Term A's mean. tau is computed from the agent's own gradient, i.e. from its private
  data, so the ex-post value is itself data-dependent (Sec. 5's "30% below" figures are such values):
  publishing it leaks. It is a
  DIAGNOSTIC of how much the random aggregator amplified privacy in a run, never the guarantee.
* gamma (Theorem 2.3, :func:`gamma`) is the EXPECTED ex-post loss of one release relative to the worst
  case, over the noise, for an interval of length omega: an amplification constant of the mechanism
  (a property of omega, beta and alpha B only), again not a guarantee. Eq. (11) as printed
  (:func:`gamma_eq11`) is NOT an upper bound of it: it is marginally below the exact value in many cells
  (a branch choice in its derivation, Appendix D), so the accounting uses the exact value.

A run's statement (:class:`Statement`, :func:`statement`) puts the a-priori guarantee of a configuration in
words, with what it covers. It is not the project's ledger (:mod:`dpadmm.privacy.ledger`), which composes
one noise multiplier repeated; the schedules here vary per step. Like the ledger, it describes the mechanism
a deployment runs: a deployed agent releases its iterate by the grid Laplace mechanism
(:func:`dpadmm.privacy.secure.laplace_release`), which is pure (d alpha_k beta_k B + c)-LDP per release
where the continuous mechanism is (d alpha_k beta_k B)-LDP, with c = :func:`~dpadmm.privacy.secure.
laplace_epsilon_cost` (2**-GRID_BITS), so the statement's epsilon adds K c (about 2.3e-8 for K = 100) to
the paper's sum, and a calibrated run's rates meet target-epsilon minus K c. The per-iteration ``epsilon``
metric (:func:`loss_through`) stays the paper's sum, the number its figures plot.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpadmm.decentral.config import DecentralConfig
from dpadmm.privacy.device import RunCost, RunRequest, config_digest
from dpadmm.privacy.randomness import NO_RUN
from dpadmm.privacy.secure import laplace_epsilon_cost

PAPER_GROWTH = 1.02  # beta_k = 1.02^k (Sec. 5, "following [43], [48]": diminishing noise)
_LOG_MAX = math.log(sys.float_info.max)  # a power base^k with k ln(base) beyond it overflows

Number = float | torch.Tensor


# --------------------------------------------------------------------------------------- a priori

def geometric(base: float, rounds: int, first: int = 1, name: str = "base") -> list[float]:
    """base^k for k = first .. first + rounds - 1: a schedule of rates beta_k or steps eta_k. ``name`` is the
    base's in the refusal of powers beyond floating point (:func:`_check_powers`)."""
    if not (base > 0 and math.isfinite(base)):
        raise ValueError(f"base={base!r} is not allowed; give a finite value > 0")
    if rounds < 0:
        raise ValueError(f"rounds={rounds!r} is not allowed; give a count >= 0")
    _check_powers(name, base, first + rounds - 1, first)
    return [base**k for k in range(first, first + rounds)]


def _check_powers(name: str, base: float, last: int, first: int = 1) -> None:
    """Refuse base^k for k up to ``last`` where it overflows a float: as a Laplace rate beta_k it would be
    noise of scale 0, so no finite guarantee (1.02^k does past k = 35,842)."""
    if base <= 1 or last * math.log(base) < _LOG_MAX:
        return
    largest = math.floor(_LOG_MAX / math.log(base))
    raise ValueError(f"{name}={base:g} over {last - first + 1} rounds is not allowed: {name}^k overflows a "
                     f"float past k = {largest} (a Laplace rate of infinity is noise of scale 0: no "
                     f"guarantee); give at most {largest - first + 1} rounds or a {name} closer to 1")


def rates(rounds: int, growth: float = PAPER_GROWTH, first: int = 1) -> list[float]:
    """The paper's Laplace rates beta_k = growth^k, k = 1..K by default (``first=0`` gives the other
    reading of its indices, k = 0..K-1). ``growth`` >= 1 makes the noise diminish."""
    if not (growth >= 1 and math.isfinite(growth)):
        raise ValueError(f"growth={growth!r} is not allowed; give a finite value >= 1 (rates that do not "
                         "fall, i.e. noise that does not grow)")
    return geometric(growth, rounds, first, name="noise-growth")


def _check_positive(name: str, value: float, *, zero: bool = False) -> None:
    ok = value >= 0 if zero else value > 0
    if not (ok and math.isfinite(value)):
        raise ValueError(f"{name}={value!r} is not allowed; give a finite value {'>=' if zero else '>'} 0")


def step_bound(d: int, alpha: float, beta: float, bound: float) -> float:
    """d alpha_k beta_k B: the a-priori pure-LDP loss of one release of d coordinates (Theorem 2.2: each
    coordinate's mean moves by at most alpha_k B, which Laplace of rate beta_k prices at alpha_k beta_k B)."""
    if d < 1:
        raise ValueError(f"d={d!r} is not allowed; give the number of coordinates, >= 1")
    for name, value in (("alpha", alpha), ("beta", beta), ("bound", bound)):
        _check_positive(name, value, zero=name != "beta")
    return d * alpha * beta * bound


def _pairs(alphas: float | Sequence[float], betas: Sequence[float]) -> list[tuple[float, float]]:
    if isinstance(alphas, int | float):
        return [(float(alphas), b) for b in betas]
    if len(alphas) != len(betas):
        raise ValueError(f"{len(alphas)} alphas and {len(betas)} betas are not allowed; give one alpha per "
                         "beta, or one alpha for all")
    return list(zip(alphas, betas, strict=True))


def worst_case_curve(d: int, alphas: float | Sequence[float], betas: Sequence[float], bound: float
                     ) -> list[float]:
    """The a-priori loss after each release k = 1..K: sum_{j <= k} d alpha_j beta_j B (Fig. 2(b)'s "worst
    case" curve). ``alphas``: one alpha_k per release, or a constant (1/D for Algorithm 1)."""
    total, curve = 0.0, []
    for alpha, beta in _pairs(alphas, betas):
        total += step_bound(d, alpha, beta, bound)
        curve.append(total)
    return curve


def worst_case(d: int, alphas: float | Sequence[float], betas: Sequence[float], bound: float) -> float:
    """sum_k d alpha_k beta_k B over the K releases: the run's pure-LDP guarantee per agent (Theorem 2.2 by
    basic composition; its corollary, which the paper calls the worst case and which matches [42], [43])."""
    curve = worst_case_curve(d, alphas, betas, bound)
    return curve[-1] if curve else 0.0


def algorithm_1_rate(epsilon: float, penalty: float, bound: float, rounds: int, d: int) -> float:
    """beta = epsilon D / (B K d) (Theorem 3.3): a constant rate for which Algorithm 1's K releases of d
    coordinates (alpha = 1/D) cost exactly epsilon, epsilon / (K d) each coordinate and release."""
    for name, value in (("epsilon", epsilon), ("penalty", penalty), ("bound", bound)):
        _check_positive(name, value)
    if rounds < 1 or d < 1:
        raise ValueError(f"rounds={rounds!r}, d={d!r} are not allowed; give counts >= 1")
    return epsilon * penalty / (bound * rounds * d)


def algorithm_2_rates(epsilon: float, steps: Sequence[float], bound: float, d: int) -> list[float]:
    """beta_k = epsilon / (d K eta_k B) (Theorem 3.4's calibration; scale d K eta_k B / epsilon) for the steps
    eta_1..eta_K: every release then costs epsilon / K, the run exactly epsilon."""
    _check_positive("epsilon", epsilon)
    _check_positive("bound", bound)
    if not steps or d < 1:
        raise ValueError(f"{len(steps)} steps and d={d!r} are not allowed; give at least one step and d >= 1")
    for eta in steps:
        _check_positive("a step eta_k", eta)
    return [_algorithm_2_rate(epsilon, eta, len(steps), bound, d) for eta in steps]


def _algorithm_2_rate(epsilon: float, eta: float, rounds: int, bound: float, d: int) -> float:
    return epsilon / (d * rounds * eta * bound)


def relaxed_composition(epsilons: Iterable[float] | torch.Tensor, delta: float) -> float:
    """Footnote 1 (Kairouz, Oh & Viswanath [49], their Theorem 3.5 with delta_i = 0): releases that are
    epsilon_j-DP each, composed, are (epsilon', delta)-DP with

        epsilon' = sum_j (e^eps_j - 1) eps_j / (e^eps_j + 1) + sqrt(-2 sum_j eps_j^2 log delta).

    ``epsilons`` are the per-release, per-coordinate values (any shape: they are flattened), a-priori
    (alpha_k beta_k B, repeated d times per release; then it is a guarantee) or ex-post (then it is not:
    G8). (e^e - 1) / (e^e + 1) is computed as tanh(e / 2). The theorem also allows the basic sum; take the
    smaller of the two where a single number is wanted.
    """
    eps = torch.as_tensor(epsilons if isinstance(epsilons, torch.Tensor) else list(epsilons),
                          dtype=torch.float64).flatten()
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} is not allowed; give a value in (0, 1)")
    if eps.numel() and not bool(torch.isfinite(eps).all() and (eps >= 0).all()):
        raise ValueError(f"epsilons with {eps[~(torch.isfinite(eps) & (eps >= 0))][:3].tolist()} are not "
                         "allowed; every epsilon must be finite and >= 0")
    mean_part = (eps * torch.tanh(eps / 2)).sum()
    return float(mean_part + torch.sqrt(-2.0 * eps.square().sum() * math.log(delta)))


# --------------------------------------------------------------------------------------- ex post

def _log_beta_mass(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """log(beta J(x; lo, hi)) for lo <= hi, J = int_lo^hi exp(-beta |x - y|) dy, in the log domain:

        x < lo:        beta J = exp(-beta (lo - x)) (1 - exp(-beta (hi - lo)))
        x > hi:        beta J = exp(-beta (x - hi)) (1 - exp(-beta (hi - lo)))
        lo <= x <= hi: beta J = (1 - exp(-beta (x - lo))) + (1 - exp(-beta (hi - x)))

    (eq. (10) of Theorem 2.3, integrated in closed form), with expm1 so that no branch overflows or cancels
    for large beta * distance.
    """
    width = -torch.expm1(-beta * (hi - lo))
    left = -beta * (lo - x).clamp(min=0) + torch.log(width)
    right = -beta * (x - hi).clamp(min=0) + torch.log(width)
    inside = torch.log(-torch.expm1(-beta * (x - lo).clamp(min=0))
                       - torch.expm1(-beta * (hi - x).clamp(min=0)))
    return torch.where(x < lo, left, torch.where(x > hi, right, inside))


def _tensors(*values: Number) -> list[torch.Tensor]:
    """float64 tensors on the device of the first tensor among ``values``, broadcast to one shape."""
    device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    return list(torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.float64, device=device)
                                          for v in values)))


def log_mass(x: Number, lo: Number, hi: Number, beta: Number) -> torch.Tensor:
    """log J(x; lo, hi) = log int_lo^hi exp(-beta |x - y|) dy, elementwise (endpoints in any order; -inf for
    an empty interval): the log-likelihood of observing x, up to the constant log(beta / (2 omega)), when
    the mean is uniform on [lo, hi] and the noise Laplace of rate beta."""
    x, lo, hi, beta = _tensors(x, lo, hi, beta)
    a, b = torch.minimum(lo, hi), torch.maximum(lo, hi)
    return _log_beta_mass(x, a, b, beta) - torch.log(beta)


def ex_post(x: Number, lo: Number, hi: Number, shift: Number, beta: Number) -> torch.Tensor:
    """The ex-post loss of eq. (10), elementwise over any batch shape (runs x agents x coordinates, ...):

        epsilon(x) = max_{|t| <= s} | log J(x; lo, hi) - log J(x; lo + t, hi + t) |,

    x the observed (noisy) coordinate, [lo, hi] the interval on which its mean was uniform (endpoints in
    any order; lo == hi for fixed weights), s = alpha_k B the largest shift of that interval a neighbouring
    f_i' can cause, beta the Laplace rate. float64, on the device of the tensor arguments.

    No search over t: g(t) = log J(x; lo + t, hi + t) is concave in t (the convolution of a box with a
    log-concave kernel is log-concave), so g(0) - g(t) is largest at t = -s or t = +s, and g(t) - g(0) at
    the maximiser of g clipped to [-s, s], t* = clip(x - (lo + hi)/2, -s, s) (g is symmetric about
    x - (lo + hi)/2 and unimodal).

    Always <= beta s. Exactly beta s when x lies outside the interval (x <= lo or x >= hi: then x is also
    outside the interval shifted away from it, and g is linear there), so for lo == hi (no randomisation:
    the worst case) everywhere; strictly less when lo < x < hi and s > 0 (Theorem 2.2). The value depends
    on the agent's private interval: a diagnostic, not the guarantee (module docstring).
    """
    x, lo, hi, shift, beta = _tensors(x, lo, hi, shift, beta)
    if x.device.type == "cpu":  # a value check on an accelerator would make every call wait for it
        _check_ex_post(x, lo, hi, shift, beta)
    a, b = torch.minimum(lo, hi), torch.maximum(lo, hi)
    worst = beta * shift
    base = _log_beta_mass(x, a, b, beta)
    lowest = torch.minimum(_log_beta_mass(x, a + shift, b + shift, beta),
                           _log_beta_mass(x, a - shift, b - shift, beta))
    centre = torch.minimum(torch.maximum(x - (a + b) / 2, -shift), shift)
    highest = _log_beta_mass(x, a + centre, b + centre, beta)
    inside = torch.maximum(base - lowest, highest - base).clamp(min=0)
    inside = torch.minimum(inside, worst)  # the bound holds exactly; this removes rounding above it
    return torch.where((x <= a) | (x >= b), worst, inside)


def _check_ex_post(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, shift: torch.Tensor,
                   beta: torch.Tensor) -> None:
    for name, value in (("x", x), ("lo", lo), ("hi", hi)):
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} with non-finite values ({value[~torch.isfinite(value)][:3].tolist()}) "
                             "is not allowed")
    if not bool((torch.isfinite(shift) & (shift >= 0)).all()):
        raise ValueError(f"shift with {shift[~(shift >= 0)][:3].tolist() or 'non-finite values'} is not "
                         "allowed; the shift bound s = alpha_k B must be finite and >= 0")
    if not bool((torch.isfinite(beta) & (beta > 0)).all()):
        raise ValueError(f"beta with {beta[~(beta > 0)][:3].tolist() or 'non-finite values'} is not allowed; "
                         "the Laplace rate must be finite and > 0")


# --------------------------------------------------------------------------------------- gamma

def _gauss_legendre(breaks: list[float], panels: int, order: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of composite Gauss-Legendre on the pieces between ``breaks``, ``panels`` each."""
    nodes, weights = np.polynomial.legendre.leggauss(order)
    xs, ws = [], []
    for left, right in zip(breaks[:-1], breaks[1:], strict=True):
        edges = np.linspace(left, right, panels + 1)
        half = (edges[1:] - edges[:-1])[:, None] / 2
        xs.append(((edges[1:] + edges[:-1])[:, None] / 2 + half * nodes).ravel())
        ws.append((half * weights).ravel())
    return np.concatenate(xs), np.concatenate(ws)


def gamma(omega: float, beta: float, shift: float, *, panels: int = 16, order: int = 16) -> float:
    """The exact amplification constant of Theorem 2.3: E[epsilon(x)] / (beta s) for x = m + Laplace(rate
    beta), m ~ Uniform[0, omega], epsilon of eq. (10) for the interval [0, omega] and s = alpha B.

    Outside [0, omega] the loss is beta s, and x lands there with probability (1 - e^{-beta omega}) /
    (beta omega); inside, the density of x is (2 - e^{-beta x} - e^{-beta (omega - x)}) / (2 omega) and the
    loss is :func:`ex_post`, integrated by composite Gauss-Legendre (``panels`` panels of ``order`` nodes)
    on the pieces between the loss's kinks (s, omega - s, omega/2 and omega/2 +- s; converged to about 1e-12
    at the defaults, tested against scipy and Monte Carlo). omega = 0 gives 1 (no randomisation: the worst
    case). An expectation over the noise: a diagnostic, not a guarantee.
    """
    _check_positive("omega", omega, zero=True)
    _check_positive("beta", beta)
    _check_positive("shift", shift)
    if omega == 0:
        return 1.0
    u = beta * omega
    outside = -math.expm1(-u) / u
    kinks = {0.0, omega, shift, omega - shift, omega / 2, omega / 2 - shift, omega / 2 + shift}
    breaks = sorted(k for k in kinks if 0 <= k <= omega)
    nodes, weights = _gauss_legendre(breaks, panels, order)
    x = torch.from_numpy(nodes)
    density = (-torch.expm1(-beta * x) - torch.expm1(-beta * (omega - x))) / (2 * omega)
    loss = ex_post(x, 0.0, omega, shift, beta)
    inside = float((torch.from_numpy(weights) * density * loss).sum())
    return outside + inside / (beta * shift)


def gamma_eq11(omega: float, beta: float, shift: float) -> float:
    """Eq. (11) of Theorem 2.3 as printed, with e^{alpha beta B} (Appendix D's eq. (27) prints e^{omega alpha
    B}, a typo), in closed form, for omega > s = alpha B:

        (1 / (beta s)) log{ e^{beta s} [1 - 2 I_1] + 2 I_2 },
        I_1 = int_0^c int_0^omega Phi,  I_2 = int_0^c int_{-s}^{omega - s} Phi,  c = (omega - s)/2,
        Phi(x, y) = beta / (2 omega) e^{-beta |x - y|}.

    For x in [0, c] both inner integrals are the "inside" case of J, which integrates in closed form. NOT
    an upper bound of :func:`gamma` (Appendix D's branch choice): kept for comparison with the paper.
    """
    _check_positive("beta", beta)
    _check_positive("shift", shift)
    if not (omega > shift and math.isfinite(omega)):
        raise ValueError(f"omega={omega!r} is not allowed with alpha B = {shift!r}; Theorem 2.3 needs "
                         "omega > alpha B")
    s, c = shift, (omega - shift) / 2
    # int_0^c (2 - e^{-beta x} - e^{-beta (omega - x)}) dx and int_0^c (2 - e^{-beta (x + s)} - e^{-beta
    # (omega - s - x)}) dx, each over 2 omega
    i1 = (2 * c + math.expm1(-beta * c) / beta
          - math.exp(-beta * omega) * math.expm1(beta * c) / beta) / (2 * omega)
    i2 = (2 * c + math.exp(-beta * s) * math.expm1(-beta * c) / beta
          - math.exp(-beta * (omega - s)) * math.expm1(beta * c) / beta) / (2 * omega)
    return math.log(math.exp(beta * s) * (1 - 2 * i1) + 2 * i2) / (beta * s)


# --------------------------------------------------------------------------------------- a run's statement


def schedule(config: DecentralConfig, d: int) -> tuple[list[float], list[float]]:
    """(alpha_k, beta_k) of a run's K releases of d coordinates, k = 1..K: beta_k = noise-growth^k, or with
    ``target-epsilon`` the calibration of Theorem 3.3 (ldp-admm) or 3.4 (the others) that makes the run cost
    exactly that epsilon, the grid's K c included (:func:`_paper_target`)."""
    if config.target_epsilon:
        _check_calibration(config, d)
    alphas = [config.alpha(k) for k in range(1, config.rounds + 1)]
    if not config.target_epsilon:
        return alphas, rates(config.rounds, config.noise_growth)
    if config.algorithm == "ldp-admm":
        beta = algorithm_1_rate(_paper_target(config), config.penalty, config.bound, config.rounds, d)
        return alphas, [beta] * config.rounds
    return alphas, algorithm_2_rates(_paper_target(config), alphas, config.bound, d)


def rate(config: DecentralConfig, d: int, k: int) -> float:
    """beta_k, the k-th rate of :func:`schedule`, computed alone: an iteration needs only its own, and
    building all K at every iteration made a run quadratic in K (and K = 10^9 filled memory)."""
    if not config.target_epsilon:
        return geometric(config.noise_growth, 1, k, name="noise-growth")[0]
    _check_calibration(config, d)
    if config.algorithm == "ldp-admm":
        return algorithm_1_rate(_paper_target(config), config.penalty, config.bound, config.rounds, d)
    return _algorithm_2_rate(_paper_target(config), config.alpha(k), config.rounds, config.bound, d)


def loss_through(config: DecentralConfig, d: int, k: int) -> float:
    """sum_{j <= k} d alpha_j beta_j B: the a-priori loss of a run's first k releases (Theorem 2.2 by basic
    composition, the paper's sum, without the grid's cost), in closed form so that any k answers at once:
    a calibrated release costs the target's share (Theorems 3.3, 3.4), an uncalibrated one d B (alpha
    noise-growth)^k, summed as a geometric series (alpha = 1/D for Algorithm 1, step-decay^k otherwise)."""
    if config.target_epsilon:
        _check_calibration(config, d)
        return _paper_target(config) * k / config.rounds
    _check_powers("noise-growth", config.noise_growth, k)
    if config.algorithm == "ldp-admm":
        return d * config.bound / config.penalty * _geometric_sum(config.noise_growth, k)
    return d * config.bound * _geometric_sum(config.step_decay * config.noise_growth, k)


def _paper_target(config: DecentralConfig) -> float:
    """What the calibrated rates must cost, so that with the grid's K c the run costs target-epsilon."""
    return config.target_epsilon - config.rounds * laplace_epsilon_cost()


def _check_calibration(config: DecentralConfig, d: int) -> None:
    """Refuse a target-epsilon that no rates meet: one the deployed grid alone exceeds (2**-GRID_BITS per
    release, :func:`statement`), or one whose rates of Theorem 3.3 (a constant beta) or 3.4 (beta_k grows as
    eta_k = step-decay^k falls, so beta_K is the largest) leave floating point: noise of scale 0 or
    infinity."""
    rounds, target = config.rounds, _paper_target(config)
    grid = rounds * laplace_epsilon_cost()
    if target <= 0:
        raise ValueError(f"target-epsilon={config.target_epsilon:g} is not achievable over "
                         f"rounds={rounds}: the deployed noise's grid alone costs {grid:.4g} "
                         f"({laplace_epsilon_cost():.3g} per release); give a larger target or fewer rounds")
    if config.algorithm == "ldp-admm":
        beta = target * config.penalty / (config.bound * rounds * d)
        rate = "beta = eps D / (B K d) (Theorem 3.3)"
    else:
        eta = config.alpha(rounds)
        scale = d * rounds * eta * config.bound
        beta = target / scale if scale > 0 else math.inf
        rate = f"beta_K = eps / (d K eta_K B) with eta_K = step-decay^K = {eta:.3g} (Theorem 3.4)"
    if not 0 < beta < math.inf:
        decay = "" if config.algorithm == "ldp-admm" else ", or a step-decay closer to 1"
        raise ValueError(f"target-epsilon={config.target_epsilon:g} cannot be calibrated over "
                         f"rounds={rounds}: {rate} is {beta:g}, Laplace noise of scale "
                         f"{'0' if beta else 'infinity'}; give fewer rounds or another target{decay}")


def _geometric_sum(ratio: float, count: int) -> float:
    """sum_{k=1}^{count} ratio^k in closed form (expm1, so that a ratio near 1 does not cancel); inf beyond
    floating point."""
    if ratio == 1:
        return float(count)
    try:
        return ratio * math.expm1(count * math.log(ratio)) / (ratio - 1)
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class Statement:
    """The a-priori privacy of one agent's run, with what it covers (what ``dpadmm privacy`` prints and
    privacy.json holds)."""

    algorithm: str
    epsilon: float  # pure, per agent, the whole run
    releases: int
    coordinates: int
    bound: float  # B_inf used
    proven_bound: float  # 2/b_i
    covered: bool
    noise: str
    note: str
    grid: float = 0.0  # the part of epsilon the deployed grid adds (K 2**-GRID_BITS)
    # which randomness the run used (dpadmm.privacy.randomness.statement); by default none ran yet
    randomness: str = NO_RUN

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        return (f"privacy (004, {self.algorithm}): each agent's {self.releases} exchanged iterates are "
                f"{self.epsilon:.6g}-LDP, pure, a priori ({self.noise}; B_inf = {self.bound:g}). {self.note} "
                f"Randomness: {self.randomness}.")


def statement(config: DecentralConfig, d: int) -> Statement:
    """The a-priori guarantee of ``config`` for d coordinates (Theorem 2.2's bound summed over the run), of
    the deployed mechanism: the grid adds :func:`~dpadmm.privacy.secure.laplace_epsilon_cost` per release
    (module docstring)."""
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with noise='none' adds no noise: it is not "
                         "differentially private")
    paper = loss_through(config, d, config.rounds)
    if not math.isfinite(paper):
        raise ValueError(f"noise-growth={config.noise_growth:g} over rounds={config.rounds} is not allowed: "
                         "the a-priori epsilon, the sum of d alpha_k beta_k B, is beyond floating point (no "
                         "finite guarantee); give fewer rounds or a noise-growth closer to 1")
    noise = (f"Laplace rates calibrated to eps = {config.target_epsilon:g}" if config.target_epsilon
             else f"Laplace of rate beta_k = {config.noise_growth:.12g}^k per coordinate")
    proven = 2 / config.samples
    grid = config.rounds * laplace_epsilon_cost()
    note = (f"The sum over k of d alpha_k beta_k B_inf, plus {laplace_epsilon_cost():.3g} per release for "
            f"the noise's grid ({grid:.2g} in all), against all other agents colluding, who see every "
            "exchanged iterate; neighbouring: one of the agent's samples replaced. Trusted: nobody. Not "
            "covered: what the final model reveals beyond the transcript, and the ex-post loss, which "
            "depends on the agent's data.")
    if not config.covered:
        note += (f" NOT COVERED: B_inf = {config.bound:g} is below 2/b_i = {proven:g}, the bound that holds, "
                 "so the true loss can be up to that ratio larger (the paper's setting).")
    return Statement(algorithm=config.algorithm, epsilon=paper + grid,
                     releases=config.rounds, coordinates=d, bound=config.bound, proven_bound=proven,
                     covered=config.covered, noise=noise, note=note, grid=grid)


def spent(config: DecentralConfig, d: int, releases: int) -> Statement:
    """The statement of a run that stopped after its first ``releases`` of K: their sum of d alpha_k beta_k B
    plus their grid's cost. The rates of those releases are the planned run's: beta_k = noise-growth^k does
    not depend on K, and a rate calibrated to eps over K (Theorems 3.3, 3.4) is the one calibrated to
    eps k / K over k releases, each of which costs eps / K."""
    short = dataclasses.replace(config, rounds=releases,
                                target_epsilon=config.target_epsilon * releases / config.rounds)
    return dataclasses.replace(statement(short, d), noise=statement(config, d).noise)


def mechanism_of(config: DecentralConfig, d: int) -> str:
    """What one agent releases over the run, as its reply states it and the router checks it: Laplace noise
    whose rates give the a-priori epsilon of :func:`statement` for d coordinates; "none" without noise."""
    if not config.private:
        return "none"
    return f"laplace, a-priori epsilon {statement(config, d).epsilon!r} over {config.rounds} releases"


def device_request(config: DecentralConfig, data: str, d: int) -> RunRequest:
    """One agent's run as the device's ledger event (:mod:`dpadmm.privacy.device`): the pure epsilon of
    :func:`statement` for d coordinates, against the other agents; covered when B_inf is at least the proven
    2/b_i. ``data``: the digest of the agent's samples. Its relation is replace-one: the guarantee holds for
    f_i replaced by any loss whose gradient is within B_inf per coordinate, one sample replaced at
    B_inf = 2/b_i (b_i is the run's public ``samples``)."""

    def cost() -> RunCost:  # one release's epsilon is bounded by the run's (the a-priori sum of all of them)
        return RunCost(statement(config, d).epsilon, 0.0, "laplace")

    return RunRequest(algorithm=config.algorithm, rounds=config.rounds,
                      config=config_digest(config.to_mapping()),
                      data=data, private=config.private, covered=config.covered, cost=cost,
                      neighbouring="replace-one")


def stated(config: DecentralConfig) -> Statement:
    """:func:`statement` before any data is read (``dpadmm privacy``): d is the data set's column count."""
    from dpadmm.data.adult import COLUMNS

    return statement(config, len(COLUMNS))
