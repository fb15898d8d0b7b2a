"""The privacy ledger: what a run guarantees per local step, per round and for the whole run.

Theorem 1 of 003 makes one local iterate z^{t,e+1} eps-bar-DP. A round releases the average
of E such iterates (post-processing of E releases), and a run releases T rounds, so the
whole run is the composition of E*T Laplace mechanisms per agent (T Gaussian ones for OutP).
This module states those three levels at a user's delta with Google's ``dp-accounting``
(the privacy-loss-distribution accountant, and RDP as a cross-check), next to basic and
advanced composition. It also inverts the accountant (budget-first runs).

Each release is an event of dp-accounting with noise multiplier = noise scale / sensitivity,
the sensitivity being taken under the configured neighbouring relation (one sample
replaced, or added/removed). The PLD of such a mechanism is that of one shifted pair of
noise distributions whatever the relation, so it is composed with dp-accounting's
add-or-remove accountant, the one that implements the Laplace PLD.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpadmm import schedules
from dpadmm.config import RunConfig

# Discretisation of the PLD accountant: pessimistic (a valid upper bound) at any interval;
# 1e-3 is within 1e-5 relative of 1e-4 on the papers' settings and ten times faster.
PLD_INTERVAL = 1e-3
CALIBRATION_INTERVAL = 1e-2  # coarser, so more pessimistic: the calibrated run meets its target
RELATION = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
ACCOUNTANTS = ("pld", "rdp")


def clipped_sensitivity(clip: float, total: int, neighbouring: str) -> float:
    """Sensitivity of the clipped gradient: 2C/I if one sample is replaced, C/I if added or removed.

    Replacing sample i changes sum_i clip(g_i) / I by the difference of two terms of norm
    <= C each; adding or removing changes it by one such term. (I is the public sample
    count.) In the L1 norm this is the Delta of eq. (9) for which Theorem 1 of 003 holds as
    stated; in the L2 norm it is the Delta_2 of the Gaussian variant. Either way the step's
    output depends on the data only through g + xi, so it is post-processing of the mechanism.
    """
    return (2.0 if neighbouring == "replace-one" else 1.0) * clip / total


def accountant(kind: str = "pld", interval: float = PLD_INTERVAL) -> dp_accounting.PrivacyAccountant:
    """A fresh dp-accounting accountant: PLD (discretised at ``interval``) or RDP, for :data:`RELATION`.

    Every epsilon of the project (DP-IADMM's ledger and the baselines') comes from one of these.
    """
    if kind == "pld":
        return pld_privacy_accountant.PLDAccountant(RELATION, value_discretization_interval=interval)
    if kind == "rdp":
        return rdp_privacy_accountant.RdpAccountant(neighboring_relation=RELATION)
    raise ValueError(f"accountant={kind!r} is not allowed; choose one of {', '.join(ACCOUNTANTS)}")


@dataclass(frozen=True)
class Guarantee:
    """(epsilon, delta) of ``releases`` composed releases, by four methods."""

    scope: str  # "local step", "round" or "run"
    releases: int
    delta: float  # the delta every epsilon below is stated at
    epsilon_pld: float  # dp-accounting's PLD accountant (the number to quote)
    epsilon_rdp: float  # dp-accounting's RDP accountant
    epsilon_basic: float  # basic composition
    epsilon_advanced: float  # advanced composition (Dwork, Rothblum & Vadhan 2010)


@dataclass(frozen=True)
class Ledger:
    """The privacy of one agent's releases in a run."""

    algorithm: str
    mechanism: str  # "laplace" or "gaussian"
    noise_multiplier: float  # noise scale / sensitivity of one release
    epsilon_bar: float  # the configured per-release parameter
    calibration: str  # "clipped", "data-dependent" or OutP's
    sensitivity: str  # the bound Delta of one release, with its value where it is one number
    noise_scale: str  # the noise's scale (Laplace b) or standard deviation (Gaussian)
    covered: bool  # whether the sensitivity is a proven bound (not computed from the data)
    neighbouring: str
    steps_per_round: int
    rounds: int
    per_step: Guarantee
    per_round: Guarantee
    whole_run: Guarantee
    note: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """A few lines a person reads at the end of a run."""
        lines = [
            f"privacy ({self.algorithm}, {self.mechanism} noise, {self.calibration} sensitivity, "
            f"neighbouring: {self.neighbouring}; per agent, at delta={self.whole_run.delta:g}):",
        ]
        for g in (self.per_step, self.per_round, self.whole_run):
            lines.append(f"  per {g.scope:<10} ({g.releases} release{'s' if g.releases > 1 else ''}): "
                         f"eps = {g.epsilon_pld:.4g} (PLD); basic {g.epsilon_basic:.4g}, "
                         f"advanced {g.epsilon_advanced:.4g}, RDP {g.epsilon_rdp:.4g}")
        lines.append(f"  sensitivity {self.sensitivity}; noise {self.noise_scale}")
        lines.append(f"  {self.note}")
        return "\n".join(lines)


def _event(mechanism: str, multiplier: float) -> dp_accounting.DpEvent:
    if mechanism == "laplace":
        return dp_accounting.LaplaceDpEvent(noise_multiplier=multiplier)
    return dp_accounting.GaussianDpEvent(noise_multiplier=multiplier)


def pld_epsilon(mechanism: str, multiplier: float, releases: int, delta: float,
                interval: float = PLD_INTERVAL) -> float:
    """epsilon at delta of ``releases`` composed mechanisms, by the PLD accountant."""
    tracker = accountant("pld", interval)
    tracker.compose(dp_accounting.SelfComposedDpEvent(_event(mechanism, multiplier), releases))
    return float(tracker.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def _cached_pld_epsilon(mechanism: str, multiplier: float, releases: int, delta: float) -> float:
    return pld_epsilon(mechanism, multiplier, releases, delta)


def spent(config: RunConfig, rounds: int) -> float:
    """epsilon (PLD, at ``delta``) spent so far by an agent that took part in ``rounds`` rounds.

    ``privacy.json`` is written before a run and assumes the agent takes part in all T
    rounds. With partial participation or dropouts it takes part in fewer; which rounds
    does not depend on its data (the sample is a keyed stream, a dropout is a device
    failure), so composing over the rounds actually taken is a valid account. 0 before the
    first round; inf for a non-private configuration.
    """
    if not config.private:
        return math.inf
    if rounds <= 0:
        return 0.0
    mechanism, multiplier, per_round = mechanism_of(config)
    return _cached_pld_epsilon(mechanism, multiplier, per_round * rounds, config.delta)


def rdp_epsilon(mechanism: str, multiplier: float, releases: int, delta: float) -> float:
    """epsilon at delta of ``releases`` composed mechanisms, by the RDP accountant."""
    tracker = accountant("rdp")
    tracker.compose(dp_accounting.SelfComposedDpEvent(_event(mechanism, multiplier), releases))
    return float(tracker.get_epsilon(delta))


def single_release(mechanism: str, multiplier: float, delta: float) -> float:
    """epsilon of one release at delta: 1/multiplier for Laplace (pure DP, delta = 0), exact for Gaussian."""
    if mechanism == "laplace":
        return 1.0 / multiplier
    return float(dp_accounting.get_epsilon_gaussian(multiplier, delta))


def basic_composition(epsilon: float, releases: int) -> float:
    """k eps: the k-fold composition of eps-DP releases (delta adds up likewise)."""
    return releases * epsilon


def advanced_composition(epsilon: float, releases: int, delta_prime: float) -> float:
    """sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1): k-fold (eps, delta0) releases are
    (that, k delta0 + delta')-DP (Dwork, Rothblum & Vadhan 2010; Dwork & Roth Thm. 3.20)."""
    k = releases
    return math.sqrt(2 * k * math.log(1 / delta_prime)) * epsilon + k * epsilon * math.expm1(epsilon)


def _guarantee(scope: str, mechanism: str, multiplier: float, releases: int, delta: float) -> Guarantee:
    if mechanism == "laplace":  # pure: all of delta goes to the composition
        eps0 = single_release(mechanism, multiplier, 0.0)
        basic = basic_composition(eps0, releases)
        advanced = advanced_composition(eps0, releases, delta)
    else:  # (eps0, delta0) releases: split delta between the releases and the composition
        basic = basic_composition(single_release(mechanism, multiplier, delta / releases), releases)
        eps0 = single_release(mechanism, multiplier, delta / (2 * releases))
        advanced = advanced_composition(eps0, releases, delta / 2)
    return Guarantee(
        scope=scope, releases=releases, delta=delta,
        epsilon_pld=pld_epsilon(mechanism, multiplier, releases, delta),
        epsilon_rdp=rdp_epsilon(mechanism, multiplier, releases, delta),
        epsilon_basic=basic, epsilon_advanced=advanced,
    )


def outp_multiplier(epsilon: float, outp_delta: float, neighbouring: str) -> float:
    """sigma / Delta_2 of OutP's Gaussian release: sqrt(2 ln(1.25/delta)) / eps.

    OutP's sigma (``schedules.outp_sigma``) is Delta_2 sqrt(2 ln(1.25/delta))/eps with the
    replace-one L2 sensitivity Delta_2 = 2 c1 / (I_p (rho + 1/eta)), c1 = I_p (Huang et al.,
    as the reference code sets it); one sample added or removed moves z by half that.
    """
    base = schedules.outp_noise_multiplier(epsilon, outp_delta)
    return base if neighbouring == "replace-one" else 2.0 * base


def mechanism_of(config: RunConfig) -> tuple[str, float, int]:
    """(mechanism, noise multiplier, releases per round) of one agent under ``config``."""
    if config.algorithm == "outp":
        return "gaussian", outp_multiplier(config.epsilon, config.outp_delta, config.neighbouring), 1
    # The objective perturbation: noise of scale Delta / epsilon, in the mechanism's norm.
    return config.mechanism, 1.0 / config.epsilon, config.steps


def ledger(config: RunConfig, rounds: int | None = None, total_samples: int | None = None) -> Ledger:
    """The ledger of one agent that took part in ``rounds`` rounds (default: all of them).

    ``total_samples`` (I) makes the clipped sensitivity and scale numbers; the epsilons do not
    depend on it. Raises ValueError for a non-private configuration, which releases without noise.
    """
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with epsilon={config.epsilon!r} adds no noise: "
                         "it is not differentially private")
    rounds = config.rounds if rounds is None else rounds
    mechanism, multiplier, per_round = mechanism_of(config)
    if config.algorithm == "outp":
        calibration, covered = "OutP (Huang et al.)", True
        sens = "L2: 2 c1 / (I_p (rho^t + 1/eta^t)), c1 = I_p (changes with t)"
        scale = f"sigma^t = {multiplier:.4g} x Delta_2^t"
        note = ("OutP's Gaussian sensitivity 2c1/(I_p (rho + 1/eta)) with c1 = I_p holds while every "
                "per-sample gradient has L2 norm <= I_p (MNIST: <= 40).")
    elif config.sensitivity == "clipped":
        calibration, covered = "clipped", True
        form = "2C/I" if config.neighbouring == "replace-one" else "C/I"
        norm = config.clip_norm_type.upper()
        scale_name = "b" if mechanism == "laplace" else "sigma"
        batch = " x I_p / B_p" if config.batch_size else ""  # minibatches of B_p = min(B, I_p) samples
        if total_samples:
            value = clipped_sensitivity(config.clip_norm, total_samples, config.neighbouring)
            sens = (f"{norm}: {form}{batch} = {value:.6g}{batch} "
                    f"(C = {config.clip_norm:g}, I = {total_samples})")
            scale = f"{scale_name} = Delta / eps-bar = {value / config.epsilon:.6g}{batch}"
        else:
            sens = f"{norm}: {form}{batch} (C = {config.clip_norm:g})"
            scale = f"{scale_name} = Delta / eps-bar"
        note = (f"Per-sample gradients clipped to {norm} norm {config.clip_norm:g}: Delta = {form}{batch} "
                "bounds every step whatever the data, and the step's output depends on the data only "
                "through g + noise, so "
                + ("Theorem 1 of 003 applies as stated." if mechanism == "laplace" else
                   "each step is the Gaussian mechanism (noise multiplier 1 / epsilon) followed by "
                   "post-processing.")
                + (f" Minibatches of B = {config.batch_size} (B_p = min(B, I_p) samples of agent p) are not "
                   "credited with amplification by subsampling." if batch else ""))
    else:
        calibration, covered = "data-dependent", False
        sens = "eq. (9b): max_i ||x_i||_1 ||h_i - y_i||_1 / I over the agent's data, each step"
        scale = "b = Delta_p^{t,e} / eps-bar (data-dependent)"
        note = ("NOT COVERED by Theorem 1: the Laplace scale is the papers' eq. (9b), computed from the "
                "agent's own data, so the numbers above are nominal, not guarantees.")
    return Ledger(
        algorithm=config.algorithm, mechanism=mechanism, noise_multiplier=multiplier,
        epsilon_bar=config.epsilon, calibration=calibration, sensitivity=sens, noise_scale=scale,
        covered=covered,
        neighbouring=config.neighbouring, steps_per_round=per_round, rounds=rounds,
        per_step=_guarantee("step", mechanism, multiplier, 1, config.delta),
        per_round=_guarantee("round", mechanism, multiplier, per_round, config.delta),
        whole_run=_guarantee("run", mechanism, multiplier, per_round * rounds, config.delta),
        note=note,
    )


# Noise multipliers searched by the calibration (Laplace: eps-bar from 1e-7 to 20 per release;
# dp-accounting's PLD breaks down for multipliers near 1e-3).
_MULTIPLIER_RANGE = (0.05, 1e7)


def calibrate(config: RunConfig) -> RunConfig:
    """``config`` with ``epsilon`` chosen so that the whole run is ``target-epsilon``-DP at ``delta``.

    Inverts the PLD accountant over the noise multiplier of one release, for the configured
    rounds T and local steps E, before training. Returns ``config`` unchanged when no target
    is set. Raises ValueError when the target is smaller than the smallest achievable value.
    """
    if not config.target_epsilon:
        return config
    mechanism, _, per_round = mechanism_of(config)
    releases = per_round * config.rounds
    low, high = _MULTIPLIER_RANGE
    floor = pld_epsilon(mechanism, high, releases, config.delta, CALIBRATION_INTERVAL)
    if config.target_epsilon < floor:
        raise ValueError(f"target-epsilon={config.target_epsilon:g} is not achievable with {releases} "
                         f"releases at delta={config.delta:g}; the smallest achievable value is {floor:.4g}")
    # Bracket the root: step the multiplier down from the largest, 8x at a time, to the first whose epsilon
    # reaches the target. A PLD is the slower to build the smaller its multiplier (Gaussian at 0.05: ~10 s)
    # and brentq evaluates both ends of its bracket, so the small end of the range is reached only if needed.
    bracket, ceiling = (high, high), floor
    while ceiling < config.target_epsilon and bracket[0] > low:
        bracket = (max(bracket[0] / 8, low), bracket[0])
        ceiling = pld_epsilon(mechanism, bracket[0], releases, config.delta, CALIBRATION_INTERVAL)
    if config.target_epsilon > ceiling:
        raise ValueError(f"target-epsilon={config.target_epsilon:g} needs more than {1 / low:g} per "
                         f"release ({releases} releases give {ceiling:.4g} there); ask for less, or set "
                         "epsilon directly")
    multiplier = dp_accounting.calibrate_dp_mechanism(
        lambda: accountant("pld", CALIBRATION_INTERVAL),
        lambda m: dp_accounting.SelfComposedDpEvent(_event(mechanism, m), releases),
        config.target_epsilon, config.delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(*bracket), tol=1e-4,
    )
    if config.algorithm == "outp":
        epsilon = outp_multiplier(1.0, config.outp_delta, config.neighbouring) / multiplier
    else:
        epsilon = 1.0 / multiplier
    return dataclasses.replace(config, epsilon=epsilon)
