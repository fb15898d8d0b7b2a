"""Server-side updates: w minimises eq. (4a); the dual update; violation; digest."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from dpadmm.iadmm.consensus import (
    consensus_violation,
    dual_reference,
    dual_update,
    global_update,
    model_after_round,
)


def test_global_update_minimises_eq_4a() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(5, 3, 2, generator=gen, dtype=torch.float64)
    lam = torch.randn(5, 3, 2, generator=gen, dtype=torch.float64)
    rho = 0.7

    def objective(flat: np.ndarray) -> tuple[float, np.ndarray]:
        w = torch.tensor(flat.reshape(3, 2), requires_grad=True)
        value = sum((lam[p] * w).sum() + rho / 2 * ((w - z[p]) ** 2).sum() for p in range(5))
        value.backward()
        return float(value.detach()), w.grad.numpy().ravel()

    numeric = minimize(objective, np.zeros(6), jac=True, method="L-BFGS-B",
                       options={"gtol": 1e-12, "ftol": 1e-15}).x.reshape(3, 2)
    np.testing.assert_allclose(global_update(z, lam, rho).numpy(), numeric, atol=1e-7)


def test_dual_update_and_violation() -> None:
    lam = torch.ones(2, 2, 2, dtype=torch.float64)
    w = torch.full((2, 2), 3.0, dtype=torch.float64)
    z = torch.stack([torch.full((2, 2), 1.0), torch.full((2, 2), 2.0)]).double()
    new = dual_update(lam, w, z, 0.5)
    torch.testing.assert_close(new[0], torch.full((2, 2), 2.0, dtype=torch.float64))
    torch.testing.assert_close(new[1], torch.full((2, 2), 1.5, dtype=torch.float64))
    # sum_p |w - z_p|_1 / P = (4 * 2 + 4 * 1) / 2
    assert consensus_violation(w, z) == pytest.approx(6.0)


@pytest.mark.parametrize("rhos", [[0.37] * 6, [1e-4, 1e-4, 2e-4, 2e-4, 5e-3, 1e-3]])
def test_the_global_model_extrapolates_the_agents_average_whatever_rho(rhos: list[float]) -> None:
    """(4a) and (4c) in 003's order from the zero start: w^{t+1} = zbar^t + (rho^t / rho^{t+1})
    (zbar^t - zbar^{t-1}), so 2 zbar^t - zbar^{t-1} with a constant rho of any size (the identity
    benchmarks/compare_dp_terms.py measures the cost of under noise, and compare_dp's dpsgd-extra gives
    FedAvg)."""
    gen = torch.Generator().manual_seed(0)
    agents, shape = 5, (4, 3)
    lam = torch.zeros(agents, *shape, dtype=torch.float64)
    averages = [torch.zeros(shape, dtype=torch.float64)]  # zbar^0 = 0
    z = torch.zeros(agents, *shape, dtype=torch.float64)
    for t, rho in enumerate(rhos):
        w = global_update(z, lam, rho)
        if t:
            beta = rhos[t - 1] / rho
            torch.testing.assert_close(w, averages[-1] + beta * (averages[-1] - averages[-2]), rtol=1e-9,
                                       atol=1e-9)
        z = torch.randn(agents, *shape, generator=gen, dtype=torch.float64)  # any releases
        lam = dual_update(lam, w, z, rho)
        averages.append(z.mean(dim=0))


def test_the_mean_server_update_is_the_mean_release_whatever_the_duals() -> None:
    """server-update=mean: w^{t+1} = zbar^t, the duals and rho aside (FedAvg's server); the model after a
    round is the same mean; OutP's model stays its own w."""
    gen = torch.Generator().manual_seed(1)
    z, lam = (torch.randn(5, 4, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(global_update(z, lam, 0.37, "mean"), z.mean(dim=0), rtol=0, atol=0)
    assert not torch.allclose(global_update(z, lam, 0.37), z.mean(dim=0))
    modules = {"fc.weight": z, "fc.bias": lam}
    means = global_update(modules, {k: torch.zeros_like(v) for k, v in modules.items()}, 0.1, "mean")
    torch.testing.assert_close(means["fc.bias"], lam.mean(dim=0), rtol=0, atol=0)
    w = z[0].clone()
    torch.testing.assert_close(model_after_round("objpm", w, z, lam, 0.5, "mean"), z.mean(dim=0))
    assert model_after_round("outp", w, z, lam, 0.5, "mean") is w


def test_in_consensus_admms_order_the_duals_sum_to_zero_and_w_is_the_mean_release() -> None:
    """server-update=mean: duals updated against the mean of the releases they answer sum to zero over the
    agents, so eq. (4a) itself gives the mean release (no extrapolation), round after round; 003's order
    (against the w the round sent) leaves them a nonzero mean."""
    gen = torch.Generator().manual_seed(2)
    agents, shape, rho = 5, (4, 3), 0.37
    lam = torch.zeros(agents, *shape, dtype=torch.float64)
    z = torch.zeros(agents, *shape, dtype=torch.float64)
    for _ in range(4):
        w = global_update(z, lam, rho, "mean")
        torch.testing.assert_close(w, global_update(z, lam, rho), rtol=1e-12, atol=1e-12)  # (4a) agrees
        z = torch.randn(agents, *shape, generator=gen, dtype=torch.float64)
        lam = dual_update(lam, dual_reference("mean", w, z), z, rho)
        assert lam.sum(dim=0).abs().max() < 1e-12
    assert dual_reference("admm", w, z) is w
    papers_order = dual_update(torch.zeros_like(z), w, z, rho)
    assert papers_order.sum(dim=0).abs().max() > 0.1
