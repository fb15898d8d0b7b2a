"""Binary logistic regression on batched runs: the loss, accuracy and per-sample clipped gradients.

Both products with the data, ``x @ features.T`` and ``c @ features``, run fastest here with the
features stored column-major (``features.T.contiguous().T``): about three times faster for one
run on a9a (docs/benchmarks.md); :func:`column_major` gives that layout, the values unchanged.

f(x) = (1/n) sum_i log(1 + exp(-m_i l_i^T x)) with labels m_i in {-1, +1} (eq. (11) of 002's
loss term). Runs are batched: x is [S, d] (S parameter vectors, e.g. one per seed) against
one data matrix features [n, d], so every product is one matrix multiplication.

The per-sample gradient is g_i = -m_i s_i l_i with s_i = sigmoid(-m_i l_i^T x) in (0, 1), so
its norm factorises, ||g_i|| = s_i ||l_i||, and clipping it to norm C is a per-sample factor:
the clipped sum is features^T (coefficients) without any per-sample vector. With rows of
unit norm, ||g_i|| < 1 and clipping at C = 1 changes nothing, which is the gradient bound
c = 1 that 002's Theorem 1 assumes; clipping makes it hold for any data.
"""

from __future__ import annotations

import torch


def margins(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """m_i l_i^T x for every sample and run: [S, n] (labels +-1 [n], x [S, d])."""
    return (x @ features.T) * labels


def loss(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """f(x) = mean_i log(1 + exp(-m_i l_i^T x)) per run: [S]."""
    return torch.nn.functional.softplus(-margins(features, labels, x)).mean(dim=1)


def accuracy(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Fraction of samples with sign(l_i^T x) = m_i per run (a score of exactly 0 counts as wrong): [S]."""
    return (margins(features, labels, x) > 0).to(x.dtype).mean(dim=1)


def majority_share(labels: torch.Tensor) -> float:
    """The share of the larger class among labels +-1 [n]: the accuracy of always predicting that class.

    An accuracy means little without it: 90.5% of ijcnn1's test rows are negative, so a model that has
    learned nothing (x = 0 with a tie broken to -1, or one barely moved) scores 0.905 there. The logs print
    it beside the test accuracy."""
    positive = float((labels > 0).to(torch.float64).mean())
    return max(positive, 1.0 - positive)


def clipped_gradient_sum(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor,
                         clip: float | None, row_norms: torch.Tensor | None = None) -> torch.Tensor:
    """sum_i min(1, C / ||g_i||) g_i per run, [S, d]; ``clip=None`` sums the plain g_i.

    Divide by the sample count for the mean gradient of f; a client of a federation returns
    this sum and its count, so that the server's mean is over all samples. ``row_norms``
    (||l_i||, [n]) saves a pass over the data when the caller keeps them.
    """
    coefficients = -labels * torch.sigmoid(-margins(features, labels, x))  # g_i = coefficient_i l_i
    if clip is not None:
        if row_norms is None:
            row_norms = torch.linalg.vector_norm(features, dim=1)
        norms = coefficients.abs() * row_norms
        # total: a term of non-finite norm (a server's extreme x) counts 0, whatever the rows hold
        coefficients = torch.where(torch.isfinite(norms), coefficients * (clip / norms).clamp(max=1.0), 0.0)
    return coefficients @ features


def column_major(features: torch.Tensor) -> torch.Tensor:
    """The same [n, d] matrix stored column by column (what the BLAS products here read fastest)."""
    return features.T.contiguous().T
