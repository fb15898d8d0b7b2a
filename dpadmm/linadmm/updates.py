"""The equations of DP-ADMM and DP-AccADMM (paper 002, Xu et al.), one function each.

The problem is min f(x) + g(y) subject to A x - y = 0 (eq. (2) with B = -I, c = 0), with
f the mean logistic loss and g(y) = lambda ||y||_1, so that g(A x) is the graph-guided fused
lasso of eq. (11). The dual u is the scaled one. Every function takes runs batched along the
first dimension: x [S, d], y and u [S, m], A [m, d].

Algorithm 2 (DP-ADMM), iteration t:  y-step (eq. (3)), the linearised x-step with the noisy
gradient (eq. (7), closed form), the dual step (step 3). Algorithm 3 (DP-AccADMM) takes the
same steps from the extrapolated x-hat and u-hat and then extrapolates x and u (not y) with
Nesterov's theta sequence (steps 5-7). Theorem 1 (eq. (8)), the noise, is in
:mod:`dpadmm.linadmm.privacy`.
"""

from __future__ import annotations

import torch


def soft_threshold(v: torch.Tensor, kappa: float) -> torch.Tensor:
    """S_kappa(v) = sign(v) max(|v| - kappa, 0): the argmin over y of kappa ||y||_1 + ||y - v||^2 / 2."""
    return torch.sign(v) * (v.abs() - kappa).clamp(min=0.0)


def y_step(a: torch.Tensor, x: torch.Tensor, u: torch.Tensor, l1: float, rho: float) -> torch.Tensor:
    """y_t = argmin_y lambda ||y||_1 + (rho/2) ||A x_{t-1} - y + u_{t-1}||^2
    = S_{lambda/rho}(A x_{t-1} + u_{t-1}) (step 1 of Algorithm 2, eq. (3) with B = -I, c = 0)."""
    return soft_threshold(x @ a.T + u, l1 / rho)


def x_step(a: torch.Tensor, x: torch.Tensor, y: torch.Tensor, u: torch.Tensor, noisy_gradient: torch.Tensor,
           rho: float, eta: float, gamma: float) -> torch.Tensor:
    """The linearised x-step of eq. (7) in closed form (step 2 of Algorithm 2):

    x_t = x_{t-1} - (eta / gamma) [grad f(x_{t-1}) + P_t + rho A^T (A x_{t-1} - y_t + u_{t-1})].

    Setting the gradient of (7) to zero with G = gamma I - eta rho A^T A cancels the rho A^T A x
    term, which is what makes the step explicit; it holds for any gamma (the theory needs
    gamma >= gamma_min so that G >= I).
    """
    return x - (eta / gamma) * (noisy_gradient + rho * ((x @ a.T - y + u) @ a))


def dual_step(a: torch.Tensor, x: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """u_t = u_{t-1} + A x_t - y_t (step 3 of Algorithm 2, B = -I, c = 0)."""
    return u + x @ a.T - y


def gamma_min(a: torch.Tensor, eta: float, rho: float) -> float:
    """eta rho ||A^T A||_2 + 1, the smallest gamma for which G = gamma I - eta rho A^T A >= I (002,
    Sec. III)."""
    return eta * rho * float(torch.linalg.matrix_norm(a, ord=2)) ** 2 + 1.0


def next_theta(theta: torch.Tensor) -> torch.Tensor:
    """theta_{t+1} = (1 + sqrt(1 + 4 theta_t^2)) / 2 per run (step 5 of Algorithm 3; theta_1 = 1)."""
    return (1.0 + torch.sqrt(1.0 + 4.0 * theta * theta)) / 2.0


def extrapolate(current: torch.Tensor, previous: torch.Tensor, theta: torch.Tensor, theta_next: torch.Tensor
                ) -> torch.Tensor:
    """current + ((theta_t - 1) / theta_{t+1}) (current - previous), theta per run [S]: x-hat_t and u-hat_t
    (steps 6 and 7 of Algorithm 3)."""
    return current + ((theta - 1.0) / theta_next).unsqueeze(-1) * (current - previous)


def combined_residual(a: torch.Tensor, x: torch.Tensor, x_hat: torch.Tensor, u: torch.Tensor,
                      u_hat: torch.Tensor, rho: float) -> torch.Tensor:
    """c_t = rho ||u_t - u-hat_{t-1}||^2 + rho ||A (x_t - x-hat_{t-1})||^2 per run: the combined residual of
    Goldstein, O'Donoghue, Setzer & Baraniuk's fast ADMM with restart (SIAM J. Imaging Sci. 2014,
    Algorithm 8), for the scaled dual u = lambda / rho. Not in 002: its DP-AccADMM never restarts."""
    return rho * ((u - u_hat).square().sum(dim=1) + ((x - x_hat) @ a.T).square().sum(dim=1))


def paper_dual_start(a: torch.Tensor, gradient: torch.Tensor, rho: float) -> torch.Tensor:
    """u_0 = -(1/rho) pinv(A^T) grad f(x_0) (the input of Algorithms 2 and 3), for gradient [S, d].

    With A = [W; I] of full column rank, A^T u_0 = -(1/rho) grad f(x_0) exactly. The gradient
    is the un-noised one of the private data: this start is not covered by Theorem 1.
    """
    return -(gradient @ torch.linalg.pinv(a.T).T) / rho


def objective(loss: torch.Tensor, a: torch.Tensor, x: torch.Tensor, l1: float) -> torch.Tensor:
    """F(x) = f(x) + lambda ||A x||_1 per run (eq. (11) at y = A x); ``loss`` is f(x) [S]."""
    return loss + l1 * (x @ a.T).abs().sum(dim=1)
