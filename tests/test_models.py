"""The logistic-regression model: gradient against autograd, sensitivity, padding, metrics."""

from __future__ import annotations

import pytest
import torch

from dpadmm.models.logistic import AgentData, error_rate, gradient, probabilities, sensitivity, training_loss


def _agents(seed: int = 0, counts=(7, 4, 9), j: int = 6, k: int = 4, total: int = 40) -> AgentData:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.rand(c, j, generator=gen, dtype=torch.float64) for c in counts]
    ys = [torch.randint(0, k, (c,), generator=gen) for c in counts]
    return AgentData.from_blocks(xs, ys, num_classes=k, total=total, agents=range(len(counts)))


def _f_p(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, total: int, beta: float, p: int) -> torch.Tensor:
    """f_p(z) of eq. (2c)/(63) written directly: -(1/I) sum_i ln h_{y_i}(z) + (beta/P) ||z||^2."""
    logp = torch.log_softmax(x @ z, dim=1)
    return -logp[torch.arange(len(y)), y].sum() / total + beta / p * (z * z).sum()


def test_gradient_equals_autograd_of_f_p() -> None:
    data = _agents()
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    beta, num_agents = 0.3, 3
    ours = gradient(data, z, scale=1.0 / data.total, reg=beta / num_agents)
    for p in range(3):
        n = int(data.counts[p])
        x, y = data.x[p, :n], data.y[p, :n].argmax(dim=1)
        zp = z[p].clone().requires_grad_(True)
        _f_p(x, y, zp, data.total, beta, num_agents).backward()
        torch.testing.assert_close(ours[p], zp.grad, rtol=1e-12, atol=1e-12)


def test_outp_local_mean_gradient_equals_autograd() -> None:
    data = _agents(seed=2)
    z = torch.randn(3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    beta = 0.1
    ours = gradient(data, z, scale=1.0 / data.counts, reg=beta)
    for p in range(3):
        n = int(data.counts[p])
        x, y = data.x[p, :n], data.y[p, :n].argmax(dim=1)
        zp = z[p].clone().requires_grad_(True)
        # local mean loss + beta ||z||^2
        _f_p(x, y, zp, n, beta, 1).backward()
        torch.testing.assert_close(ours[p], zp.grad, rtol=1e-12, atol=1e-12)


def test_padding_rows_change_nothing() -> None:
    data = _agents(counts=(3, 8))
    z = torch.randn(2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    alone = AgentData.from_blocks([data.x[0, :3]], [data.y[0, :3].argmax(1)], num_classes=4,
                                  total=data.total, agents=[0])
    g_batched = gradient(data, z, scale=1 / data.total, reg=0.0)[0]
    g_alone = gradient(alone, z[:1], scale=1 / data.total, reg=0.0)[0]
    torch.testing.assert_close(g_batched, g_alone, rtol=1e-13, atol=1e-15)
    s_batched = sensitivity(data, probabilities(data.x, z))[0]
    s_alone = sensitivity(alone, probabilities(alone.x, z[:1]))[0]
    assert float(s_batched) == pytest.approx(float(s_alone), rel=1e-13)


def test_sensitivity_is_the_largest_per_sample_term() -> None:
    data = _agents(seed=5)
    z = torch.randn(3, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    probs = probabilities(data.x, z)
    ours = sensitivity(data, probs)
    for p in range(3):
        n = int(data.counts[p])
        terms = [
            float((torch.outer(data.x[p, i], probs[p, i] - data.y[p, i])).abs().sum()) / data.total
            for i in range(n)
        ]
        # ||x_i (h_i - y_i)^T||_1 = ||x_i||_1 ||h_i - y_i||_1: eq. (9b) as the paper evaluates it
        assert float(ours[p]) == pytest.approx(max(terms), rel=1e-12)


def test_training_loss_and_error_rate() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.rand(50, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (50,), generator=gen)
    w = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    expected = float(_f_p(x, y, w, 50, 0.2, 1))
    assert training_loss(x, y, w, 0.2) == pytest.approx(expected, rel=1e-12)
    assert error_rate(x, y, w) == pytest.approx(float(((x @ w).argmax(1) != y).sum()) / 50)
    # the differentiable form (a solver's objective) has the same value, and its autograd gradient is the
    # family's eq. (2c) gradient of one agent holding every sample
    w_grad = w.clone().requires_grad_(True)
    loss = training_loss(x, y, w_grad, 0.2, differentiable=True)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    one = AgentData.from_blocks([x], [y], num_classes=4, total=50, agents=[0])
    torch.testing.assert_close(w_grad.grad, gradient(one, w[None], scale=1 / 50, reg=0.2)[0],
                               rtol=1e-12, atol=1e-12)


def test_from_blocks_rejects_bad_input() -> None:
    x = torch.rand(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="total=2"):
        AgentData.from_blocks([x], [torch.zeros(3, dtype=torch.long)], num_classes=2, total=2, agents=[0])
    with pytest.raises(ValueError, match="at least one sample"):
        AgentData.from_blocks([x[:0]], [torch.zeros(0, dtype=torch.long)], num_classes=2, total=5, agents=[0])
