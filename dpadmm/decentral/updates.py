"""The updates of paper 004 (Xiao, Ye & Devadas), one function each, batched over runs and agents.

Shapes: S runs (seeds), N agents, d coordinates; iterates x [S, N, d]; the graph's adjacency A [N, N]
or one per run [S, N, N] (0/1, symmetric, no self-loops; the paper draws a new graph per run), and
the agents' data [N, b, d] or [S, N, b, d] likewise. Every update has the paper's form (Sec. 2.1)

    x_i^{k+1} = Term A (a random convex combination of public iterates) - Term B (alpha_k times a
                gradient of f_i) + a public offset + Delta_i^{k+1},

and returns, next to the new iterate, the interval [lo, hi] in which the mean of x_i^{k+1} is uniform
given the public past when the weights are drawn from U(0, 1) (Term A's range, plus the offsets): the
ex-post accountant's tau_i^{k+1} (eq. (10)). With weights fixed at 1/2 the mean is one point and the
release costs the worst case.

The loss of agent i (Sec. 5): f_i(x) = (1/b_i) sum_j log(1 + exp(-L_j x^T z_j)) + ||x||^2 / 2, labels
L_j = +-1 (the paper writes 0/1 labels, which would make a sample of label 0 contribute the constant
log 2 and no gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class Released:
    """An update's new iterates [S, N, d] and the interval [lo, hi] of their means (before the noise)."""

    x: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor


def _margins(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # einsum, not matmul: features shared by the runs ([N, b, d]) stay one batch of N products over the runs
    # instead of being copied S times
    return labels * torch.einsum("...bd,...d->...b", features, x)


def loss(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """f_i(x_i) of every run and agent, [S, N], from features [(S,) N, b, d], labels +-1 [(S,) N, b] and
    x [S, N, d]."""
    data = torch.nn.functional.softplus(-_margins(features, labels, x)).mean(dim=-1)
    return data + 0.5 * x.square().sum(dim=-1)


def gradient(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad f_i(x_i), [S, N, d]: -(1/b) sum_j L_j sigmoid(-L_j x^T z_j) z_j + x."""
    weights = -labels * torch.sigmoid(-_margins(features, labels, x)) / features.shape[-2]
    return torch.einsum("...bd,...b->...d", features, weights) + x


def hessian(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The Hessian of f_i at x_i, [S, N, d, d]: (1/b) sum_j s_j (1 - s_j) z_j z_j^T + I with
    s_j = sigmoid(L_j x^T z_j) (the labels +-1 square away)."""
    s = torch.sigmoid(_margins(features, labels, x))
    weighted = features * (s * (1 - s) / features.shape[-2]).unsqueeze(-1)  # [(S,) N, b, d]
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    return features.transpose(-2, -1) @ weighted + eye


def neighbour_sums(x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
    """sum_{j in N_i} x_j of every agent, [S, N, d], from the exchanged iterates."""
    return adjacency.to(x.dtype) @ x


def neighbour_mean(x: torch.Tensor, adjacency: torch.Tensor, sums: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """x^_i = (1/|N_i|) sum_{j in N_i} x_j, [S, N, d] (Algorithm 1 is written for the complete graph, where
    |N_i| = N - 1; the paper's experiments run on random graphs); ``sums`` the neighbour sums as the agents
    learnt them (default: from x)."""
    sums = neighbour_sums(x, adjacency) if sums is None else sums
    return sums / adjacency.to(x.dtype).sum(dim=-1, keepdim=True)


def term_a(x: torch.Tensor, mean: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Algorithm 1's Term A, x_i^k + w ⊙ (x^_i^k - x_i^k): the random convex combination of the agent's
    iterate and its neighbour mean (w ~ U(0, 1) per coordinate, or 1/2)."""
    return x + weights * (mean - x)


def newton(residual: Callable[[torch.Tensor], torch.Tensor], jacobian: Callable[[torch.Tensor], torch.Tensor],
           start: torch.Tensor, steps: int = 50, tol: float = 1e-14) -> torch.Tensor:
    """The root of ``residual`` (a gradient, [..., d]) by Newton's method with its ``jacobian`` [..., d, d],
    batched; at most ``steps`` steps, stopping once every step is below ``tol`` (about 6 steps here: the
    objectives of this family are smooth and strongly convex)."""
    point = start
    for _ in range(steps):
        step = torch.linalg.solve(jacobian(point), residual(point).unsqueeze(-1)).squeeze(-1)
        point = point - step
        if float(step.abs().max()) < tol:
            break
    return point


def admm_step(x: torch.Tensor, dual: torch.Tensor, grad: torch.Tensor, adjacency: torch.Tensor,
              weights: torch.Tensor, penalty: float, sums: torch.Tensor | None = None) -> Released:
    """Algorithm 1's x-update (eq. (6) in the notes' form, on any graph), before the noise:
    x_i^{k+1} = x_i^k + w ⊙ (x^_i^k - x_i^k) + (lambda_i^k - grad f_i(x_i^k)) / D, w in (0, 1)^d per agent
    (w = (N - 1) rho-bar / D, so that Gamma = D (1 - w): the random penalties of step 1). Term A is
    uniform between x_i^k and x^_i^k in each coordinate when w ~ U(0, 1); alpha_k = 1/D. ``sums``: the
    neighbour sums as the agents learnt them (by secret sharing, Algorithm 3; default: from x)."""
    mean = neighbour_mean(x, adjacency, sums)
    offset = (dual - grad) / penalty
    return Released(x=term_a(x, mean, weights) + offset, lo=torch.minimum(x, mean) + offset,
                    hi=torch.maximum(x, mean) + offset)


def admm_exact_step(x: torch.Tensor, dual: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                    adjacency: torch.Tensor, weights: torch.Tensor, penalty: float,
                    sums: torch.Tensor | None = None) -> Released:
    """Algorithm 1's step without the first-order approximation: eq. (12) with Gamma = D - |N_i| rho, in the
    consensus form of eq. (6), x_i^{k+1} = argmin_x f_i(x) - lambda_i^T x + (D/2) ||x - v_i||^2, with
    v_i = x_i^k + w ⊙ (x^_i^k - x_i^k) (Term A). Its optimality condition grad f_i(x) + D (x - v_i) = lambda_i
    is :func:`admm_step`'s with grad f_i taken at the new point; solved by Newton's method (the objective
    is strongly convex, curvature >= 1 + D). The paper's Example (d) runs it without noise; the mean of
    its release is a nonlinear function of Term A, so the interval is the point itself."""
    centre = term_a(x, neighbour_mean(x, adjacency, sums), weights)
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    point = newton(lambda y: gradient(features, labels, y) + penalty * (y - centre) - dual,
                   lambda y: hessian(features, labels, y) + penalty * eye,
                   centre + (dual - gradient(features, labels, centre)) / penalty)  # from the linearised step
    return Released(x=point, lo=point, hi=point)


def admm_dual(dual: torch.Tensor, x: torch.Tensor, adjacency: torch.Tensor, zeta: float,
              printed: bool = False, sums: torch.Tensor | None = None) -> torch.Tensor:
    """lambda_i^{k+1} = lambda_i^k + zeta sum_{j in N_i} (x_j^{k+1} - x_i^{k+1}), the sign that converges.

    004's Algorithm 1 prints a minus (``printed=True``), with which the iteration diverges for every zeta
    (a regression test shows both). The plus is the general form's
    lambda <- lambda - zeta (sum_i A_i x_i - c) for the edge constraints. ``sums`` as in :func:`admm_step`."""
    sums = neighbour_sums(x, adjacency) if sums is None else sums
    disagreement = sums - adjacency.to(x.dtype).sum(dim=-1, keepdim=True) * x
    return dual - zeta * disagreement if printed else dual + zeta * disagreement


def divergent_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(i_k, i^_k) of Algorithm 2 per run: the agents whose iterates are farthest apart in l1, [S] each
    (the first such pair in row order on ties, so the choice is deterministic)."""
    distances = torch.cdist(x, x, p=1)  # [S, N, N]
    flat = distances.flatten(start_dim=1).argmax(dim=1)
    n = x.shape[1]
    return flat // n, flat % n


def dgd_step(x: torch.Tensor, grad_at_mean: torch.Tensor, weights: torch.Tensor, step: float) -> Released:
    """Algorithm 2's update (eq. (7), complete graph), before the noise:
    x_i^{k+1} = x-bar + ((2w - 1)/N) ⊙ (x_a - x_b) - eta_{k+1} grad f_i(x-bar), with (a, b) the most
    divergent pair and the gradient at the global average x-bar (``grad_at_mean`` [S, N, d]). Term A is
    uniform on x-bar +- |x_a - x_b| / N; its expectation is x-bar. alpha_k = eta_k."""
    n = x.shape[1]
    first, second = divergent_pair(x)
    runs = torch.arange(x.shape[0], device=x.device)
    spread = (x[runs, first] - x[runs, second]).unsqueeze(1)  # [S, 1, d]
    mean = x.mean(dim=1, keepdim=True)
    offset = -step * grad_at_mean
    half = spread.abs() / n
    return Released(x=mean + (2 * weights - 1) / n * spread + offset, lo=mean - half + offset,
                    hi=mean + half + offset)


def midrange_step(x: torch.Tensor, grad: torch.Tensor, closed: torch.Tensor, weights: torch.Tensor,
                  step: float) -> Released:
    """Algorithm 2*'s update (eq. (28), any graph), before the noise: in every coordinate,
    x_i^{k+1} = w min_{j in N_i + i} x_j + (1 - w) max_{j in N_i + i} x_j - eta_{k+1} grad f_i(x_i^k).
    Term A is uniform on [min, max] of the closed neighbourhood (``closed`` [(S,) N, N] bool); it is the
    mid-range in expectation, not the mean (Appendix E): biased when the f_i differ."""
    big = torch.finfo(x.dtype).max
    inside = closed.unsqueeze(-1)  # [(S,) N, N, 1]
    values = x.unsqueeze(1)  # [S, 1, N, d]: agent j's iterate, seen from every i
    low = torch.where(inside, values, big).amin(dim=2)
    high = torch.where(inside, values, -big).amax(dim=2)
    offset = -step * grad
    return Released(x=weights * low + (1 - weights) * high + offset, lo=low + offset, hi=high + offset)


def metropolis(adjacency: torch.Tensor) -> torch.Tensor:
    """Metropolis-Hastings weights W [(S,) N, N]: w_ij = 1 / (1 + max(|N_i|, |N_j|)) on an edge, the rest of
    the row on the diagonal. Symmetric and doubly stochastic, so plain DGD keeps the agents' average: the
    mixing of the noisy DGD baseline ([45], whose own weights 004 does not give)."""
    a = adjacency.to(torch.float64)
    degree = a.sum(dim=-1)
    w = a / (1 + torch.maximum(degree.unsqueeze(-2), degree.unsqueeze(-1)))
    return w + torch.diag_embed(1 - w.sum(dim=-1))


def mixing_step(x: torch.Tensor, grad: torch.Tensor, mixing: torch.Tensor, step: float) -> Released:
    """Noisy decentralised gradient descent (eq. (3), the baseline [45]) before the noise:
    x_i^{k+1} = sum_j w_ij x_j^k - eta_{k+1} grad f_i(x_i^k). Nothing is random in it: the interval is
    one point, and every release costs the worst case."""
    point = mixing.to(x.dtype) @ x - step * grad
    return Released(x=point, lo=point, hi=point)
