"""dpadmm.models.binary: the batched logistic loss, accuracy and clipped gradient sums against autograd."""

from __future__ import annotations

import pytest
import torch

from dpadmm.models import binary

F64 = torch.float64


def _data(n: int = 30, d: int = 4, runs: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    features = torch.randn(n, d, generator=gen, dtype=F64)
    features[3] = 0.0  # a zero row: gradient 0, clipping factor 1
    labels = torch.where(torch.rand(n, generator=gen) > 0.4, 1.0, -1.0).to(F64)
    return features, labels, 2 * torch.randn(runs, d, generator=gen, dtype=F64)


def test_loss_and_accuracy_are_their_definitions() -> None:
    features, labels, x = _data()
    for s in range(x.shape[0]):
        scores = features @ x[s]
        expected = torch.log1p(torch.exp(-labels * scores)).mean()
        assert float(binary.loss(features, labels, x)[s]) == pytest.approx(float(expected), rel=1e-12)
        assert float(binary.accuracy(features, labels, x)[s]) == float(((scores * labels) > 0).to(F64).mean())


@pytest.mark.parametrize("clip", [None, 0.5, 100.0])
def test_the_clipped_gradient_sum_is_the_sum_of_clipped_autograd_gradients(clip: float | None) -> None:
    features, labels, x = _data()
    expected = torch.zeros_like(x)
    for s in range(x.shape[0]):
        for i in range(features.shape[0]):
            point = x[s].clone().requires_grad_(True)
            (g,) = torch.autograd.grad(torch.log1p(torch.exp(-labels[i] * features[i] @ point)), point)
            if clip is not None and g.norm() > clip:
                g = g * (clip / g.norm())
            expected[s] += g
    torch.testing.assert_close(binary.clipped_gradient_sum(features, labels, x, clip), expected)
    if clip == 0.5:  # each term has norm <= C, so one sample moves the sum by at most C
        alone = binary.clipped_gradient_sum(features[:1], labels[:1], x, clip)
        assert float(torch.linalg.vector_norm(alone, dim=1).max()) <= 0.5 + 1e-12


def test_kept_row_norms_and_the_column_major_layout_change_no_value() -> None:
    features, labels, x = _data()
    column = binary.column_major(features)
    assert torch.equal(column, features) and column.stride() == (1, features.shape[0])
    norms = torch.linalg.vector_norm(features, dim=1)
    torch.testing.assert_close(binary.clipped_gradient_sum(column, labels, x, 0.5, norms),
                               binary.clipped_gradient_sum(features, labels, x, 0.5), rtol=1e-12, atol=1e-12)


def test_the_majority_share_is_the_accuracy_of_always_predicting_the_larger_class() -> None:
    """The floor an accuracy must beat: ijcnn1's test set is 90.5% negative, so a model that learned nothing
    scores about 0.905 there (the logs print the share beside the accuracy)."""
    labels = torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=F64)
    assert binary.majority_share(labels) == 0.75 == binary.majority_share(-labels)
    x = torch.tensor([[-1e-3]], dtype=F64)  # a model that always says -1
    assert float(binary.accuracy(torch.ones(4, 1, dtype=F64), labels, x)[0]) == binary.majority_share(labels)
    assert binary.majority_share(torch.tensor([1.0, -1.0], dtype=F64)) == 0.5
