"""The privacy of DP-ADMM / DP-AccADMM (002 Theorem 1): sigma from the whole-run budget, and its ledger.

Every iteration releases the full-batch mean of the per-sample gradients, clipped to L2 norm
c, plus N(0, sigma^2 I) (the Gaussian mechanism); everything else is post-processing. One
sample added or removed moves the mean by at most c/n (the paper's Delta), one replaced by
2c/n. Theorem 1 picks sigma so that T such releases are (epsilon, delta)-DP through RDP at one
order; the ledger states that value next to dp-accounting's RDP (optimal order) and PLD
accountants for the same T releases. DP-AccADMM queries the gradient once per iteration too
(at x-hat), so the same sigma holds.

Who is trusted: the party that adds the noise sees the exact gradients. Run centrally, that is
the data holder (the paper's setting); on Flower, the server (central DP). A deployed server draws the
noise from its own secret and releases the mean by the grid Gaussian mechanism
(:func:`dpadmm.privacy.secure.gaussian_release`), whose rounding and discrete noise cost a tiny, fixed
amount per release (:mod:`dpadmm.privacy.secure`): the ledger's accountants compose that deployed
mechanism, grid included (:mod:`dpadmm.privacy.ledger`); the note's single-order value of Theorem 1 is the
paper's, for the continuous one. Not covered: the
graph W, computed from the training features, and the paper's u_0 (``dual-init = paper``), an
un-noised gradient.
"""

from __future__ import annotations

import math
import sys

from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.privacy.device import RunCost, RunRequest, config_digest
from dpadmm.privacy.ledger import Ledger, Release, clipped_sensitivity, composed_epsilon
from dpadmm.privacy.ledger import ledger as account
from dpadmm.privacy.secure import MIN_GAUSSIAN_MULTIPLIER


def rdp_order(epsilon: float, delta: float, mu: float) -> float:
    """alpha = log(1/delta) / ((1 - mu) epsilon) + 1 (eq. (8) of 002): the RDP order at which the conversion
    term log(1/delta) / (alpha - 1) is the share (1 - mu) epsilon."""
    return math.log(1.0 / delta) / ((1.0 - mu) * epsilon) + 1.0


def theorem_1_std(epsilon: float, delta: float, mu: float, rounds: int, sensitivity: float) -> float:
    """sigma with sigma^2 = Delta^2 alpha T / (2 epsilon mu) (Theorem 1, eq. (8) of 002, where Delta = c / n).

    Each of the T Gaussian releases is then (alpha, mu epsilon / T)-RDP, the run
    (alpha, mu epsilon)-RDP, and the conversion adds (1 - mu) epsilon: (epsilon, delta)-DP.
    """
    alpha = rdp_order(epsilon, delta, mu)
    return math.sqrt(sensitivity**2 * alpha * rounds / (2.0 * epsilon * mu))


def single_order_epsilon(noise_multiplier: float, rounds: int, delta: float, alpha: float) -> float:
    """The paper's conversion at one order: T alpha / (2 s^2) + log(1/delta) / (alpha - 1), s = sigma / Delta
    (Mironov 2017, Prop. 3; 002's Lemma 2 and the proof of Theorem 1)."""
    return rounds * alpha / (2.0 * noise_multiplier**2) + math.log(1.0 / delta) / (alpha - 1.0)


def sensitivity(config: LinAdmmConfig, num_samples: int) -> float:
    """Delta of one release: c/n (add-remove, 002's) or 2c/n (replace-one), in the L2 norm."""
    return clipped_sensitivity(config.grad_bound, num_samples, config.neighbouring)


def noise_std(config: LinAdmmConfig, num_samples: int) -> float:
    """sigma of Theorem 1 (eq. (8)) for the configured budget; 0 for a non-private run.

    Raises ValueError, naming the target and the targets Theorem 1 can calibrate, where sigma / Delta leaves
    what the deployed sampler draws: below 2**-10 (a target too large) or beyond floating point (too small).
    """
    if not config.private:
        return 0.0
    delta_2 = sensitivity(config, num_samples)
    try:
        sigma = theorem_1_std(config.target_epsilon, config.delta, config.rdp_mu, config.rounds, delta_2)
    except ZeroDivisionError:  # (1 - mu) epsilon rounds to 0 for a subnormal epsilon
        sigma = math.inf
    where = (f"target-epsilon={config.target_epsilon:g} cannot be calibrated by Theorem 1 over "
             f"rounds={config.rounds}")
    if not math.isfinite(sigma):
        raise ValueError(f"{where}: the noise it needs is beyond floating point; the deployed grid costs "
                         f"{_smallest_target(config):.4g} at any noise, a target must lie above it")
    if sigma / delta_2 < MIN_GAUSSIAN_MULTIPLIER:
        raise ValueError(f"{where}: its noise multiplier sigma / Delta = {sigma / delta_2:.4g} is below the "
                         f"deployed sampler's 2**-10; the largest target it reaches is "
                         f"{_largest_target(config):.4g}")
    return sigma


def _largest_target(config: LinAdmmConfig) -> float:
    """The epsilon for which Theorem 1's sigma / Delta is 2**-10: z^2 = T (L u^2 / (1 - mu) + u) / (2 mu) for
    u = 1/epsilon and L = ln(1/delta) (eq. (8)) is a quadratic a u^2 + u + c = 0, whose positive root is
    u = -2c / (1 + sqrt(1 - 4ac)) (the form that does not cancel)."""
    a = math.log(1 / config.delta) / (1 - config.rdp_mu)
    c = -2 * config.rdp_mu * MIN_GAUSSIAN_MULTIPLIER**2 / config.rounds
    return (1 + math.sqrt(1 - 4 * a * c)) / (-2 * c)


def _smallest_target(config: LinAdmmConfig) -> float:
    """What T releases of the deployed grid Gaussian mechanism cost however large the noise (its grid caps
    the multiplier at 2**GRID_BITS): no calibration reaches a target below it."""
    return composed_epsilon(Release("gaussian", sys.float_info.max), config.rounds, config.delta)[0]


def ledger(config: LinAdmmConfig, num_samples: int, rounds: int | None = None) -> Ledger:
    """The ledger of the T releases, or of the first ``rounds`` of them (a run that stopped early: the noise
    stays Theorem 1's for T); a ValueError for a non-private configuration (no noise)."""
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with target-epsilon=inf adds no noise: it is not "
                         "differentially private")
    delta_2 = sensitivity(config, num_samples)
    sigma = noise_std(config, num_samples)
    release = Release("gaussian", sigma / delta_2)
    stated = composed_epsilon(release, config.rounds, config.delta)[0]
    # the grid's cost above Theorem 1's slack (checked for the whole run)
    if rounds is None and not stated <= config.target_epsilon * (1 + 1e-9):
        raise ValueError(f"target-epsilon={config.target_epsilon:g} is not achievable with {config.rounds} "
                         f"releases at delta={config.delta:g}: Theorem 1's noise gives {stated:.4g} on the "
                         f"deployed grid, which costs {_smallest_target(config):.4g} at any noise; give a "
                         "larger target")
    alpha = rdp_order(config.target_epsilon, config.delta, config.rdp_mu)
    paper = single_order_epsilon(sigma / delta_2, config.rounds, config.delta, alpha)
    form = "c/n" if config.neighbouring == "add-remove" else "2c/n"
    uncovered = ["the graph W (computed from the training features, not privatised)"]
    if config.dual_init == "paper":
        uncovered.append("u_0 = -(1/rho) pinv(A^T) grad f(x_0), an un-noised gradient (dual-init = paper)")
    note = (f"Theorem 1 of 002: sigma from eq. (8) at the single RDP order alpha = {alpha:.6g} (mu = "
            f"{config.rdp_mu:g}) gives eps = {paper:.6g} at delta = {config.delta:g} for the run. Trusted: "
            "whoever adds the noise sees the exact gradients (on Flower: the server, central DP). NOT "
            "covered: " + "; ".join(uncovered) + ".")
    return account(
        algorithm=config.algorithm, release=release, per_round=1,
        rounds=config.rounds if rounds is None else rounds, delta=config.delta,
        epsilon_bar=config.target_epsilon,
        calibration="Theorem 1 (002)",
        sensitivity=f"L2: {form} = {delta_2:.6g} (c = {config.grad_bound:g}, n = {num_samples})",
        noise_scale=f"sigma = {sigma:.6g} on the mean gradient", covered=config.dual_init == "zero",
        neighbouring=config.neighbouring, note=note,
        holder="for the whole training set (every client's rows)",
    )


def device_request(config: LinAdmmConfig, data: str, num_samples: int) -> RunRequest:
    """One client's run as the device's ledger event (:mod:`dpadmm.privacy.device`): central DP, the client
    sends exact clipped gradient sums and the server adds the noise, so the device must trust the server;
    the cost is the server's whole-run ledger for the client's ``num_samples`` rows."""

    def cost() -> RunCost:
        account = ledger(config, num_samples)
        return RunCost(account.whole_run.epsilon_pld, account.whole_run.delta,
                       "gaussian (added by the server)", release_epsilon=account.per_step.epsilon_pld)

    return RunRequest(algorithm=config.algorithm, rounds=config.rounds,
                      config=config_digest(config.to_mapping()),
                      data=data, private=config.private, covered=True, cost=cost,
                      neighbouring=config.neighbouring, central=True)


def stated(config: LinAdmmConfig) -> Ledger:
    """The ledger of ``config`` before any data is read (``dpadmm privacy``): n is the data set's public
    training-row count."""
    from dpadmm.data.libsvm import BINARY_SETS

    return ledger(config, BINARY_SETS[config.dataset].rows[0])
