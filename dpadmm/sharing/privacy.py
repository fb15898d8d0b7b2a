"""The privacy of ADMM sharing (001 eq. (16), Theorem 3, Corollary 1): a Gaussian release per party and round.

Each round party m sends the N-vector D_m x_m of its scores. With ``noise = message`` it adds
N(0, sigma^2 I_N) to that vector: the Gaussian mechanism (Dwork & Roth, Thm. A.1) with
sigma = sqrt(2 ln(1.25/delta)) C / epsilon, which is (epsilon, delta)-DP for epsilon <= 1 (Theorem 3).

The sensitivity C. The paper's Lemma 1 bounds it by (3 / (d_1 rho)) [lambda c_1 + (1 + M rho) b_1]
with a d_1 it does not define and bounds b_1 it does not enforce. Here the bound is enforced
instead: every x_m lies in the ball ||x_m|| <= b (``x-bound``) and every row of D_m has unit norm,
so each entry of D_m x_m lies in [-b, b] and two messages differ by at most C = 2 b sqrt(N) in L2,
for any change of party m's features (neighbouring: party m's block replaced by any other block of
unit rows; a fortiori one sample's features). It is data-independent, and large: the guarantee is
honest, the noise it needs is heavy.

``noise = paper`` draws xi_m ~ N(0, sigma^2 (D_m^T D_m)^-1) on x_m (eq. (16)): the message noise
D_m xi_m then lies in the column space of D_m, while the change of a message need not, so the
Gaussian mechanism's guarantee (Theorem 3) does not follow. It is run as the
paper does and labelled not covered.

Composition: a run is T releases per party; Corollary 1 (advanced composition, eq. (17)) gives
(eps', T delta + delta'), and the ledger states dp-accounting's PLD value for the same releases.

The grid. A deployed party releases its message by the grid Gaussian mechanism
(:func:`dpadmm.privacy.secure.gaussian_release`), whose rounding and discrete noise cost a tiny, fixed
amount per release (:mod:`dpadmm.privacy.secure`). The ledger's accountants (PLD, RDP, basic, advanced)
compose that deployed mechanism, grid included (:mod:`dpadmm.privacy.ledger`); the note's Theorem 3 and
Corollary 1 values are the paper's, for the continuous mechanism.

Each party's guarantee covers its own features only. Not covered: the labels (the server holds
them and computes z and y from them), and the test-time scores.
"""

from __future__ import annotations

import dataclasses
import math
import sys

from dpadmm.privacy.device import RunCost, RunRequest, config_digest
from dpadmm.privacy.ledger import Ledger, Release, advanced_composition, composed_epsilon
from dpadmm.privacy.ledger import ledger as account
from dpadmm.sharing.config import SharingConfig


def theorem_3_std(epsilon: float, delta: float, sensitivity: float) -> float:
    """sigma = sqrt(2 ln(1.25/delta)) C / epsilon (001 Theorem 3), for 0 < epsilon <= 1."""
    if not 0 < epsilon <= 1:
        raise ValueError(f"epsilon={epsilon!r} is not allowed; Theorem 3 of 001 needs 0 < epsilon <= 1")
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


def corollary_1(epsilon: float, rounds: int, delta: float, delta_prime: float) -> tuple[float, float]:
    """(eps', T delta + delta') of T rounds (001 Corollary 1, eq. (17)):
    eps' = sqrt(2 T ln(1/delta')) eps + T eps (e^eps - 1)."""
    return advanced_composition(epsilon, rounds, delta_prime), rounds * delta + delta_prime


def message_sensitivity(num_samples: int, bound: float) -> float:
    """C = 2 b sqrt(N): each entry of D_m x_m lies in [-b, b] (unit rows, ||x_m|| <= b)."""
    return 2 * bound * math.sqrt(num_samples)


def noise_std(config: SharingConfig, num_samples: int) -> float:
    """sigma of Theorem 3 for the configured epsilon; 0 for a non-private run."""
    if not config.private:
        return 0.0
    sigma = theorem_3_std(config.epsilon, config.delta, message_sensitivity(num_samples, config.x_bound))
    if not math.isfinite(sigma):
        raise ValueError(f"epsilon={config.epsilon:g} cannot be calibrated by Theorem 3: the noise it needs "
                         "is beyond floating point; the deployed grid costs "
                         f"{_smallest_epsilon(config):.4g} per round at any noise; give a larger epsilon")
    return sigma


def _smallest_epsilon(config: SharingConfig) -> float:
    """What one release of the deployed grid Gaussian mechanism costs however large the noise (its grid caps
    the multiplier at 2**GRID_BITS): no epsilon below it is met."""
    return composed_epsilon(Release("gaussian", sys.float_info.max), 1, config.delta)[0]


def ledger(config: SharingConfig, num_samples: int, rounds: int | None = None) -> Ledger:
    """The ledger of one party's T releases (every party makes the same ones), or of the first ``rounds``
    (a run that stopped early; each round's noise is Theorem 3's either way); a ValueError for a non-private
    configuration."""
    if rounds is not None:
        config = dataclasses.replace(config, rounds=rounds)
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with epsilon=inf adds no noise: it is not "
                         "differentially private")
    c = message_sensitivity(num_samples, config.x_bound)
    sigma = noise_std(config, num_samples)
    release = Release("gaussian", sigma / c)
    stated = composed_epsilon(release, 1, config.delta)[0]
    if not stated <= config.epsilon * (1 + 1e-9):  # the grid's cost above Theorem 3's slack
        raise ValueError(f"epsilon={config.epsilon:g} is not achievable per round at delta={config.delta:g}: "
                         f"Theorem 3's noise gives {stated:.4g} on the deployed grid, which costs "
                         f"{_smallest_epsilon(config):.4g} at any noise; give a larger epsilon")
    total, total_delta = corollary_1(config.epsilon, config.rounds, config.delta, config.delta_prime)
    covered = config.noise == "message"
    where = ("N(0, sigma^2 I_N) on the message D_m x_m" if covered else
             "N(0, sigma^2 (D_m^T D_m)^-1) on x_m (eq. (16)): message noise only in col(D_m), NOT covered")
    # Corollary 1's delta, T delta + delta', is no guarantee once it reaches 1: the ledger's composition is
    corollary = (f"Corollary 1 (eq. (17)): the run is ({total:.6g}, {total_delta:.3g})-DP" if total_delta < 1
                 and math.isfinite(total) else
                 "Corollary 1 (eq. (17)) gives no guarantee here (its delta, T delta + delta' = "
                 f"{total_delta:.3g}, is not below 1); the composition above is the run's guarantee")
    note = (f"Theorem 3 of 001: each round is ({config.epsilon:g}, {config.delta:g})-DP for each party's "
            f"features; {corollary}. "
            f"Noise: {where}. "
            "Trusted: nobody with the features (each party adds its own noise); the server holds the labels. "
            "NOT covered: the labels, the test-time scores.")
    return account(
        algorithm=config.algorithm, release=release, per_round=1, rounds=config.rounds,
        delta=config.delta, epsilon_bar=config.epsilon, calibration="Theorem 3 (001)",
        sensitivity=f"L2: 2 b sqrt(N) = {c:.6g} (b = x-bound = {config.x_bound:g}, N = {num_samples}, "
                    "rows of unit norm)",
        noise_scale=f"sigma = {sigma:.6g} per message entry", covered=covered,
        neighbouring="replace party's block", note=note, holder="for each party's own features",
    )


def mechanism_of(config: SharingConfig, num_samples: int) -> str:
    """What one party releases each round, as its reply states it and the server checks it (the noise and
    its standard deviation for N samples); "none" for a non-private configuration."""
    if not config.private:
        return "none"
    return f"gaussian on the {config.noise}, std {noise_std(config, num_samples)!r}"


def device_request(config: SharingConfig, data: str, num_samples: int) -> RunRequest:
    """One party's run as the device's ledger event (:mod:`dpadmm.privacy.device`): the whole run's
    (epsilon, delta) of :func:`ledger` for the party's N samples; covered with the noise on the message
    (``noise='message'``). ``data``: the digest of the party's block. Its relation is replace-one: Theorem 3
    holds for the party's whole block replaced, a fortiori for one sample's features (N and the ids are
    public); a row cannot be added or removed in one party alone."""

    def cost() -> RunCost:
        account = ledger(config, num_samples)
        return RunCost(account.whole_run.epsilon_pld, account.whole_run.delta, "gaussian",
                       release_epsilon=account.per_step.epsilon_pld)

    return RunRequest(algorithm=config.algorithm, rounds=config.rounds,
                      config=config_digest(config.to_mapping()),
                      data=data, private=config.private, covered=config.noise == "message", cost=cost,
                      neighbouring="replace-one")


def stated(config: SharingConfig) -> Ledger:
    """The ledger of ``config`` before any data is read (``dpadmm privacy``): N is the data set's public
    training-row count."""
    from dpadmm.data.vertical import VERTICAL_TRAIN

    return ledger(config, VERTICAL_TRAIN[config.dataset])
