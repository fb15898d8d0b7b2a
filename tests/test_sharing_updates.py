"""dpadmm.sharing.updates: 001's equations against numerical minimisers and their invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from dpadmm.data.vertical import pad_blocks
from dpadmm.sharing import updates

F64 = torch.float64


def _blocks(seed: int = 0, n: int = 40, widths: tuple[int, ...] = (3, 5)) -> tuple[torch.Tensor, list]:
    gen = torch.Generator().manual_seed(seed)
    raw = [torch.randn(n, w, generator=gen, dtype=F64) for w in widths]
    raw = [b / torch.linalg.vector_norm(b, dim=1, keepdim=True) for b in raw]
    return pad_blocks(raw)[0], raw


@pytest.mark.parametrize("bound", [1e6, 0.5])
def test_the_x_step_is_the_minimiser_of_eq_6_on_the_ball(bound: float) -> None:
    blocks, raw = _blocks()
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(1, 2, 40, generator=gen, dtype=F64) * 3
    y = torch.randn(1, 40, generator=gen, dtype=F64) * 0.1
    rho, l2 = 0.7, 0.05
    x = updates.x_step(updates.geometry(blocks), target, y, rho, l2, bound)
    for m, d in enumerate(raw):
        dm, r, yy = d.numpy(), target[0, m].numpy(), y[0].numpy()

        def eq_6(v: np.ndarray, dm: np.ndarray = dm, r: np.ndarray = r, yy: np.ndarray = yy) -> float:
            return float(l2 * v @ v / 2 + yy @ (dm @ v) + rho / 2 * np.sum((dm @ v - r) ** 2))

        if bound > 1e3:  # the ball is inactive: the paper's own solver, L-BFGS-B
            best = minimize(eq_6, np.zeros(d.shape[1]), method="L-BFGS-B",
                            options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000})
        else:  # on the ball, a solver that takes the constraint
            ball = [{"type": "ineq", "fun": lambda v: bound**2 - v @ v}]
            best = minimize(eq_6, np.zeros(d.shape[1]), method="SLSQP", constraints=ball,
                            options={"ftol": 1e-15, "maxiter": 1000})
        ours = x[0, m, :d.shape[1]].numpy()
        assert eq_6(ours) <= best.fun + 1e-10
        np.testing.assert_allclose(ours, best.x, atol=1e-6)
        assert np.linalg.norm(ours) <= bound * (1 + 1e-9)
        assert not x[0, m, d.shape[1]:].abs().any()  # padded coordinates stay 0
    if bound < 1:
        assert torch.linalg.vector_norm(x, dim=-1).max() == pytest.approx(bound, rel=1e-9)


def test_the_z_step_solves_eq_7_and_the_dual_step_gives_lemma_2() -> None:
    gen = torch.Generator().manual_seed(2)
    n, rho = 50, 0.01
    s, y = torch.randn(1, n, generator=gen, dtype=F64), torch.randn(1, n, generator=gen, dtype=F64) / n
    labels = torch.where(torch.rand(n, generator=gen) > 0.5, 1.0, -1.0).to(F64)
    z = updates.z_step(s, y, labels, rho)
    lab, ss, yy = labels.numpy(), s[0].numpy(), y[0].numpy()
    for i in range(n):  # each entry is the scalar minimiser
        def eq_7(v: np.ndarray, i: int = i) -> float:
            return float(np.logaddexp(0, -lab[i] * v[0]) / n - yy[i] * v[0] + rho / 2 * (ss[i] - v[0]) ** 2)

        best = minimize(eq_7, np.zeros(1), method="BFGS", options={"gtol": 1e-14})
        assert float(z[0, i]) == pytest.approx(best.x[0], abs=1e-6)
    y_next = updates.dual_step(y, s, z, rho)
    torch.testing.assert_close(updates.loss_gradient(z, labels), y_next, rtol=0, atol=1e-15)


def test_the_subtraction_trick_equals_the_direct_sum() -> None:
    gen = torch.Generator().manual_seed(3)
    messages = torch.randn(2, 3, 30, generator=gen, dtype=F64)
    z = torch.randn(2, 30, generator=gen, dtype=F64)
    pulled = messages.sum(dim=1) - z
    ours = updates.party_target(pulled, messages)
    for m in range(3):
        others = sum(messages[:, k] for k in range(3) if k != m)
        torch.testing.assert_close(ours[:, m], z - others, rtol=0, atol=1e-13)


def test_the_papers_noise_has_the_covariance_of_eq_16() -> None:
    blocks, raw = _blocks(n=30, widths=(4, 2))
    geo = updates.geometry(blocks)
    ridge = torch.tensor([1e-3, 1e-3], dtype=F64)
    gen = torch.Generator().manual_seed(4)
    standard = torch.randn(40000, 2, 4, generator=gen, dtype=F64)
    xi = updates.paper_noise(geo, standard, 0.5, ridge)
    for m, d in enumerate(raw):
        w = d.shape[1]
        expected = 0.25 * torch.linalg.inv(d.T @ d + 1e-3 * torch.eye(w, dtype=F64))
        empirical = torch.cov(xi[:, m, :w].T)
        scale = float(expected.diagonal().max())
        torch.testing.assert_close(empirical, expected, rtol=0.05, atol=0.05 * scale)
        messages = xi[:, m, :w] @ d.T  # D_m xi: trace of its covariance is about sigma^2 d_m
        assert float(torch.cov(messages.T).trace()) == pytest.approx(0.25 * w, rel=0.05)


def test_the_papers_noise_on_a_rank_deficient_block_lies_in_its_row_space() -> None:
    """A repeated column (as a9a's one-hot groups give) leaves a null direction: it gets no noise, and on the
    row space the covariance is sigma^2 times the pseudo-inverse of D^T D + tau I there."""
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(30, 3, generator=gen, dtype=F64)
    d = torch.cat([base, base[:, :1]], dim=1)  # column 4 repeats column 1: rank 3 of 4
    blocks = d.unsqueeze(0)
    geo = updates.geometry(blocks)
    tau = 1e-3
    xi = updates.paper_noise(geo, torch.randn(40000, 1, 4, generator=gen, dtype=F64), 0.5,
                             torch.tensor([tau], dtype=F64))[:, 0]
    null = torch.tensor([1.0, 0.0, 0.0, -1.0], dtype=F64) / 2**0.5  # D null = 0
    assert float((xi @ null).abs().max()) < 1e-10
    values, vectors = torch.linalg.eigh(d.T @ d)
    kept = values > tau
    expected = 0.25 * vectors[:, kept] @ torch.diag(1 / (values[kept] + tau)) @ vectors[:, kept].T
    empirical = torch.cov(xi.T)
    torch.testing.assert_close(empirical, expected, rtol=0, atol=0.05 * float(expected.diagonal().max()))


def test_a_score_of_0_is_an_undecided_error() -> None:
    """error counts a score of exactly 0 as wrong for either class; undecided says what share that is."""
    scores = torch.tensor([[0.0, 2.0, -1.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    assert updates.error(scores, labels).tolist() == [0.75, 0.25]
    assert updates.undecided(scores).tolist() == [0.5, 0.0]
