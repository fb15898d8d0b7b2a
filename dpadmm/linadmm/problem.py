"""Paper 002's problem: the graph-guided fused lasso with logistic loss (eq. (11)) on a binary data set.

min_x (1/n) sum_i log(1 + exp(-m_i l_i^T x)) + lambda ||A x||_1 with A = [W; I]. The paper takes
W as "the sparsity pattern of the graph obtained by sparse inverse covariance selection" and
says no more; the construction here, stated so that it can be checked and changed:

1. the training rows are scaled to unit L2 norm (:func:`dpadmm.data.libsvm.normalise_rows`),
   which the gradient bound c = 1 of Theorem 1 needs;
2. each feature with non-zero variance is standardised, and scikit-learn's ``GraphicalLasso``
   (coordinate descent, ``alpha = graph-alpha``) estimates the precision matrix;
3. every pair (i, j), i < j, with |Theta_ij| > 1e-8 is an edge, and W has one row e_i - e_j per
   edge (the fused-lasso incidence matrix: ||W x||_1 = sum over edges of |x_i - x_j|).

W is computed from the private training features and is not privatised: the guarantee covers
the optimisation given W, not W itself (the docs say so). Graphs are cached by a hash of the
features and alpha in ``$DPADMM_CACHE/graphs`` (else ``~/.cache/dpadmm/graphs``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from dpadmm.data import Dataset
from dpadmm.data.download import cache_dir
from dpadmm.data.libsvm import load_binary, normalise_rows
from dpadmm.files import write_atomic
from dpadmm.models import binary

log = logging.getLogger(__name__)

EDGE_THRESHOLD = 1e-8
GRAPH_MAX_ITER = 1000


@dataclass(frozen=True)
class Problem:
    """One data set of 002 with its graph: features [n, d] of unit-norm rows, labels +-1, and A = [W; I]."""

    name: str
    features: torch.Tensor
    labels: torch.Tensor
    test_features: torch.Tensor
    test_labels: torch.Tensor
    edges: np.ndarray  # [E, 2], i < j
    a: torch.Tensor  # [E + d, d]
    graph_converged: bool
    row_norms: torch.Tensor | None = None  # ||l_i|| of the training rows (1, or 0 for an empty row)

    @property
    def num_samples(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])


def sparse_graph(features: torch.Tensor, alpha: float, cache: bool = True) -> tuple[np.ndarray, bool]:
    """(edges [E, 2] with i < j, whether the graphical lasso converged) of the standardised features."""
    x = features.detach().cpu().numpy().astype(np.float64)
    digest = hashlib.sha256(np.ascontiguousarray(x).tobytes() + repr(alpha).encode()).hexdigest()[:20]
    path = cache_dir() / "graphs" / f"{digest}.json"
    if cache and path.exists():
        saved = json.loads(path.read_text())
        return np.asarray(saved["edges"], dtype=np.int64).reshape(-1, 2), bool(saved["converged"])
    from sklearn.covariance import GraphicalLasso
    from sklearn.exceptions import ConvergenceWarning

    spread = x.std(axis=0)
    keep = np.flatnonzero(spread > 0)
    standard = (x[:, keep] - x[:, keep].mean(axis=0)) / spread[keep]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model = GraphicalLasso(alpha=alpha, mode="cd", max_iter=GRAPH_MAX_ITER, assume_centered=True)
        try:
            model.fit(standard)
        except FloatingPointError as error:  # scikit-learn's: the covariance is ill-conditioned at alpha
            raise ValueError(f"graph-alpha={alpha!r} is not allowed for these data: the graphical lasso "
                             f"fails ({error}); give a larger graph-alpha (the default is 0.3)") from None
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    rows, cols = np.nonzero(np.abs(np.triu(model.precision_, 1)) > EDGE_THRESHOLD)
    edges = np.stack([keep[rows], keep[cols]], axis=1).astype(np.int64)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"alpha": alpha, "converged": converged, "edges": edges.tolist()}))
    return edges, converged


def constraint_matrix(edges: np.ndarray, num_features: int, dtype: torch.dtype = torch.float64,
                      device: str | torch.device = "cpu") -> torch.Tensor:
    """A = [W; I], W with one row e_i - e_j per edge (i, j): [E + d, d]."""
    w = torch.zeros((len(edges), num_features), dtype=dtype, device=device)
    if len(edges):
        index = torch.arange(len(edges), device=device)
        pairs = torch.as_tensor(edges, device=device)
        w[index, pairs[:, 0]] = 1.0
        w[index, pairs[:, 1]] = -1.0
    return torch.cat([w, torch.eye(num_features, dtype=dtype, device=device)])


def rows(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype = torch.float64,
         device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels) as the problem uses them: rows of unit norm stored column-major
    (:func:`dpadmm.models.binary.column_major`), labels 0/1 as -1/+1. The engine applies it to the
    whole training set, a Flower client to its own block: per row, so both give the same rows."""
    features = binary.column_major(normalise_rows(x).to(dtype=dtype, device=device))
    return features, (2 * y - 1).to(dtype=dtype, device=device)


def build(dataset: Dataset, graph_alpha: float, dtype: torch.dtype = torch.float64,
          device: str | torch.device = "cpu", cache: bool = True) -> Problem:
    """The problem of eq. (11) on ``dataset`` (labels 0/1 become +-1, rows unit norm, the graph's A)."""
    edges, converged = sparse_graph(normalise_rows(dataset.x_train), graph_alpha, cache)
    if not converged:
        log.warning("GraphicalLasso did not converge in %d iterations on %s (graph-alpha=%g); W is its "
                    "last estimate", GRAPH_MAX_ITER, dataset.name, graph_alpha)
    features, labels = rows(dataset.x_train, dataset.y_train, dtype, device)
    test_features, test_labels = rows(dataset.x_test, dataset.y_test, dtype, device)
    return Problem(
        name=dataset.name,
        features=features,
        labels=labels,
        test_features=test_features,
        test_labels=test_labels,
        edges=edges,
        a=constraint_matrix(edges, dataset.num_features, dtype, device),
        graph_converged=converged,
        row_norms=torch.linalg.vector_norm(features, dim=1),
    )


def smoothness(features: torch.Tensor) -> float:
    """L_f = ||F||_2^2 / (4 n), the Lipschitz constant of the gradient of the mean logistic loss (002
    Assumption 1; each sample's loss has curvature at most 1/4 along its row). Lemma 5 needs eta <= 1/L_f."""
    spectral = torch.linalg.matrix_norm(features.to(torch.float64), ord=2)
    return float(spectral**2 / (4 * features.shape[0]))


SMOOTHING = (1e-2, 1e-4, 1e-6, 1e-8, 1e-10)  # mu of the reference solver's continuation


def reference_optimum(problem: Problem, l1: float) -> tuple[float, np.ndarray]:
    """(F(x*), x*) of eq. (11) by an independent solver: L-BFGS on the smoothed objective
    f(x) + lambda sum_j sqrt((A x)_j^2 + mu^2), with mu = 1e-2 down to 1e-10, each solve started
    where the previous one stopped.

    The smoothed objective lies between F and F + lambda m mu, so its minimiser is within
    lambda m 1e-10 of eq. (11)'s minimum; the value returned is F itself at that point. It shares
    nothing with the ADMM updates (scipy's L-BFGS-B, float64 numpy), so an ADMM run that reaches it
    has found eq. (11)'s optimum, not its own fixed point. (SLSQP on the constrained form
    -s <= A x <= s gives the same value on small problems but takes minutes on a9a.)"""
    from scipy.optimize import minimize

    a = problem.a.detach().cpu().numpy().astype(np.float64)
    f = problem.features.detach().cpu().numpy().astype(np.float64)
    m = problem.labels.detach().cpu().numpy().astype(np.float64)
    n = len(m)

    def exact(x: np.ndarray) -> float:
        return float(np.logaddexp(0, -m * (f @ x)).mean() + l1 * np.abs(a @ x).sum())

    x = np.zeros(a.shape[1])
    for mu in SMOOTHING:
        def smoothed(x: np.ndarray, mu: float = mu) -> tuple[float, np.ndarray]:
            margin, v = -m * (f @ x), a @ x
            root = np.sqrt(v * v + mu * mu)
            weight = -m * np.exp(-np.logaddexp(0, -margin))  # -m_i sigmoid(margin_i)
            return (float(np.logaddexp(0, margin).mean() + l1 * root.sum()),
                    f.T @ weight / n + l1 * a.T @ (v / root))

        best = minimize(smoothed, x, jac=True, method="L-BFGS-B",
                        options={"maxiter": 20000, "maxcor": 50, "ftol": 1e-16, "gtol": 1e-13})
        x = best.x
    return exact(x), x


def load(name: str, data_dir: str, graph_alpha: float, dtype: torch.dtype = torch.float64,
         device: str | torch.device = "cpu") -> Problem:
    """:func:`build` on the data set ``name`` read from ``data_dir``."""
    return build(load_binary(name, data_dir), graph_alpha, dtype, device)
