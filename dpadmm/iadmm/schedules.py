"""Parameter schedules of DP-IADMM: rho^t, eta^t, the trust radius and OutP's step and noise.

Rounds are numbered t = 1..T as in the papers. (The authors' reference code loops over
``iteration = 0..T-1`` and evaluates every schedule at ``iteration + 1``, which is this t.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dpadmm.iadmm.calibration import outp_noise_multiplier
from dpadmm.iadmm.config import LOGISTIC_RATE_SHARE, PULL_SHARE, RunConfig

if TYPE_CHECKING:
    import torch

RHO_MAX = 1e9  # the upper bound of eq. (24)
RHO_GROWTH = 1.2  # the base of eq. (24)


def rho(t: int, c1: float, c2: float, tc: int, epsilon: float) -> float:
    """Penalty rho^t = min(1e9, c1 * 1.2^floor(t / Tc) + c2 / eps), eq. (24) of 003.

    The c2 / eps term vanishes for eps = inf (non-private runs).
    """
    extra = 0.0 if math.isinf(epsilon) else c2 / epsilon
    growths = t // tc
    if growths * math.log(RHO_GROWTH) >= math.log(RHO_MAX / c1):  # 1.2^k would overflow a float
        return RHO_MAX
    return min(RHO_MAX, c1 * RHO_GROWTH**growths + extra)


def rho_at(config: RunConfig, t: int) -> float:
    """rho^t for a run configuration (eq. (24) with the configured constants)."""
    c1, c2, tc = config.rho_constants
    return rho(t, c1, c2, tc, config.effective_epsilon)


def noise_damping(config: RunConfig, noise_scale: torch.Tensor | None, num_params: int,
                  classes: int) -> float:
    """The factor on the main job's scale a (``prox-scale`` 0, :attr:`RunConfig.scale`): min(1, room / (R r)),
    room being :meth:`RunConfig.noise_room_for` the model's ``classes`` (logistic regression's K; a network's
    room does not read it); 1 for a given scale or without noise.

    R = a C / ((1 + PULL_SHARE) P) is the learning rate (in units of 1 / C) of a network's local step at t
    = 1 on the agent's mean loss (NETWORK_STEP); for logistic regression R = a C / ((1 + LOGISTIC_RATE_SHARE)
    P), 8.3 for the a = 10 P / C its room was fitted with (10.8 for today's 13 P / C, whose pull makes it
    12.9; where the noise binds, the damped step a room / (R r) is the same for any a). r = noise_scale
    sqrt(d) P / C is one step's noise over its largest clean gradient, in norm: the noise has scale
    ``noise_scale`` (per agent: their mean) in each of the d parameters, and g is I_p / I (1 / P on average)
    times a mean of gradients clipped to C. The damped rate is min(R, room / r): the noise's random walk
    must not drown what the gradients teach, and a larger model or a smaller budget or batch raises r. On
    the main job's data (validation half, docs/results/noise-room) the room of 10 suits logistic regression
    (r from 1.6 at eps 8 to 8.5 at eps 1) and the small CNN (r 2.9 at eps 8 to 16 at eps 1), whose errors
    grow by up to nine points under 15; the MLP (r 4.1 to 22) does best at 15 to 20, up to 2.9 points
    better than under 10; on FEMNIST (195 writers, 62 classes: r from 12 at eps 8 to 64 at eps 1) logistic
    regression does best at 110 to 199, its room sqrt(P K). So r alone does not set the rate: how far the
    noise of a parameter moves the loss differs from model to model, and the server's average of P agents
    holds 1 / sqrt(P) of their noise (:meth:`RunConfig.noise_room_for`). At
    eps 8 no undamped rate tried beside the rule's did better for four networks, the LEAF CNN (r 46)
    included (docs/results/step-rule).
    """
    return min(1.0, _noise_allowance(config, noise_scale, num_params, classes))


def noise_ratio(config: RunConfig, noise_scale: torch.Tensor, num_params: int) -> float:
    """r = sigma sqrt(d) P / C of :func:`noise_damping`: one local step's noise over its largest clean
    gradient, in norm, sigma being ``noise_scale``'s mean over the agents."""
    return float(noise_scale.mean()) * math.sqrt(num_params) * config.num_agents / config.clip_norm


def _noise_allowance(config: RunConfig, noise_scale: torch.Tensor | None, num_params: int,
                     classes: int) -> float:
    """room / (R r) of :func:`noise_damping`, before it is capped at 1 (inf without noise or the rule)."""
    if config.prox_scale > 0 or noise_scale is None:
        return math.inf
    ratio = noise_ratio(config, noise_scale, num_params)
    if ratio == 0:
        return math.inf
    share = LOGISTIC_RATE_SHARE if config.model == "logistic" else PULL_SHARE
    rate = config.scale * config.clip_norm / ((1 + share) * config.num_agents)
    return config.noise_room_for(classes) / (rate * ratio)


def local_eta(config: RunConfig, t: int, noise_scale: torch.Tensor | None, num_params: int,
              classes: int) -> float:
    """eta^t of round t's local steps (eq. (8) of 003): under the main job's rule (``prox-scale`` 0) in a
    private run, or for a network without noise (:attr:`RunConfig.network_rule`), a rate that decays only as
    far as its noise needs: min(R, room / (r sqrt(t))), i.e. eta^t = a min(1, D / sqrt(t)) with D = room /
    (R r) (:func:`noise_damping`), and a constant a without noise, as DP-SGD's and FedAvg's constant learning
    rates; otherwise :func:`eta` of a times :func:`noise_damping` (a given ``prox-scale``: eq. (8) itself).

    The noise's room shrinks as 1 / sqrt(t): where the noise binds from the first round (D <= 1: every private
    network on the main job's data but the MLP at eps 8, and logistic regression there at every eps),
    the rate is eq. (8)'s, room / (r sqrt(t)), as before. Where it does not, eq. (8)'s decay cost what the
    rounds could teach: on full MNIST (10 agents of 6,000 images, the small CNN, T = 10, seed 0) the defaults
    at eps 3 ended at 6.36% test error under a / sqrt(t) and at 4.53% under this rule (r is 0.56 at eps 2 and
    less at eps 3, so the rate stays 4 / C throughout); at eps 1 (r = 1.04), 6.35%. Logistic regression
    there (r = 0.57 at eps 1, less at larger eps) ended 0.81 to 1.73 points of test error behind a tuned
    DP-SGD + FedAvg at eps 1 to 8 under eq. (8)'s decay (docs/families/iadmm.md); under this rule,
    LOGISTIC_STEP and LOGISTIC_PULL_SHARE its validation error fell by 0.8 to 1.7 points (seeds 0-3). The
    same steps without noise, clipped (:attr:`RunConfig.clipped`), end at 4.5% (small CNN) and 9.5% (MLP) on
    the main job's data (seeds 0-2) under the constant rate, 5.7% and 10.3% under a / sqrt(t). Logistic
    regression without noise is not clipped and keeps eq. (8)'s decay, the papers' schedule: its gradients
    have no bound from which a constant rate could be set."""
    a = config.scale
    if not (config.network_rule or (config.prox_scale == 0 and noise_scale is not None)):
        return eta(t, a * noise_damping(config, noise_scale, num_params, classes))
    allowance = _noise_allowance(config, noise_scale, num_params, classes)
    return a if allowance >= math.sqrt(t) else eta(t, a * allowance)


def eta(t: int, a: float) -> float:
    """Proximity parameter eta^t = a / sqrt(t) of eq. (8) (003; scaling a from 000 A.11)."""
    return a / math.sqrt(t)


def trust_radius(t: int, a: float, kind: str = "paper") -> float:
    """Infinity-norm trust radius of ObjT's step, eq. (9) of 000.

    ``paper``: delta^t = a / t^2, as 000 (A.11) states it. Its sum over all rounds is bounded
    (a pi^2 / 6), so no coordinate can move more than about 1.6 a in a whole run.
    ``reference``: the constant a. The authors' code writes ``a / (iteration+1)*(iteration+1)``,
    which Python evaluates as (a / t) * t = a. With it the engine gives 000's MNIST ObjT numbers at
    T = 20,000 (docs/results/README.md); with a / t^2 ObjT stalls.
    """
    return a if kind == "reference" else a / (t * t)


def outp_inverse_eta(t: int, num_samples: float, num_params: int, epsilon: float, delta: float,
                     a: float) -> float:
    """OutP's 1/eta^t (Huang et al. DP-ADMM, as the authors' reference code runs it).

    1/eta = (0.25 I_p + 4 sqrt(JK t ln(1.25/delta)) / (eps sqrt(4 JK))) / a, and 0.25 I_p / a
    when eps = inf. ``num_params`` is J*K.
    """
    base = 0.25 * num_samples
    if not math.isinf(epsilon):
        base += 4.0 * math.sqrt(num_params * t * math.log(1.25 / delta)) / (
            epsilon * math.sqrt(4.0 * num_params))
    return base / a


def outp_sigma(epsilon: float, delta: float, rho_t: float, inverse_eta: float) -> float:
    """Standard deviation of OutP's Gaussian output noise: 2 sqrt(2 ln(1.25/delta)) / (eps (rho + 1/eta)).

    That is the noise multiplier times the L2 sensitivity Delta_2 = 2 c1 / (I_p (rho + 1/eta))
    with c1 = I_p (Huang et al., as the reference code sets it). The reference code passes
    sigma^2 where numpy expects a standard deviation, so its baseline ran with less noise
    than the claim needs whenever sigma < 1; we use sigma.
    """
    if math.isinf(epsilon):
        return 0.0
    return outp_noise_multiplier(epsilon, delta) * 2.0 / (rho_t + inverse_eta)


def participants(config: RunConfig, t: int, seed: int | None = None) -> list[int]:
    """The agents sampled in round t: ceil(fraction-train * P) of the P, sorted; all when the fraction is 1.

    Partial participation (an extension beyond 003, whose Algorithm 1 uses every agent each
    round): each agent p draws u_p from the keyed uniform stream (seed, p, round t) and the
    agents with the smallest u_p take part. Server, engine and a restarted server therefore
    pick the same agents in the same round. The sample is public (it depends on no data), so
    it gives no privacy amplification and the ledger does not claim any.
    """
    import torch  # here, not at the top: the privacy ledger (dpadmm privacy) uses this module without torch

    from dpadmm.privacy import noise

    agents = config.num_agents
    count = max(1, math.ceil(config.fraction_train * agents - 1e-9))
    if count >= agents:
        return list(range(agents))
    u = noise.uniform(config.seed if seed is None else seed, torch.arange(agents), t, 0,
                      noise.STREAM_PARTICIPATION, 1)[:, 0]
    return sorted(torch.argsort(u)[:count].tolist())
