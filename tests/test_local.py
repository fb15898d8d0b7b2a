"""Local updates: each closed form equals the numerical minimiser of its subproblem.

eq. (8) of 003 (proximal), eq. (9) of 000 (infinity-norm trust region) and OutP's step,
on random inputs; then the E-step round (chain, average, noise) and its batching.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from dpadmm.iadmm import schedules
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.local import agent_round, outp_step, proximal_step, trust_region_step
from dpadmm.models.logistic import AgentData, gradient, probabilities, sensitivity
from dpadmm.privacy import noise

SHAPE = (4, 3)


def _random(seed: int, n: int = 5) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, *SHAPE, generator=gen, dtype=torch.float64) for _ in range(n)]


def _argmin(objective, x0: np.ndarray, bounds=None) -> np.ndarray:
    def fun(flat: np.ndarray) -> tuple[float, np.ndarray]:
        z = torch.tensor(flat.reshape(1, *SHAPE), requires_grad=True)
        value = objective(z)
        value.backward()
        return float(value.detach()), z.grad.numpy().ravel()

    result = minimize(fun, x0.ravel(), jac=True, method="L-BFGS-B", bounds=bounds,
                      options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000})
    return result.x.reshape(1, *SHAPE)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_proximal_step_minimises_eq_8(seed: int) -> None:
    z_e, w, lam, g, xi = _random(seed)
    rho, eta = 0.8 + seed, 1.0 / math.sqrt(seed + 1)

    def g_eq8(z: torch.Tensor) -> torch.Tensor:
        return ((g * z).sum() + ((z - z_e) ** 2).sum() / (2 * eta)
                + rho / 2 * ((w - z + (lam - xi) / rho) ** 2).sum())

    numeric = _argmin(g_eq8, np.zeros(z_e.numel()))
    np.testing.assert_allclose(proximal_step(z_e, w, lam, g, xi, rho, eta).numpy(), numeric, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trust_region_step_minimises_eq_9_of_000(seed: int) -> None:
    z_e, w, lam, g, xi = _random(seed + 10)
    rho, radius = 1.5, 1.5  # a radius that makes some constraints active and some not

    def g_eq9(z: torch.Tensor) -> torch.Tensor:
        return (g * z).sum() + rho / 2 * ((w - z + (lam - xi) / rho) ** 2).sum()

    lo, hi = (z_e - radius).numpy().ravel(), (z_e + radius).numpy().ravel()
    numeric = _argmin(g_eq9, z_e.numpy(), bounds=list(zip(lo, hi, strict=True)))
    closed = trust_region_step(z_e, w, lam, g, xi, rho, radius)
    np.testing.assert_allclose(closed.numpy(), numeric, atol=1e-7)
    active = (closed - z_e).abs().isclose(torch.tensor(radius, dtype=torch.float64))
    assert 0 < int(active.sum()) < active.numel()  # the test exercised both cases
    assert float((closed - z_e).abs().max()) <= radius + 1e-12


@pytest.mark.parametrize("seed", [0, 1])
def test_outp_step_minimises_its_subproblem(seed: int) -> None:
    z_prev, w, lam, g, _ = _random(seed + 20)
    rho, inv_eta = 0.1, torch.tensor([3.7], dtype=torch.float64)

    def subproblem(z: torch.Tensor) -> torch.Tensor:
        return ((g * z).sum() + float(inv_eta) / 2 * ((z - z_prev) ** 2).sum()
                + rho / 2 * ((w - z + lam / rho) ** 2).sum())

    numeric = _argmin(subproblem, np.zeros(z_prev.numel()))
    np.testing.assert_allclose(outp_step(z_prev, w, lam, g, rho, inv_eta).numpy(), numeric, atol=1e-7)


def _data(num_agents: int = 4, seed: int = 0) -> AgentData:
    gen = torch.Generator().manual_seed(seed)
    counts = [5 + 2 * p for p in range(num_agents)]
    xs = [torch.rand(c, SHAPE[0], generator=gen, dtype=torch.float64) for c in counts]
    ys = [torch.randint(0, SHAPE[1], (c,), generator=gen) for c in counts]
    return AgentData.from_blocks(xs, ys, num_classes=SHAPE[1], total=sum(counts) + 3,
                                 agents=range(num_agents))


def _state(num_agents: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*SHAPE, generator=gen, dtype=torch.float64)
    lam = torch.randn(num_agents, *SHAPE, generator=gen, dtype=torch.float64)
    z = torch.randn(num_agents, *SHAPE, generator=gen, dtype=torch.float64)
    return w, lam, z


@pytest.mark.parametrize("calibration", ["data-dependent", "clipped"])
def test_objpm_round_follows_lines_15_to_22(calibration: str) -> None:
    """E steps of eq. (8) from the last iterate, keyed Laplace noise, the average is sent."""
    config = papers(algorithm="objpm", epsilon=0.5, local_steps=3, num_agents=4, seed=11,
                       sensitivity=calibration, clip_norm=1.0)
    data = _data()
    w, lam, z0 = _state(4, 1)
    t = 5
    result = agent_round(config, data, w, lam, z0, t)
    rho_t, eta_t = schedules.rho_at(config, t), schedules.eta(t, 1.0)
    z, iterates, mags = z0, [], []
    for e in (1, 2, 3):
        probs = probabilities(data.x, z)
        residual = probs - data.y
        if calibration == "clipped":
            # each sample's term x_i (h_i - y_i)^T scaled to L1 norm <= C = 1; Delta = 2C/I
            norms = torch.einsum("pi,pik->pi", data.x_l1, residual.abs())
            residual = residual * torch.clamp(1.0 / norms, max=1.0).nan_to_num(1.0).unsqueeze(2)
            scale = torch.full((4,), 2.0 / data.total / 0.5, dtype=torch.float64)
            assert float((norms > 1.0).float().mean()) > 0.3  # clipping is active
        else:
            scale = sensitivity(data, probs) / 0.5
        g = torch.bmm(data.x.transpose(1, 2), residual) / data.total + 2 * config.beta / 4 * z
        xi = noise.laplace(11, data.agents, t, e, SHAPE, scale)
        z = (z / eta_t + rho_t * w + lam - xi - g) / (1 / eta_t + rho_t)
        iterates.append(z)
        mags.append(xi.abs().mean(dim=(1, 2)))
    torch.testing.assert_close(result.z_sent, sum(iterates) / 3, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(result.z_last, iterates[-1], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(result.noise_magnitude, sum(mags) / 3)
    assert float(result.noise_magnitude.min()) > 0


@pytest.mark.parametrize("radius", ["paper", "reference"])
def test_objt_round_takes_eq_9_with_the_chosen_radius(radius: str) -> None:
    """ObjT's step is eq. (9) of 000 with delta^t = a/t^2 (paper) or the constant a (the authors' code)."""
    config = papers(algorithm="objt", epsilon=0.5, num_agents=4, seed=2, prox_scale=0.5,
                       sensitivity="data-dependent", trust_radius=radius)
    data = _data()
    w, lam, z = _state(4, 4)
    t = 9
    result = agent_round(config, data, w, lam, z, t)
    delta_t = 0.5 / 81 if radius == "paper" else 0.5
    probs = probabilities(data.x, z)
    g = gradient(data, z, scale=1 / data.total, reg=config.beta / 4)
    xi = noise.laplace(2, data.agents, t, 1, SHAPE, sensitivity(data, probs) / 0.5)
    expected = trust_region_step(z, w, lam, g, xi, schedules.rho_at(config, t), delta_t)
    torch.testing.assert_close(result.z_sent, expected, rtol=1e-12, atol=1e-14)
    moved = (result.z_sent - z).abs()
    assert float(moved.max()) == pytest.approx(delta_t)  # some coordinate is held at the radius
    if radius == "reference":
        assert float(moved.max()) > 0.5 / 81  # beyond the paper's radius


@pytest.mark.parametrize("algorithm", ["objp", "objpm", "objt", "outp", "iadmm"])
def test_one_agent_alone_equals_its_row_of_the_batch(algorithm: str) -> None:
    """The Flower client (P = 1) and the engine (all P) compute the same numbers."""
    config = papers(algorithm=algorithm, epsilon=0.3, num_agents=4, seed=3)
    data = _data()
    w, lam, z = _state(4, 2)
    batched = agent_round(config, data, w, lam, z, 7)
    for p in range(4):
        n = int(data.counts[p])
        alone = AgentData.from_blocks([data.x[p, :n]], [data.y[p, :n].argmax(1)], num_classes=SHAPE[1],
                                      total=data.total, agents=[p])
        single = agent_round(config, alone, w, lam[p:p + 1], z[p:p + 1], 7)
        torch.testing.assert_close(single.z_sent[0], batched.z_sent[p], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(single.z_last[0], batched.z_last[p], rtol=1e-12, atol=1e-13)


def test_non_private_round_draws_no_noise() -> None:
    config = papers(algorithm="objp", epsilon=math.inf, num_agents=4)
    data = _data()
    w, lam, z = _state(4, 3)
    result = agent_round(config, data, w, lam, z, 2)
    g = gradient(data, z, scale=1 / data.total, reg=config.beta / 4)
    expected = proximal_step(z, w, lam, g, 0.0, schedules.rho_at(config, 2), schedules.eta(2, 1.0))
    torch.testing.assert_close(result.z_sent, expected)
    assert float(result.noise_magnitude.abs().max()) == 0.0


def test_a_batch_of_runs_needs_one_seed_per_run() -> None:
    config = papers(algorithm="objp", epsilon=0.3, num_agents=4)
    data = _data()
    w, lam, z = _state(4, 4)
    with pytest.raises(ValueError, match="does not match seeds"):
        agent_round(config, data, w[None], lam[None], z[None], 1)  # [1, P, J, K] without seeds
    with pytest.raises(ValueError, match="does not match seeds"):
        agent_round(config, data, w[None], lam[None], z[None], 1, seeds=[0, 1])
    with pytest.raises(ValueError, match="does not match seeds"):
        agent_round(config, data, w, lam, z, 1, seeds=[0])


@pytest.mark.parametrize("algorithm", ["objpm", "objt"])
def test_a_global_local_start_is_the_chain_started_at_w(algorithm: str) -> None:
    """local-start=global: the round is the papers' round with z^{t,1} = w^{t+1} for every agent, whatever
    the agents' last iterates were; outp refuses it."""
    config = papers(algorithm=algorithm, epsilon=0.3, local_steps=3 if algorithm == "objpm" else 0,
                       num_agents=4, seed=3)
    data = _data()
    w, lam, z = _state(4, 2)
    restarted = agent_round(dataclasses.replace(config, local_start="global"), data, w, lam, z, 5)
    chained = agent_round(config, data, w, lam, w.expand_as(z).clone(), 5)
    torch.testing.assert_close(restarted.z_sent, chained.z_sent, rtol=0, atol=0)
    torch.testing.assert_close(restarted.z_last, chained.z_last, rtol=0, atol=0)
    assert not torch.equal(restarted.z_sent, agent_round(config, data, w, lam, z, 5).z_sent)
    with pytest.raises(ValueError, match="local-start='global' is not allowed with algorithm='outp'"):
        papers(algorithm="outp", local_start="global")


def test_release_last_sends_the_last_iterate_of_the_same_steps() -> None:
    """release=last: the same E noisy steps as the papers' round, which sends their average; the last
    iterate is sent instead, and the chain goes on from it either way. OutP, one step, refuses the key."""
    config = papers(epsilon=0.3, local_steps=3, num_agents=4, seed=3)
    data = _data()
    w, lam, z = _state(4, 2)
    average = agent_round(config, data, w, lam, z, 5)
    last = agent_round(dataclasses.replace(config, release="last"), data, w, lam, z, 5)
    torch.testing.assert_close(last.z_last, average.z_last, rtol=0, atol=0)
    torch.testing.assert_close(last.z_sent, average.z_last, rtol=0, atol=0)
    assert not torch.allclose(average.z_sent, average.z_last)
    assert last.z_sent.data_ptr() != last.z_last.data_ptr()  # a copy: the next step may change the chain
    for key, value in (("release", "last"), ("server_update", "mean")):
        name = key.replace("_", "-")
        with pytest.raises(ValueError, match=f"{name}='{value}' is not allowed with algorithm='outp'"):
            papers(algorithm="outp", **{key: value})
