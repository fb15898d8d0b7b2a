"""Calibration of DP-IADMM's noise: one agent's release under a configuration, and the eps-bar that makes a
whole run meet ``target-epsilon``.

Apart from :mod:`dpadmm.iadmm.privacy` (the ledger and the statement) because :class:`RunConfig` itself
checks a given eps-bar against its target's calibration, and this module imports no configuration: it
reads a configuration's fields (``RunConfig``, duck-typed), and the shared accountant.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

from dpadmm.privacy.ledger import Release, calibrate_multiplier


def outp_noise_multiplier(epsilon: float, delta: float) -> float:
    """sigma / Delta_2 = sqrt(2 ln(1.25/delta)) / eps: the classical Gaussian calibration OutP uses."""
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def outp_multiplier(epsilon: float, outp_delta: float, neighbouring: str) -> float:
    """sigma / Delta_2 of OutP's Gaussian release: sqrt(2 ln(1.25/delta)) / eps.

    OutP's sigma (``schedules.outp_sigma``) is Delta_2 sqrt(2 ln(1.25/delta))/eps with the
    replace-one L2 sensitivity Delta_2 = 2 c1 / (I_p (rho + 1/eta)), c1 = I_p (Huang et al.,
    as the reference code sets it); one sample added or removed moves z by half that.
    """
    base = outp_noise_multiplier(epsilon, outp_delta)
    return base if neighbouring == "replace-one" else 2.0 * base


def release_of(config: Any) -> tuple[Release, int]:
    """(the release, releases per round) of one agent under ``config`` (calibrated: eps-bar known)."""
    if not config.calibrated:
        config.effective_epsilon  # noqa: B018  (raises: eps-bar is not calibrated yet)
    if not 1.0 / config.epsilon < math.inf:
        raise ValueError(f"epsilon={config.epsilon!r} is not allowed: the noise it calibrates (multiplier "
                         f"1/epsilon) is beyond floating point; give epsilon >= {1 / sys.float_info.max:.3g}")
    if config.algorithm == "outp":
        return Release("gaussian", outp_multiplier(config.epsilon, config.outp_delta, config.neighbouring)), 1
    # The objective perturbation: noise of scale Delta / epsilon, in the mechanism's norm; each step reads a
    # Poisson sample at rate q of the agent's data (q = 1: all of it).
    return Release(config.mechanism, 1.0 / config.epsilon, config.sampling_rate), config.steps


def calibrated_epsilon(config: Any) -> float:
    """The eps-bar that :func:`dpadmm.iadmm.privacy.calibrate` gives ``config`` (which sets
    ``target-epsilon``; its own eps-bar is ignored): also what a calibrated RunConfig is checked against."""
    config = dataclasses.replace(config, epsilon=0.0)
    epsilon = _CALIBRATED.get(config)
    if epsilon is None:
        # the release with a noise multiplier of 1, only for its kind, sampling and count per round
        release, per_round = release_of(dataclasses.replace(config, target_epsilon=0.0, epsilon=1.0))
        multiplier = calibrate_multiplier(release.mechanism, per_round * config.rounds, config.target_epsilon,
                                          config.delta, release.sampling)
        if config.algorithm == "outp":
            epsilon = outp_multiplier(1.0, config.outp_delta, config.neighbouring) / multiplier
        else:
            epsilon = 1.0 / multiplier
        _CALIBRATED[config] = epsilon
    return epsilon


# calibrate's eps-bar per uncalibrated configuration in this process (a second of the accountant each): the
# server, its strategy, a long-lived node and every calibrated RunConfig's own check ask more than once
_CALIBRATED: dict[Any, float] = {}
