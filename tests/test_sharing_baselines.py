"""dpadmm.sharing.baselines: scikit-learn's optimum of the family's objective and vertical SGD, on a9a."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpadmm.data import Dataset
from dpadmm.data.libsvm import load_binary
from dpadmm.sharing import baselines, engine, updates

L2 = 1e-3


@pytest.fixture(scope="module")
def problem(binary_dir: Path) -> engine.Problem:
    """The first 3,000 training and 1,000 test rows of a9a, split 66 | 57 as in 001."""
    full = load_binary("a9a", binary_dir / "a9a")
    small = Dataset(name="a9a", x_train=full.x_train[:3000], y_train=full.y_train[:3000],
                    x_test=full.x_test[:1000], y_test=full.y_test[:1000], num_classes=2)
    return engine.build(small, (66, 57))


def test_scikit_learn_reports_the_objective_of_its_own_minimiser(problem: engine.Problem) -> None:
    fit = baselines.centralised(problem, L2)
    alone = baselines.centralised(problem, L2, [0])
    # party 1's columns are a restriction of all columns: its optimum cannot be lower
    assert fit["train-objective"] < alone["train-objective"]
    assert 0 < fit["test-error"] < 0.5 and fit["test-log-loss"] < alone["test-log-loss"] + 0.05
    # a block's norm is at most the whole solution's, which l2 ||w||^2 / 2 <= F bounds
    assert alone["largest-block-norm"] > 0
    assert fit["largest-block-norm"] <= (fit["train-objective"] * 2 / L2) ** 0.5


def test_vertical_sgd_is_sgd_on_the_pooled_features_and_reaches_the_optimum(problem: engine.Problem) -> None:
    optimum = baselines.centralised(problem, L2)["train-objective"]
    runs = baselines.vertical_sgd(problem, L2, [0.3, 1.0], [0, 1], epochs=60, batch=50)
    assert [len(r) for r in runs] == [60] * 4
    assert [r["epoch"] for r in runs[0]] == list(range(1, 61))
    for records in runs:
        assert records[-1]["train-objective"] == pytest.approx(optimum, rel=2e-3)
        assert records[-1]["train-objective"] >= optimum - 1e-9  # the optimum is a lower bound
    assert runs[0] != runs[1]  # the seeds differ: start and shuffle
    again = baselines.vertical_sgd(problem, L2, [0.3], [1], epochs=60, batch=50)
    for alone, batched in zip(again[0], runs[1], strict=True):  # a run is a function of its rate and seed
        assert alone == pytest.approx(batched, rel=1e-12)


def test_one_epoch_of_vertical_sgd_is_one_epoch_of_pooled_sgd(problem: engine.Problem) -> None:
    """Summing the parties' scores and sending the per-sample gradient back is SGD on the pooled features."""
    record = baselines.vertical_sgd(problem, L2, [0.5], [3], epochs=1, batch=64)[0][0]
    held = problem.parties
    pooled = torch.cat([held.blocks[m][:, held.mask[m]] for m in range(2)], dim=1)
    start = torch.randn((2, held.blocks.shape[2]), generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64)
    w = baselines.INIT_STD * torch.cat([start[m][held.mask[m]] for m in range(2)])
    order = torch.randperm(problem.num_samples, generator=torch.Generator().manual_seed(3))
    for begin in range(0, problem.num_samples, 64):
        rows = order[begin:begin + 64]
        x, y = pooled[rows], problem.labels[rows]
        gradient = x.T @ (-y * torch.sigmoid(-y * (x @ w)) / len(rows)) + L2 * w
        w = w - 0.5 * gradient
    objective = updates.objective((pooled @ w).unsqueeze(0), problem.labels, w.view(1, 1, -1), L2)
    assert record["train-objective"] == pytest.approx(float(objective[0]), rel=1e-12)


def test_bad_settings_are_named(problem: engine.Problem) -> None:
    with pytest.raises(ValueError, match="rates=\\[0.0\\].*not allowed"):
        baselines.vertical_sgd(problem, L2, [0.0], [0], epochs=1, batch=10)
