"""The baselines of 001's experiments, on the same vertical split and the same objective as ADMM sharing.

- :func:`centralised`: scikit-learn's ``LogisticRegression(C = 1 / (N l2), fit_intercept=False)`` on the
  features of the given parties, pooled in one place (001's "all features" and "party 1 alone"
  references of Fig. 3). Its objective is N times ours (:mod:`dpadmm.sharing.config`), so its
  minimiser is the minimiser of F restricted to those parties' columns.
- :func:`vertical_sgd`: the SGD-trained vertical model that 001 compares with (Hu et al. 2019, FDML):
  each party computes a local score of a sample from its own features, the scores are summed and
  the logistic loss of the sum is minimised by mini-batch SGD from a random start. With linear
  local models (the only ones that fit the same objective) a step needs, per mini-batch, each
  party's scores of its samples up and the loss gradient per sample down; here the parties are a
  batch dimension, so all learning rates and seeds run together. The paper gives neither its
  learning rate nor its batch size; the caller chooses and says so.

Both use the parties' blocks as the engine does (rows of unit norm within each block).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dpadmm.sharing import updates
from dpadmm.sharing.engine import Problem

INIT_STD = 0.01  # the random start of vertical SGD: x_m ~ N(0, INIT_STD^2 I)


def _pooled(blocks: torch.Tensor, mask: torch.Tensor, parties: Sequence[int]) -> torch.Tensor:
    """The real columns of the given parties' padded blocks [M, n, d], side by side: [n, sum of widths]."""
    return torch.cat([blocks[m][:, mask[m]] for m in parties], dim=1)


def centralised(problem: Problem, l2: float, parties: Sequence[int] | None = None) -> dict[str, float]:
    """scikit-learn's minimiser of F on the features of ``parties`` (default: all) pooled: its training
    objective F (with the regulariser), test log loss, test error, and the largest norm of one party's
    block of it (ADMM sharing keeps every x_m in the ball of radius ``x-bound``: where this exceeds it,
    the ball binds and ADMM's problem has a higher minimum)."""
    from sklearn.linear_model import LogisticRegression

    held = problem.parties
    parties = list(range(held.blocks.shape[0])) if parties is None else list(parties)
    x, x_test = _pooled(held.blocks, held.mask, parties), _pooled(held.test_blocks, held.mask, parties)
    labels, test_labels = problem.labels, problem.test_labels
    fit = LogisticRegression(C=1 / (len(labels) * l2), fit_intercept=False, tol=1e-10, max_iter=10_000)
    w = torch.from_numpy(fit.fit(x.cpu().numpy(), labels.cpu().numpy()).coef_[0]).to(x)
    scores, test_scores = (x @ w).unsqueeze(0), (x_test @ w).unsqueeze(0)
    widths = [int(held.mask[m].sum()) for m in parties]
    return {"train-objective": float(updates.objective(scores, labels, w.view(1, 1, -1), l2)[0]),
            "test-log-loss": float(updates.loss(test_scores, test_labels)[0]),
            "test-error": float(updates.error(test_scores, test_labels)[0]),
            "largest-block-norm": max(float(torch.linalg.vector_norm(b)) for b in torch.split(w, widths))}


def vertical_sgd(problem: Problem, l2: float, rates: Sequence[float], seeds: Sequence[int], epochs: int,
                 batch: int) -> list[list[dict[str, float]]]:
    """Mini-batch SGD on F for every (rate, seed) pair at once: after each epoch (one pass over a keyed
    shuffle of the samples in batches of ``batch``) the training objective, test log loss and error of
    each run. Returns the records of the runs in the order of ``rates`` x ``seeds`` (rate-major)."""
    if not rates or min(rates) <= 0 or epochs < 1 or batch < 1:
        raise ValueError(f"rates={list(rates)!r}, epochs={epochs} and batch={batch} are not allowed; give "
                         "rates > 0, epochs >= 1 and batch >= 1")
    held = problem.parties
    blocks, labels = held.blocks, problem.labels
    m, n, d = blocks.shape
    runs = [(rate, seed) for rate in rates for seed in seeds]
    lr = torch.tensor([rate for rate, _ in runs], dtype=blocks.dtype, device=blocks.device).view(-1, 1, 1)
    start = [torch.randn((m, d), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
             for _, seed in runs]
    x = INIT_STD * torch.stack(start).to(blocks) * held.mask  # [R, M, d], zero on padded columns
    orders = [torch.Generator().manual_seed(seed) for _, seed in runs]
    records: list[list[dict[str, float]]] = [[] for _ in runs]
    for epoch in range(1, epochs + 1):
        order = torch.stack([torch.randperm(n, generator=g) for g in orders]).to(blocks.device)  # [R, n]
        for begin in range(0, n, batch):
            rows = order[:, begin:begin + batch]  # [R, B]
            picked = blocks[:, rows].permute(1, 0, 2, 3)  # [R, M, B, d]: each party's rows of the batch
            scores = torch.einsum("rmbd,rmd->rb", picked, x)  # the summed local scores
            y = labels[rows]
            per_sample = -y * torch.sigmoid(-y * scores) / rows.shape[1]  # d loss / d score, sent down
            x = x - lr * (torch.einsum("rmbd,rb->rmd", picked, per_sample) + l2 * x)
        train = updates.scores(blocks, x).sum(dim=1)
        test = updates.scores(held.test_blocks, x).sum(dim=1)
        objective = updates.objective(train, labels, x, l2)
        test_loss = updates.loss(test, problem.test_labels)
        error = updates.error(test, problem.test_labels)
        for i in range(len(runs)):
            records[i].append({"epoch": epoch, "train-objective": float(objective[i]),
                               "test-log-loss": float(test_loss[i]), "test-error": float(error[i])})
    return records
