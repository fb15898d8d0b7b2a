"""dpadmm.linadmm.updates: paper 002's steps against their definitions (argmins, the theta table)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, minimize_scalar

from dpadmm.linadmm import updates

F64 = torch.float64

def test_the_theta_sequence_and_its_coefficients_match_the_table() -> None:
    """Algorithm 3's Nesterov sequence (step 5), worked out by hand: theta_1..theta_6 and
    (theta_t - 1) / theta_{t+1}."""
    thetas = [1.0]
    for _ in range(5):
        thetas.append(float(updates.next_theta(torch.tensor([thetas[-1]], dtype=F64))))
    assert thetas == pytest.approx([1.0, 1.618033989, 2.193527085, 2.749791340, 3.294879678, 3.832601400],
                                   abs=1e-9)
    coefficients = [(thetas[t] - 1) / thetas[t + 1] for t in range(5)]
    assert coefficients == pytest.approx([0.0, 0.281753525, 0.434042783, 0.531063805, 0.598778594], abs=1e-9)
    now, before = torch.tensor([[2.0], [2.0]], dtype=F64), torch.tensor([[1.0], [1.0]], dtype=F64)
    theta, following = torch.tensor(thetas[1:3], dtype=F64), torch.tensor(thetas[2:4], dtype=F64)
    assert updates.extrapolate(now, before, theta, following).flatten().tolist() == pytest.approx(
        [2.281753525, 2.434042783])  # per run: each with its own theta


def test_soft_threshold_is_the_argmin_of_its_problem() -> None:
    v = torch.tensor([-2.0, -0.3, 0.0, 0.1, 0.5, 3.0], dtype=F64)
    kappa = 0.4
    expected = [minimize_scalar(lambda y, vi=float(vi): kappa * abs(y) + (y - vi) ** 2 / 2,
                                bounds=(-5, 5), method="bounded", options={"xatol": 1e-10}).x for vi in v]
    assert updates.soft_threshold(v, kappa).tolist() == pytest.approx(expected, abs=1e-7)


def _problem(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    d, m = 5, 8
    a = torch.randn(m, d, generator=gen, dtype=F64)
    return (a, torch.randn(1, d, generator=gen, dtype=F64), torch.randn(1, m, generator=gen, dtype=F64),
            torch.randn(1, m, generator=gen, dtype=F64), torch.randn(1, d, generator=gen, dtype=F64))


def test_the_y_step_is_the_argmin_of_step_1() -> None:
    a, x, y0, u, _ = _problem()
    l1, rho = 0.7, 1.5

    def step_1(y: np.ndarray) -> float:
        r = (x @ a.T).numpy()[0] - y + u.numpy()[0]
        return l1 * np.abs(y).sum() + rho / 2 * r @ r

    options = {"xtol": 1e-10, "ftol": 1e-14, "maxiter": 100000}
    best = minimize(step_1, y0.numpy()[0], method="Powell", options=options)
    assert updates.y_step(a, x, u, l1, rho).numpy()[0] == pytest.approx(best.x, abs=1e-5)


@pytest.mark.parametrize("gamma_mode", ["minimum", "larger"])
def test_the_closed_form_x_step_is_the_argmin_of_eq_7(gamma_mode: str) -> None:
    """(7): <g + P, x> + (rho/2) ||A x - y + u||^2 + ||x - x_prev||_G^2 / (2 eta) with
    G = gamma I - eta rho A^T A, minimised numerically where G >= I (so that (7) is strongly convex)."""
    a, x_prev, y, u, g = _problem(1)
    rho, eta = 0.8, 0.05
    gamma = updates.gamma_min(a, eta, rho) * (1.0 if gamma_mode == "minimum" else 3.0)
    big_g = (gamma * torch.eye(5, dtype=F64) - eta * rho * a.T @ a).numpy()
    assert np.linalg.eigvalsh(big_g).min() >= 1 - 1e-9

    def eq_7(x: np.ndarray) -> float:
        r = a.numpy() @ x - y.numpy()[0] + u.numpy()[0]
        step = x - x_prev.numpy()[0]
        return g.numpy()[0] @ x + rho / 2 * r @ r + step @ big_g @ step / (2 * eta)

    best = minimize(eq_7, np.zeros(5), method="BFGS", options={"gtol": 1e-12})
    closed = updates.x_step(a, x_prev, y, u, g, rho, eta, gamma).numpy()[0]
    assert closed == pytest.approx(best.x, abs=1e-6)


def test_the_papers_dual_start_solves_a_t_u0_equals_minus_gradient_over_rho() -> None:
    """A = [W; I] has full column rank, so A^T pinv(A^T) = I and A^T u_0 = -(1/rho) grad f(x_0) exactly."""
    w = torch.tensor([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]], dtype=F64)
    a = torch.cat([w, torch.eye(3, dtype=F64)])
    gradient = torch.tensor([[0.3, -1.2, 0.7], [1.0, 2.0, -3.0]], dtype=F64)
    u0 = updates.paper_dual_start(a, gradient, rho=2.0)
    torch.testing.assert_close(u0 @ a, -gradient / 2.0)


def test_the_objective_is_the_loss_plus_the_fused_lasso_penalty() -> None:
    a = torch.tensor([[1.0, -1.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)
    x = torch.tensor([[2.0, -1.0]], dtype=F64)
    assert float(updates.objective(torch.tensor([0.5], dtype=F64), a, x, 0.1)) == pytest.approx(
        0.5 + 0.1 * (3 + 2 + 1))
    largest = float(torch.linalg.eigvalsh(a.T @ a).max())  # ||A^T A||_2
    assert math.isclose(updates.gamma_min(a, 0.5, 2.0), 0.5 * 2.0 * largest + 1)
