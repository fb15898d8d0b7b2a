"""The agents' side of DP-IADMM: one local round (003 Algorithm 1, lines 15-23), batched.

Every function takes tensors with a leading agent dimension. A Flower client calls them
with P = 1 (its own partition), the engine with all P agents at once; the noise comes
from streams keyed by (seed, agent id, round, step), so both draw the same numbers.

The engine may also batch S independent runs (seeds) of one configuration: the variables
are then [S, P, J, K], w is [S, J, K], and run s draws from the streams of ``seeds[s]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dpadmm import noise, schedules
from dpadmm.config import RunConfig
from dpadmm.models import AgentData, clipped_sensitivity, gradient, probabilities, sensitivity


@dataclass(frozen=True)
class LocalResult:
    """What one local round produces for each agent."""

    z_sent: torch.Tensor  # [(S,) P, J, K] z_p^{t+1}, the released average (line 21)
    z_last: torch.Tensor  # [(S,) P, J, K] z_p^{t,E+1}, where the next round's chain starts (line 16)
    noise_magnitude: torch.Tensor  # [(S,) P] mean |noise| over the round's draws (003 Fig. 3)


def proximal_step(z: torch.Tensor, w: torch.Tensor, lam: torch.Tensor, g: torch.Tensor,
                  xi: torch.Tensor | float, rho: float, eta: float) -> torch.Tensor:
    """Closed-form minimiser of the perturbed proximal subproblem, eq. (8) of 003.

    argmin_z <g, z> + ||z - z^{t,e}||^2 / (2 eta) + (rho/2) ||w - z + (lambda - xi)/rho||^2
    = (z^{t,e}/eta + rho w + lambda - xi - g) / (1/eta + rho).

    Computed in place on one new tensor: the operands are [P, J, K] and the engine's are
    large (195 x 784 x 62), where every temporary costs a pass over memory.
    """
    out = lam - g
    if isinstance(xi, torch.Tensor) or xi:
        out.sub_(xi)
    out.add_(w, alpha=rho).add_(z, alpha=1.0 / eta)
    return out.div_(1.0 / eta + rho)


def trust_region_step(z: torch.Tensor, w: torch.Tensor, lam: torch.Tensor, g: torch.Tensor,
                      xi: torch.Tensor | float, rho: float, radius: float) -> torch.Tensor:
    """Closed-form minimiser of the perturbed trust-region subproblem, eq. (9) of 000.

    argmin_z <g, z> + (rho/2) ||w - z + (lambda - xi)/rho||^2  s.t. ||z - z^{t,e}||_inf <= r
    is separable per coordinate: the unconstrained minimiser w + (lambda - xi - g)/rho
    clipped to the box [z^{t,e} - r, z^{t,e} + r].
    """
    target = lam - g
    if isinstance(xi, torch.Tensor) or xi:
        target.sub_(xi)
    target.div_(rho).add_(w)
    return torch.minimum(torch.maximum(target, z - radius, out=target), z + radius, out=target)


def outp_step(z: torch.Tensor, w: torch.Tensor, lam: torch.Tensor, g: torch.Tensor, rho: float,
              inverse_eta: torch.Tensor) -> torch.Tensor:
    """OutP's proximal step before its output noise (Huang et al.; the baseline of 003).

    (z/eta + rho w + lambda - g) / (rho + 1/eta) with a per-agent 1/eta ([P] tensor).
    """
    inv = inverse_eta.reshape(-1, 1, 1)
    return (z * inv + rho * w + lam - g) / (rho + inv)


def laplace_scale(config: RunConfig, data: AgentData, probs: torch.Tensor) -> torch.Tensor:
    """Delta / eps-bar per agent ([(S,) P]), the scale of eq. (9a): Delta = 2C/I (or C/I) when clipped,
    else eq. (9b)."""
    if config.clipped:
        delta = clipped_sensitivity(config.clip_norm, data.total, config.neighbouring)
        return torch.full(probs.shape[:-2], delta / config.epsilon, dtype=probs.dtype, device=probs.device)
    return sensitivity(data, probs) / config.epsilon


def _noise(draw: Callable[..., torch.Tensor], seeds: Sequence[int] | None, config: RunConfig,
           data: AgentData, t: int, e: int, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Noise of round t, step e for every agent ([P, J, K]), or for every run of ``seeds`` ([S, P, J, K])."""
    if seeds is None:
        return draw(config.seed, data.agents, t, e, data.shape, scale, dtype=dtype)
    scales = scale.expand(len(seeds), data.num_agents)
    return torch.stack([draw(s, data.agents, t, e, data.shape, scales[i], dtype=dtype)
                        for i, s in enumerate(seeds)])


def objective_perturbation_round(config: RunConfig, data: AgentData, w: torch.Tensor,
                                 lam: torch.Tensor, z_chain: torch.Tensor, t: int,
                                 seeds: Sequence[int] | None = None) -> LocalResult:
    """Lines 15-22 of 003 Algorithm 1 for ObjP / ObjPM / ObjT / IADMM.

    Starting from the last local iterate z^{t,1} = z^{t-1,E+1}, take E steps of eq. (8)
    (or 000's trust-region eq. (9) for objt), each with fresh Laplace noise of scale
    Delta / eps (eq. (9a)), and release the average of the E iterates. Delta is 2C/I with
    clipped gradients (``sensitivity="clipped"``) or the papers' data-dependent eq. (9b).
    """
    rho_t = schedules.rho_at(config, t)
    steps = config.steps
    z = z_chain
    w = w.unsqueeze(-3)  # broadcast over the agents
    total = torch.zeros_like(z)
    magnitude = torch.zeros(z.shape[:-2], dtype=z.dtype, device=z.device)
    for e in range(1, steps + 1):
        probs = probabilities(data.x, z)
        g = gradient(data, z, scale=1.0 / data.total, reg=config.beta / config.num_agents, probs=probs,
                     clip=config.clip_norm if config.clipped else None)
        if config.private:
            xi = _noise(noise.laplace, seeds, config, data, t, e, laplace_scale(config, data, probs), z.dtype)
            magnitude += torch.linalg.vector_norm(xi, ord=1, dim=(-2, -1)) / (data.shape[0] * data.shape[1])
        else:
            xi = 0.0
        if config.algorithm == "objt":
            z = trust_region_step(z, w, lam, g, xi, rho_t, schedules.trust_radius(t, config.prox_scale))
        else:
            z = proximal_step(z, w, lam, g, xi, rho_t, schedules.eta(t, config.prox_scale))
        total += z
    return LocalResult(z_sent=total / steps, z_last=z, noise_magnitude=magnitude / steps)


def output_perturbation_round(config: RunConfig, data: AgentData, w_prev: torch.Tensor,
                              lam: torch.Tensor, z: torch.Tensor, t: int,
                              seeds: Sequence[int] | None = None) -> LocalResult:
    """One round of the OutP baseline for each agent (before the server's w update).

    Uses the previous global model w^t: a proximal step with the local-mean gradient, then
    Gaussian noise N(0, sigma^2) added to the output (delta = outp-delta).
    """
    rho_t = schedules.rho_at(config, t)
    num_params = data.shape[0] * data.shape[1]
    eps = config.effective_epsilon
    inverse_eta = schedules.outp_inverse_eta(t, data.counts, num_params, eps, config.outp_delta,
                                             config.prox_scale)
    g = gradient(data, z, scale=1.0 / data.counts, reg=config.beta)
    z_new = outp_step(z, w_prev.unsqueeze(-3), lam, g, rho_t, inverse_eta)
    magnitude = torch.zeros(z.shape[:-2], dtype=z.dtype, device=z.device)
    if config.private:
        sigma = schedules.outp_sigma(eps, config.outp_delta, rho_t, inverse_eta)
        nu = _noise(noise.gaussian, seeds, config, data, t, 1, sigma, z.dtype)
        z_new = z_new + nu
        magnitude = nu.abs().mean(dim=(-2, -1))
    return LocalResult(z_sent=z_new, z_last=z_new, noise_magnitude=magnitude)


def agent_round(config: RunConfig, data: AgentData, w: torch.Tensor, lam: torch.Tensor,
                z_chain: torch.Tensor, t: int, seeds: Sequence[int] | None = None) -> LocalResult:
    """One local round of the configured algorithm.

    ``w`` is the model the round uses: w^{t+1} for the objective-perturbation family
    (line 15), the previous w^t for OutP, whose server update comes after the agents'.
    ``seeds`` batches runs: w [S, J, K], lam and z_chain [S, P, J, K] (None: one run, config.seed).
    """
    if z_chain.dim() != (3 if seeds is None else 4) or (seeds is not None and len(seeds) != z_chain.shape[0]):
        raise ValueError(f"z_chain of shape {tuple(z_chain.shape)} does not match seeds={seeds}: "
                         "[P, J, K] without seeds, [S, P, J, K] with S seeds")
    if config.algorithm == "outp":
        return output_perturbation_round(config, data, w, lam, z_chain, t, seeds)
    return objective_perturbation_round(config, data, w, lam, z_chain, t, seeds)
