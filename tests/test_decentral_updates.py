"""dpadmm.decentral.updates: 004's updates against their own statements (Term A's ranges, Algorithm 2's
identity, the fixed-parameter form) and the dual sign that converges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpadmm.decentral import graphs, updates

F64 = torch.float64


def _iterates(seed: int = 0, runs: int = 2, agents: int = 6, d: int = 5) -> torch.Tensor:
    return torch.randn(runs, agents, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_the_gradient_is_the_losss() -> None:
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(3, 7, 4, generator=gen, dtype=F64)
    labels = torch.where(torch.rand(3, 7, generator=gen) < 0.5, -1.0, 1.0).to(F64)
    x = torch.randn(2, 3, 4, generator=gen, dtype=F64, requires_grad=True)
    updates.loss(features, labels, x).sum().backward()
    torch.testing.assert_close(updates.gradient(features, labels, x.detach()), x.grad, rtol=0, atol=1e-14)


def test_the_hessian_is_autograds() -> None:
    gen = torch.Generator().manual_seed(2)
    features = torch.randn(2, 3, 7, 4, generator=gen, dtype=F64)
    labels = torch.where(torch.rand(2, 3, 7, generator=gen) < 0.5, -1.0, 1.0).to(F64)
    x = torch.randn(2, 3, 4, generator=gen, dtype=F64)
    full = torch.autograd.functional.hessian(lambda y: updates.loss(features, labels, y).sum(), x)
    blocks = torch.stack([torch.stack([full[s, i, :, s, i, :] for i in range(3)]) for s in range(2)])
    torch.testing.assert_close(updates.hessian(features, labels, x), blocks, rtol=0, atol=1e-14)


def test_the_exact_step_is_the_argmin_of_eq_12() -> None:
    """eq. (12) in the consensus form: x_i^{k+1} minimises f_i(x) - lambda_i^T x + (D/2)||x - v_i||^2 with
    v_i Term A; against L-BFGS-B on that objective, agent by agent. At the same point the linearised step
    differs (it uses grad f_i at x_i^k)."""
    from scipy.optimize import minimize

    gen = torch.Generator().manual_seed(5)
    graph = graphs.random_connected(5, 6, seed=1)
    features = torch.nn.functional.normalize(torch.rand(2, 5, 9, 4, generator=gen, dtype=F64), dim=-1)
    labels = torch.where(torch.rand(2, 5, 9, generator=gen) < 0.5, -1.0, 1.0).to(F64)
    x, dual = _iterates(10, agents=5, d=4), _iterates(11, agents=5, d=4)
    w = torch.rand(x.shape, generator=gen, dtype=F64)
    out = updates.admm_exact_step(x, dual, features, labels, graph.adjacency, w, 10.0)
    centre = x + w * (updates.neighbour_mean(x, graph.adjacency) - x)
    for s in range(2):
        for i in range(5):
            def objective(v: np.ndarray, s: int = s, i: int = i) -> float:
                y = torch.from_numpy(v).view(1, 1, -1)
                loss = updates.loss(features[s, i:i + 1].unsqueeze(0), labels[s, i:i + 1].unsqueeze(0), y)
                flat = y.flatten()
                return float(loss - dual[s, i] @ flat + 5.0 * (flat - centre[s, i]).square().sum())
            found = minimize(objective, centre[s, i].numpy(), method="L-BFGS-B", tol=1e-14).x
            np.testing.assert_allclose(out.x[s, i].numpy(), found, atol=1e-6)
    linearised = updates.admm_step(x, dual, updates.gradient(features, labels, x), graph.adjacency, w, 10.0)
    assert float((linearised.x - out.x).abs().max()) > 1e-3
    assert torch.equal(out.lo, out.x) and torch.equal(out.hi, out.x)


def test_algorithm_1s_term_a_lies_between_the_iterate_and_the_neighbour_mean() -> None:
    graph = graphs.random_connected(6, 9, seed=2)
    x, dual, grad = _iterates(0), _iterates(1), _iterates(2)
    mean = updates.neighbour_mean(x, graph.adjacency)
    offset = (dual - grad) / 10.0
    drawn = torch.rand(x.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    for w in (torch.zeros_like(x), torch.ones_like(x), drawn):
        out = updates.admm_step(x, dual, grad, graph.adjacency, w, 10.0)
        term_a = out.x - offset
        assert bool((term_a >= torch.minimum(x, mean) - 1e-12).all())
        assert bool((term_a <= torch.maximum(x, mean) + 1e-12).all())
        assert bool((out.x >= out.lo - 1e-12).all() and (out.x <= out.hi + 1e-12).all())
    torch.testing.assert_close(updates.admm_step(x, dual, grad, graph.adjacency, torch.zeros_like(x), 10.0).x,
                               x + offset)


def test_half_weights_are_the_fixed_parameter_linearised_admm() -> None:
    """w = 1/2 is Gamma = D/2, rho = D / (2 |N_i|) in eq. (13):
    x = (Gamma x_i + rho sum_j x_j + lambda - grad) / D."""
    graph = graphs.random_connected(6, 8, seed=4)
    x, dual, grad = _iterates(5), _iterates(6), _iterates(7)
    d_pen = 10.0
    degree = graph.degrees.to(F64).view(1, -1, 1)
    neighbours_sum = torch.einsum("ij,sjd->sid", graph.adjacency.to(F64), x)
    expected = (0.5 * d_pen * x + 0.5 * d_pen / degree * neighbours_sum + dual - grad) / d_pen
    out = updates.admm_step(x, dual, grad, graph.adjacency, torch.full_like(x, 0.5), d_pen)
    torch.testing.assert_close(out.x, expected, rtol=0, atol=1e-14)


def test_algorithm_2s_term_a_is_the_mean_plus_a_share_of_the_divergent_pair() -> None:
    x = _iterates(8, agents=5)
    n = x.shape[1]
    w = torch.rand(x.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    zero = torch.zeros_like(x)
    out = updates.dgd_step(x, zero, w, step=0.3)
    first, second = updates.divergent_pair(x)
    for s in range(x.shape[0]):
        a, b = int(first[s]), int(second[s])
        distances = torch.cdist(x[s], x[s], p=1)
        assert distances[a, b] == distances.max()
        rest = sum(x[s, j] for j in range(n) if j not in (a, b))
        printed = 2 * w[s] / n * x[s, a] + 2 * (1 - w[s]) / n * x[s, b] + rest / n  # eq. (7) as printed
        torch.testing.assert_close(out.x[s], printed, rtol=0, atol=1e-14)
    torch.testing.assert_close(updates.dgd_step(x, zero, torch.full_like(x, 0.5), 0.3).x,
                               x.mean(dim=1, keepdim=True).expand_as(x))


def test_algorithm_2_star_stays_within_the_closed_neighbourhoods_range() -> None:
    graph = graphs.random_connected(6, 7, seed=10)
    x = _iterates(11)
    w = torch.rand(x.shape, generator=torch.Generator().manual_seed(12), dtype=F64)
    out = updates.midrange_step(x, torch.zeros_like(x), graph.closed(), w, step=0.1)
    for i in range(6):
        around = [i, *graph.neighbours(i)]
        low, high = x[:, around].amin(dim=1), x[:, around].amax(dim=1)
        torch.testing.assert_close(out.lo[:, i], low)
        torch.testing.assert_close(out.hi[:, i], high)
        assert bool(((out.x[:, i] >= low) & (out.x[:, i] <= high)).all())


def test_metropolis_weights_are_doubly_stochastic() -> None:
    w = updates.metropolis(graphs.random_connected(10, 20, seed=13).adjacency)
    torch.testing.assert_close(w, w.T)
    torch.testing.assert_close(w.sum(dim=1), torch.ones(10, dtype=F64))
    assert bool((w >= 0).all())


def _run_admm(graph: graphs.Graph, printed: bool, rounds: int) -> float:
    """Noise-free Algorithm 1 (D = 10, zeta = 0.5, w ~ U(0, 1)) on f_i(x) = ||x - c_i||^2 / 2: its consensus
    optimum is the mean of the c_i. Returns the largest distance of an agent from it."""
    gen = torch.Generator().manual_seed(14)
    centres = torch.randn(1, graph.agents, 3, generator=gen, dtype=F64)
    x, dual = torch.zeros_like(centres), torch.zeros_like(centres)
    for _ in range(rounds):
        w = torch.rand(x.shape, generator=gen, dtype=F64)
        x = updates.admm_step(x, dual, x - centres, graph.adjacency, w, 10.0).x
        dual = updates.admm_dual(dual, x, graph.adjacency, 0.5, printed=printed)
    return float((x - centres.mean(dim=1, keepdim=True)).abs().max())


@pytest.mark.parametrize("graph", [graphs.complete(10), graphs.random_connected(10, 20, seed=15)])
def test_algorithm_1_converges_linearly_with_the_corrected_dual_sign_and_diverges_as_printed(
        graph: graphs.Graph) -> None:
    """Algorithm 1's dual update as printed (a minus) diverges; the corrected sign converges linearly."""
    assert _run_admm(graph, printed=False, rounds=600) < 1e-10
    assert _run_admm(graph, printed=False, rounds=300) < 1e3 * _run_admm(graph, printed=False, rounds=600)
    assert _run_admm(graph, printed=True, rounds=300) > 1e3


def test_a_graph_per_run_equals_each_run_alone() -> None:
    """The paper draws a new graph per run: [S, N, N] adjacencies batch the runs without changing any."""
    graphs_ = [graphs.random_connected(6, 8, seed=s) for s in (16, 17)]
    stacked = torch.stack([g.adjacency for g in graphs_])
    x, dual, grad = _iterates(18), _iterates(19), _iterates(20)
    w = torch.rand(x.shape, generator=torch.Generator().manual_seed(21), dtype=F64)
    def four(x: torch.Tensor, dual: torch.Tensor, grad: torch.Tensor, adjacency: torch.Tensor,
             w: torch.Tensor) -> list[torch.Tensor]:
        closed = adjacency | torch.eye(6, dtype=torch.bool)
        return [updates.admm_step(x, dual, grad, adjacency, w, 10.0).x,
                updates.admm_dual(dual, x, adjacency, 0.5), updates.midrange_step(x, grad, closed, w, 0.1).x,
                updates.mixing_step(x, grad, updates.metropolis(adjacency), 0.1).x]

    together = four(x, dual, grad, stacked, w)
    for s, graph in enumerate(graphs_):
        one = slice(s, s + 1)
        alone = four(x[one], dual[one], grad[one], graph.adjacency, w[one])
        for batched, single in zip(together, alone, strict=True):
            torch.testing.assert_close(batched[one], single, rtol=0, atol=1e-14)
