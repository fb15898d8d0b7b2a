"""A privacy audit: attack one released local step z^{t,e+1} of ObjP and lower-bound its epsilon.

An attacker who knows everything but the noise (z^{t,e}, w, lambda_p, rho, eta and the two
candidate data sets D, D') sees the release z = (z^{t,e}/eta + rho w + lambda - xi - g) /
(1/eta + rho) of eq. (8), recovers y = g + xi, and applies a test "y in S". Over many noise
draws the rates p = P(y in S | D) and p' = P(y in S | D') give the realised privacy loss
ln(p / p'); Clopper-Pearson intervals turn them into a lower bound that holds with
confidence 1 - alpha. A correct eps-bar-DP mechanism keeps the bound below eps-bar.

The release is computed by ``dpadmm.iadmm.local.agent_round`` itself, with each trial as another
agent id, so the draws are the real keyed noise streams and the code under audit is the
code that trains. Two attacks:

* ``shift`` (for the clipped calibration): D and D' differ in one sample whose clipped
  gradient terms point in opposite directions, the largest change the clipping allows
  (L1 = 2C/I); S is the corner of the two shifted coordinates, where the likelihood ratio is
  largest. It reaches ln(p/p') = eps-bar exactly, so the bound can come close to the claim.
* ``scale`` (for the papers' data-dependent calibration): D holds faint images (small
  ||x||_1), so its own eq. (9b) scale is tiny; D' replaces one with a bright, misclassified
  image, whose scale and gradient are large. S is a small window around D's noiseless value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from scipy.stats import beta

from dpadmm.iadmm import schedules
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.local import agent_round
from dpadmm.models.logistic import AgentData, gradient


@dataclass(frozen=True)
class AuditResult:
    attack: str
    claimed_epsilon: float  # eps-bar of one local step
    epsilon_lower_bound: float  # holds with confidence 1 - alpha
    empirical_epsilon: float  # ln(p / p') from the observed rates
    p: float  # P(y in S | D), observed
    p_prime: float  # P(y in S | D'), observed
    trials: int
    alpha: float


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval of a binomial proportion."""
    low = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return low, high


def _released(config: RunConfig, x: torch.Tensor, y: torch.Tensor, first_agent: int,
              trials: int) -> torch.Tensor:
    """y = g + xi recovered from ``trials`` releases of one ObjP step on the data set (x, y)."""
    one = AgentData.from_blocks([x], [y], num_classes=2, total=x.shape[0], agents=[0])
    # The same data set for every trial (views, not copies); each trial has its own noise key.
    data = AgentData(x=one.x.expand(trials, -1, -1), y=one.y.expand(trials, -1, -1),
                     counts=one.counts.expand(trials), x_l1=one.x_l1.expand(trials, -1),
                     x_l2=one.x_l2.expand(trials, -1),
                     agents=torch.arange(first_agent, first_agent + trials), total=one.total)
    zeros = torch.zeros((trials, x.shape[1], 2), dtype=torch.float64)
    w = torch.zeros(x.shape[1], 2, dtype=torch.float64)
    z = agent_round(config, data, w, zeros, zeros, 1).z_sent
    # z = (0/eta + rho*0 + 0 - xi - g) / (1/eta + rho): the attacker inverts the affine map.
    return -z * (1.0 / schedules.eta(1, config.prox_scale) + schedules.rho_at(config, 1))


def _gradient(config: RunConfig, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The noiseless g of the step at z = 0, as the attacker computes it for a candidate data set."""
    data = AgentData.from_blocks([x], [y], num_classes=2, total=x.shape[0], agents=[0])
    z = torch.zeros(1, x.shape[1], 2, dtype=torch.float64)
    clip = config.clip_norm if config.clipped else None
    return gradient(data, z, scale=1.0 / data.total, reg=config.beta, clip=clip)[0]


def audit_local_step(config: RunConfig, attack: str, trials: int = 100_000, alpha: float = 0.05,
                     num_samples: int = 20) -> AuditResult:
    """Lower-bound the epsilon of one ObjP local step (t = 1, z^{t,1} = w = lambda = 0)."""
    config = dataclasses.replace(config, algorithm="objp", local_steps=1, num_agents=1)
    if not config.private:
        raise ValueError("the audit needs a private configuration (finite epsilon)")
    n = num_samples
    if attack == "shift":
        # Every sample carries ||x_i||_1 = s >= C, so every term is clipped to L1 norm C.
        s = 2.0 * config.clip_norm
        x = torch.zeros(n, 2, dtype=torch.float64)
        x[0, 0] = s
        x[1:, 1] = s
        labels = torch.zeros(n, dtype=torch.long)
    elif attack == "scale":
        faint, bright = 1e-2, 1e2
        x = torch.zeros(n, 2, dtype=torch.float64)
        x[0, 0] = faint
        x[1:, 1] = faint
        labels = torch.zeros(n, dtype=torch.long)
    else:
        raise ValueError(f"attack={attack!r} is not allowed; choose shift or scale")
    x_prime, labels_prime = x.clone(), labels.clone()
    labels_prime[0] = 1  # at z = 0, h = (1/2, 1/2): the term of sample 0 flips sign
    if attack == "scale":
        x_prime[0, 0] = bright

    y_d = _released(config, x, labels, 0, trials)
    y_dp = _released(config, x_prime, labels_prime, trials, trials)
    g_d, g_dp = _gradient(config, x, labels), _gradient(config, x_prime, labels_prime)

    if attack == "shift":
        # d = g_D - g_D' is (-c, +c) in row 0; S = {u_00 <= -c and u_01 >= c} with u = y - g_D'.
        c = float(g_dp[0, 0] - g_d[0, 0])
        inside = lambda y: ((y[:, 0, 0] - g_dp[0, 0]) <= -c) & ((y[:, 0, 1] - g_dp[0, 1]) >= c)  # noqa: E731
    else:
        # D's own scale b_D = Delta(D)/eps; S = a window of half-width b_D around D's noiseless value.
        b_d = faint * 1.0 / n / config.epsilon  # eq. (9b) on D: max ||x_i||_1 ||h_i - y_i||_1 / I
        inside = lambda y: (y[:, 0, 0] - g_d[0, 0]).abs() <= b_d  # noqa: E731
    hits, hits_prime = int(inside(y_d).sum()), int(inside(y_dp).sum())
    p_low, _ = clopper_pearson(hits, trials, alpha)
    _, pp_high = clopper_pearson(hits_prime, trials, alpha)
    lower = math.log(p_low / pp_high) if p_low > 0 else 0.0
    empirical = math.log(hits / hits_prime) if hits and hits_prime else math.inf
    return AuditResult(attack=attack, claimed_epsilon=config.epsilon, epsilon_lower_bound=max(lower, 0.0),
                       empirical_epsilon=empirical, p=hits / trials, p_prime=hits_prime / trials,
                       trials=trials, alpha=alpha)
