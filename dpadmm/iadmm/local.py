"""The agents' side of DP-IADMM: one local round (003 Algorithm 1, lines 15-23), batched.

Every function takes tensors with a leading agent dimension. A Flower client calls them
with P = 1 (its own partition), the engine with all P agents at once. In simulation the noise
comes from streams keyed by (seed, agent id, round, step), so both draw the same numbers; a
deployed client passes ``randomness`` (:class:`dpadmm.privacy.randomness.Secret`), its own
secret streams, and its noisy gradient is the grid mechanism's release of g instead of g + xi.

The engine may also batch S independent runs (seeds) of one configuration: the variables
are then [S, P, J, K], w is [S, J, K], and run s draws from the streams of ``seeds[s]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dpadmm.iadmm import schedules
from dpadmm.iadmm.config import RunConfig
from dpadmm.models.logistic import AgentData, gradient
from dpadmm.models.modules import Params, numel, tree_map
from dpadmm.models.oracles import PER_SAMPLE_BUDGET, GradientSpec, LogisticOracle, ModuleOracle
from dpadmm.privacy import noise
from dpadmm.privacy.randomness import Secret

Tree = torch.Tensor | Params  # logistic regression's one tensor, or a module's parameters
Oracle = LogisticOracle | ModuleOracle


@dataclass(frozen=True)
class LocalResult:
    """What one local round produces for each agent."""

    z_sent: Tree  # [(S,) P, J, K] (or a module's [P, ...] tensors) z_p^{t+1}, the released average (line 21)
    z_last: Tree  # the same shapes: z_p^{t,E+1}, where the next round's chain starts (line 16)
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


def _noise(draw: Callable[..., torch.Tensor], seeds: Sequence[int] | None, config: RunConfig,
           agents: torch.Tensor, t: int, e: int, like: Tree, scale: torch.Tensor,
           stream: int) -> Tree:
    """Noise of round t, step e for every agent, shaped like ``like``: [P, J, K] (or [S, P, J, K] for
    every run of ``seeds``), or a dict of [P, ...] tensors split from one draw per agent.

    A module's parameters are one vector per agent in the module's parameter order, so its
    noise is the same whatever the parameters are named or how the agents are chunked.
    """
    if isinstance(like, Mapping):
        sizes = [v[0].numel() for v in like.values()]
        flat = draw(config.seed, agents, t, e, (sum(sizes),), scale, dtype=_dtype(like), stream=stream,
                    generator=config.noise_generator)
        parts = flat.to(scale.device).split(sizes, dim=1)
        return {k: part.view(v.shape) for (k, v), part in zip(like.items(), parts, strict=True)}
    shape = tuple(like.shape[-2:])
    if seeds is None:
        return draw(config.seed, agents, t, e, shape, scale, dtype=like.dtype, stream=stream,
                    generator=config.noise_generator)
    scales = scale.expand(len(seeds), agents.shape[0])
    draws = [draw(s, agents, t, e, shape, scales[i], dtype=like.dtype, stream=stream,
                  generator=config.noise_generator) for i, s in enumerate(seeds)]
    return draws[0].unsqueeze(0) if len(draws) == 1 else torch.stack(draws)  # one run: no copy


def _released(randomness: Secret, mechanism: str, g: Tree, scale: torch.Tensor, agents: torch.Tensor, t: int,
              e: int, stream: int) -> Tree:
    """The deployment kind's noisy gradient of every agent: g's release by the grid mechanism
    (:meth:`~dpadmm.privacy.randomness.Secret.release`), one vector per agent (a module's parameters
    flattened in their order, as the keyed draws are)."""
    if isinstance(g, Mapping):
        sizes = [v[0].numel() for v in g.values()]
        flat = torch.cat([v.flatten(1) for v in g.values()], dim=1)
        parts = randomness.release(mechanism, flat, scale, agents, t, e, stream).split(sizes, dim=1)
        return {k: part.view(v.shape) for (k, v), part in zip(g.items(), parts, strict=True)}
    if g.dim() == 4:  # the engine's one run: [1, P, J, K]
        return randomness.release(mechanism, g[0], scale.reshape(-1), agents, t, e, stream).unsqueeze(0)
    return randomness.release(mechanism, g, scale, agents, t, e, stream)


def _dtype(tree: Tree) -> torch.dtype:
    return next(iter(tree.values())).dtype if isinstance(tree, Mapping) else tree.dtype


def _mean_abs(xi: Tree) -> torch.Tensor:
    """Mean |noise| per agent over its coordinates ([(S,) P]), the noise magnitude of 003 Fig. 3."""
    if isinstance(xi, Mapping):
        return sum(v.abs().flatten(1).sum(dim=1) for v in xi.values()) / numel(xi, agent_dim=True)
    return torch.linalg.vector_norm(xi, ord=1, dim=(-2, -1)) / (xi.shape[-2] * xi.shape[-1])


def objective_perturbation_round(config: RunConfig, oracle: Oracle, w: Tree, lam: Tree, z_chain: Tree,
                                 t: int, seeds: Sequence[int] | None = None,
                                 randomness: Secret | None = None) -> LocalResult:
    """Lines 15-22 of 003 Algorithm 1 for ObjP / ObjPM / ObjT / IADMM, for any model.

    Starting from the last local iterate z^{t,1} = z^{t-1,E+1} (or, with ``local-start = "global"``,
    from w^{t+1}, as FedAvg restarts every client from the global model), take E steps of eq. (8)
    (or 000's trust-region eq. (9) for objt), each with fresh noise of scale Delta / eps
    (eq. (9a); Laplace, or Gaussian with ``mechanism="gaussian"``), and release the average
    of the E iterates (``release="last"``: the last one). The oracle gives g and Delta / eps: the
    papers' logistic regression (Delta = 2C/I when clipped, else the data-dependent eq. (9b)) or any module
    (clipped). The steps apply per parameter tensor; they are elementwise. With deployment ``randomness`` the
    step's noisy gradient is the grid release of g (the same mechanism, sampled so that its floating-point
    output depends on g only through g's rounding to the grid) and xi = 0.
    """
    rho_t = schedules.rho_at(config, t)
    steps = config.steps
    draw = noise.gaussian if config.mechanism == "gaussian" else noise.laplace
    if not isinstance(w, Mapping):
        w = w.unsqueeze(-3)  # broadcast over the agents (a module's [...] broadcasts against [P, ...])
    # Line 16: the chain continues from the last local iterate; local-start=global restarts it at w^{t+1}
    z = z_chain
    if config.local_start == "global":
        z = tree_map(lambda w_, z_: w_.expand_as(z_).clone(), w, z_chain)
    no_noise = tree_map(lambda _: 0.0, z)
    # the sum of the E iterates, for release=average only (release=last sends z as it ends)
    total = tree_map(torch.zeros_like, z) if config.release == "average" else None
    # [(S,) P] for logistic regression's tensors, [P] for a module's parameters
    first = next(iter(z.values())) if isinstance(z, Mapping) else z
    runs_agents = first.shape[:1] if isinstance(z, Mapping) else z.shape[:-2]
    magnitude = torch.zeros(runs_agents, dtype=first.dtype, device=first.device)
    for e in range(1, steps + 1):
        g, scale = oracle.gradient(z, t, e)
        if e == 1:  # the step may shrink with the noise (schedules.local_eta): known from here
            step = _step(config, t, rho_t, scale, z)
        xi = no_noise
        if scale is not None and randomness is not None:
            noisy = _released(randomness, config.mechanism, g, scale, oracle.agents, t, e,
                              noise.STREAM_OBJECTIVE)
            magnitude = magnitude + _mean_abs(tree_map(torch.sub, noisy, g))
            g = noisy
        elif scale is not None:
            xi = _noise(draw, seeds, config, oracle.agents, t, e, z, scale, noise.STREAM_OBJECTIVE)
            magnitude = magnitude + _mean_abs(xi)
        z = tree_map(step, z, w, lam, g, xi)
        if total is not None:
            total = tree_map(torch.Tensor.add_, total, z)
    # Line 21: the average of the E iterates; release=last sends the last one (a copy: the chain goes on)
    z_sent = (tree_map(lambda v: v.div_(steps), total) if total is not None
              else tree_map(torch.clone, z))
    return LocalResult(z_sent=z_sent, z_last=z, noise_magnitude=magnitude / steps)


def release_bound(config: RunConfig, largest: float) -> float:
    """An a-priori bound on any coordinate of an agent's gradient before its noise (eq. (9a) of 003, with the
    oracle's g = (1/(qI)) sum_i clip(g_i) + (2 beta / P) z): 2 (beta / P) max|z| + C / q. A clipped term has
    norm at most C, hence each of its coordinates; at most I terms are summed, scaled by 1/(qI) (1/I without
    sampling, q = 1; a minibatch's I_p / (B I) over B terms gives at most C too). ``largest`` bounds |z| for
    the round's first step (the server's w, lambda_p and last iterate); later steps start from released
    values. A device checks it before it reads its data (``clients.gate``), so that whether the sums stay
    finite is decided by what the server sent and the run config, never by a sample."""
    return 2.0 * config.beta / config.num_agents * largest + config.clip_norm / config.sampling_rate


def _step(config: RunConfig, t: int, rho_t: float, scale: torch.Tensor | None,
          z: Tree) -> Callable[..., torch.Tensor]:
    """The elementwise local step of round t: eq. (8) with :func:`dpadmm.iadmm.schedules.local_eta` of this
    step's noise (``scale``, per agent), or ObjT's trust region with a = the configured scale times
    :func:`dpadmm.iadmm.schedules.noise_damping`."""
    # logistic regression's weights are [features, K]; a module's room does not read K (0)
    num_params, classes = ((sum(v[0].numel() for v in z.values()), 0) if isinstance(z, Mapping)
                           else (z.shape[-2] * z.shape[-1], z.shape[-1]))
    if config.algorithm == "objt":
        a = config.scale * schedules.noise_damping(config, scale, num_params, classes)
        radius = schedules.trust_radius(t, a, config.trust_radius)
        return lambda z_, w_, l_, g_, x_: trust_region_step(z_, w_, l_, g_, x_, rho_t, radius)
    eta = schedules.local_eta(config, t, scale, num_params, classes)
    return lambda z_, w_, l_, g_, x_: proximal_step(z_, w_, l_, g_, x_, rho_t, eta)


def output_perturbation_round(config: RunConfig, data: AgentData, w_prev: torch.Tensor,
                              lam: torch.Tensor, z: torch.Tensor, t: int,
                              seeds: Sequence[int] | None = None,
                              randomness: Secret | None = None) -> LocalResult:
    """One round of the OutP baseline for each agent (before the server's w update).

    Uses the previous global model w^t: a proximal step with the local-mean gradient, then
    Gaussian noise N(0, sigma^2) added to the output (delta = outp-delta).
    """
    rho_t = schedules.rho_at(config, t)
    num_params = data.shape[0] * data.shape[1]
    eps = config.effective_epsilon
    inverse_eta = schedules.outp_inverse_eta(t, data.counts, num_params, eps, config.outp_delta,
                                             config.scale)
    g = gradient(data, z, scale=1.0 / data.counts, reg=config.beta)
    z_new = outp_step(z, w_prev.unsqueeze(-3), lam, g, rho_t, inverse_eta)
    magnitude = torch.zeros(z.shape[:-2], dtype=z.dtype, device=z.device)
    if config.private:
        sigma = schedules.outp_sigma(eps, config.outp_delta, rho_t, inverse_eta)
        if randomness is not None:
            released = _released(randomness, "gaussian", z_new, sigma, data.agents, t, 1, noise.STREAM_OUTPUT)
            magnitude = (released - z_new).abs().mean(dim=(-2, -1))
            z_new = released
        else:
            nu = _noise(noise.gaussian, seeds, config, data.agents, t, 1, z, sigma, noise.STREAM_OUTPUT)
            z_new = z_new + nu
            magnitude = nu.abs().mean(dim=(-2, -1))
    return LocalResult(z_sent=z_new, z_last=z_new, noise_magnitude=magnitude)


def gradient_spec(config: RunConfig) -> GradientSpec:
    """The oracle's view of ``config``: clipping while the clipped calibration is in force, noise 1/eps-bar
    per unit of sensitivity while the run is private (with no clipping: eq. (9b), data-dependent)."""
    return GradientSpec(beta=config.beta, num_agents=config.num_agents,
                        clip=config.clip_norm if config.clipped else None, norm=config.clip_norm_type,
                        noise=1.0 / config.epsilon if config.private else None,
                        neighbouring=config.neighbouring,
                        batch_size=config.batch_size, sampling=config.sampling_rate, seed=config.seed,
                        per_sample=config.per_sample)


def oracle(config: RunConfig, data: AgentData, module: nn.Module | None = None, *, vectorize: bool = True,
           budget: int = PER_SAMPLE_BUDGET, seeds: Sequence[int] | None = None,
           randomness: Secret | None = None) -> Oracle:
    """The oracle of a run: the closed-form logistic one (``module=None``; ``seeds`` batches runs), else
    ``module``'s; ``randomness`` (deployment) draws its samples from the agents' secret streams."""
    if module is None:
        return LogisticOracle(gradient_spec(config), data, seeds, randomness)
    if config.model == "logistic":
        # The configuration's checks (no OutP, clipped sensitivity, minibatch rules) are those of
        # its model: a module run under model='logistic' would escape them.
        raise ValueError(f"a module ({type(module).__name__}) was given but model='logistic' (the "
                         "closed-form fast path); set model='custom' for your own module, or the "
                         "built-in name")
    return ModuleOracle(gradient_spec(config), module, data, vectorize=vectorize, budget=budget,
                        randomness=randomness)


def agent_round(config: RunConfig, data: AgentData, w: Tree, lam: Tree, z_chain: Tree, t: int,
                seeds: Sequence[int] | None = None, *, module: nn.Module | None = None,
                vectorize: bool = True, randomness: Secret | None = None) -> LocalResult:
    """One local round of the configured algorithm.

    ``w`` is the model the round uses: w^{t+1} for the objective-perturbation family
    (line 15), the previous w^t for OutP, whose server update comes after the agents'.
    Logistic regression (``module=None``): w [J, K], lam and z_chain [P, J, K]; ``seeds``
    batches runs: w [S, J, K], lam and z_chain [S, P, J, K] (None: one run, config.seed).
    Any other model: ``module`` and dicts of its parameters, w [...] and lam, z_chain [P, ...];
    ``vectorize`` batches the agents under vmap (False: a plain loop). ``randomness`` is the deployment
    kind's (:class:`~dpadmm.privacy.randomness.Secret`, one run); None is the simulation kind, keyed by
    the seeds.
    """
    if randomness is not None and seeds is not None and len(seeds) != 1:
        raise ValueError(f"seeds={list(seeds)} is not allowed with deployment randomness: it runs one run")
    if module is not None:
        if seeds is not None:
            raise ValueError(f"seeds={list(seeds)} is not allowed with a module model; "
                             "run one seed at a time")
        return objective_perturbation_round(config, oracle(config, data, module, vectorize=vectorize,
                                                           randomness=randomness),
                                            w, lam, z_chain, t, randomness=randomness)
    if z_chain.dim() != (3 if seeds is None else 4) or (seeds is not None and len(seeds) != z_chain.shape[0]):
        raise ValueError(f"z_chain of shape {tuple(z_chain.shape)} does not match seeds={seeds}: "
                         "[P, J, K] without seeds, [S, P, J, K] with S seeds")
    if config.algorithm == "outp":
        return output_perturbation_round(config, data, w, lam, z_chain, t, seeds, randomness)
    return objective_perturbation_round(config, oracle(config, data, seeds=seeds, randomness=randomness), w,
                                        lam, z_chain, t, seeds, randomness)
