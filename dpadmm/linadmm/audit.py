"""DP-ADMM's audit: an attack on the noisy gradient of one iteration (002 Algorithms 2 and 3, step 2).

Each iteration releases the mean of the per-sample gradients at the query point, clipped to L2 norm c, plus
N(0, sigma^2 I) with sigma from Theorem 1 (:mod:`dpadmm.linadmm.privacy`); the x-, y- and dual steps are
post-processing. The party that adds the noise is trusted (central DP: the data holder, on Flower the
server); the attacker is everyone who sees the iterates, and with them the released gradient (the x-step of
eq. (7) is invertible given the state). It knows the query point and every sample but one.

The release is computed by the engine's own functions, :func:`dpadmm.models.binary.clipped_gradient_sum`
(the clipping) and :func:`dpadmm.linadmm.engine.release` (the normaliser and the keyed noise), with each
trial another seed. The normaliser n is the public count of the sensitivity c/n: the same for both
neighbours (a Flower run refuses clients that hold another count, and the engine reads the published data
sets), so a neighbour with one row fewer is divided by the same n. The neighbours:

* ``add-remove``: a canary row whose gradient is clipped to c, added or removed, the others with zero
  features (no gradient); and the canary added to or removed from a crowd whose clipped gradients oppose it,
  where a normaliser that followed the realised count would move the crowd's mean too.
* ``replace-one``: the canary's label flipped (its clipped gradient turns around: 2c/n).

:func:`one_run` audits a whole run instead, from one run with canaries (Steinke, Nasr & Jagielski 2023): the
attacker sees every iterate, so every release.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dpadmm.linadmm import engine, privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import Problem, constraint_matrix
from dpadmm.models import binary
from dpadmm.privacy.audit import ALPHA, AuditResult, counted, one_run_result, release_audit, shown

Release = Callable[..., torch.Tensor]  # engine.release's signature: what the tests' broken variants replace
Clipped = Callable[..., torch.Tensor]  # binary.clipped_gradient_sum's
FEATURES = 2  # the canary's feature and one without signal
CANARIES = 2000  # candidate rows of the one-run audit, each in the data with probability 1/2
CHUNK = 1 << 16  # seeds per call of the release
SAMPLES = 100  # rows of each design, the canary included: the public count n
ITERATION = 1  # the iteration audited; every iteration is the same mechanism at another point

Design = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], str]


def neighbours(config: LinAdmmConfig) -> list[Design]:
    """(D, D', the pair in words): features [rows, FEATURES] and labels +-1. At the query point x = 0 a row l
    with label m has gradient -(m/2) l; a canary row of norm 4c is clipped to norm c."""
    canary = torch.zeros(SAMPLES, FEATURES, dtype=torch.float64)
    canary[0, 0] = 4.0 * config.grad_bound
    labels = torch.ones(SAMPLES, dtype=torch.float64)
    if config.neighbouring == "replace-one":
        flipped = labels.clone()
        flipped[0] = -1.0
        return [((canary, labels), (canary.clone(), flipped), "the canary's label flipped")]
    crowd, crowd_labels = canary.clone(), -labels
    crowd[:, 0], crowd_labels[0] = 4.0 * config.grad_bound, 1.0
    return [((canary, labels), (canary[1:].clone(), labels[1:].clone()),
             "the canary (clipped to c) added or removed"),
            ((crowd, crowd_labels), (crowd[1:].clone(), crowd_labels[1:].clone()),
             "the canary added to or removed from a crowd of opposed rows")]


def releases(config: LinAdmmConfig, features: torch.Tensor, labels: torch.Tensor, first_seed: int,
             trials: int, release: Release = engine.release, clipped: Clipped = binary.clipped_gradient_sum
             ) -> np.ndarray:
    """``trials`` noisy gradients of iteration 1 at x = 0 on the rows (features, labels), one per seed from
    ``first_seed``: [trials, FEATURES]."""
    sigma = privacy.noise_std(config, SAMPLES)
    point = torch.zeros(1, FEATURES, dtype=torch.float64)
    total = clipped(features, labels, point, config.grad_bound)  # [1, FEATURES]: no noise, no sampling
    out = np.empty((trials, FEATURES))
    for start in range(0, trials, CHUNK):
        count = min(CHUNK, trials - start)
        seeds = range(first_seed + start, first_seed + start + count)
        out[start:start + count] = release(total.expand(count, -1), SAMPLES, list(seeds), ITERATION,
                                           sigma).numpy()
    return out


def audit(config: LinAdmmConfig, trials: int = 200_000, alpha: float = ALPHA,
          release: Release = engine.release, clipped: Clipped = binary.clipped_gradient_sum) -> AuditResult:
    """Lower-bound the epsilon of one iteration's release of ``config`` (n = :data:`SAMPLES`) and set it
    beside the ledger's epsilon for one release (its ``per_step``, at the run's delta)."""
    began = time.perf_counter()
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with target-epsilon=inf adds no noise: there is no "
                         "privacy claim to audit")
    step = privacy.ledger(config, SAMPLES).per_step
    designs = neighbours(config)
    found = []
    for i, ((x, m), (x_prime, m_prime), words) in enumerate(designs):
        first = 2 * i * trials
        outputs = releases(config, x, m, first, trials, release, clipped)
        outputs_prime = releases(config, x_prime, m_prime, first + trials, trials, release, clipped)
        found.append((*release_audit(outputs, outputs_prime, "projection", step.delta, alpha / len(designs)),
                      words))
    bound, detail, words = max(found, key=lambda f: f[0])
    return AuditResult(kind=f"{config.algorithm} noisy gradient of one iteration (gaussian, central, "
                            f"{config.neighbouring})",
                       claim=step.epsilon_pld, delta=step.delta, bound=bound, trials=trials,
                       seconds=time.perf_counter() - began, alpha=alpha, attack=words, detail=detail)


def one_run(config: LinAdmmConfig, canaries: int = CANARIES, alpha: float = ALPHA, seed: int = 0
            ) -> AuditResult:
    """Lower-bound the epsilon of a whole run of ``config`` from one run (Steinke, Nasr & Jagielski 2023).

    The data are ``canaries`` rows, row j the feature e_j at magnitude 4c with label +1 (a Dirac canary: its
    clipped gradient, -c e_j while the model has not learnt it, lies in coordinate j alone) if canary j is in
    (probability 1/2, a keyed draw of ``seed``), else a row of zeros, which has no gradient: the public count
    n = ``canaries`` normalises both, so a row of zeros is the canary removed (add-remove) or replaced
    (replace-one). A = I (no graph: W is outside the guarantee). The run is the engine's own iteration
    (:func:`dpadmm.linadmm.engine.step`), T iterations from the engine's start; the attacker sees every
    iterate, so every noisy gradient, and scores canary j by minus the sum over the iterations of the
    released coordinate j. The claim is the ledger's whole-run epsilon at its delta.
    """
    began = time.perf_counter()
    run = privacy.ledger(config, canaries).whole_run  # refuses a configuration without noise
    included = torch.rand(canaries, generator=torch.Generator().manual_seed(seed)) < 0.5
    features = torch.diag(included.to(torch.float64) * 4.0 * config.grad_bound)
    problem = Problem(name="canaries", features=features, labels=torch.ones(canaries, dtype=torch.float64),
                      test_features=features[:1], test_labels=torch.ones(1, dtype=torch.float64),
                      edges=np.zeros((0, 2), dtype=np.int64), a=constraint_matrix(np.zeros((0, 2)), canaries),
                      graph_converged=True, row_norms=torch.linalg.vector_norm(features, dim=1))
    sigma, constants = privacy.noise_std(config, canaries), engine.settings(config, problem.a)
    state = engine.start(config, problem, 1)
    scores = torch.zeros(canaries, dtype=torch.float64)
    for t in shown(config.rounds, "iteration"):
        state, _, released = engine.step(config, problem, state, [seed], t, sigma, constants)
        scores -= released[0]
    length = counted(config.rounds, "iteration")
    return one_run_result(f"{config.algorithm} whole run ({length})", scores.numpy(), included.numpy(),
                          run.epsilon_pld, run.delta, began, alpha,
                          attack="Dirac canaries, each a row in the data with probability 1/2 (else a row of "
                                 "zeros); the score: minus the sum of the released gradient's coordinate j")


def audits(config: LinAdmmConfig, trials: int = 200_000, alpha: float = ALPHA) -> list[AuditResult]:
    """Every audited kind of release of ``config`` (``dpadmm audit``): the noisy gradient and the whole
    run."""
    return [audit(config, trials, alpha), one_run(config, alpha=alpha)]
