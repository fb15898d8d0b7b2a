"""The batched engine of DP-ADMM / DP-AccADMM: seeds as a batch dimension, metrics a person can open.

One iteration of Algorithm 2 (or 3) for S runs at once is a few matrix products with the data
and with A; the Flower strategy calls :func:`iterate` with the gradient its clients summed, so
both paths run the same function. The noise of run s at iteration t is the keyed Gaussian stream
(seed_s, agent 0, t, :data:`~dpadmm.privacy.noise.STREAM_GRADIENT`): a run is a function of its
configuration and seed, on any device and in any batch.

That is the *simulation* kind of randomness (:mod:`dpadmm.privacy.randomness`): the engine, ``dpadmm
train``, and a Flower server on Flower's simulation engine. A deployed Flower server adds the noise from its
own secret instead (``randomness``, a :class:`~dpadmm.privacy.randomness.Secret` holding the server's key as
agent 0): the noisy mean gradient is the grid Gaussian release of the mean
(:meth:`~dpadmm.privacy.randomness.Secret.release`), which depends on the mean only through its rounding
to a grid 2**-GRID_BITS / sqrt(d) of sigma.

Metrics per evaluated iteration (``metrics.jsonl``): ``round``, ``objective`` (F(x_t) of eq.
(11)), ``objective-avg`` (F at the average x~ = (1/t) sum x_k, the iterate of Theorem 2),
``test-accuracy`` and ``test-accuracy-avg``, ``test-majority`` (the test set's majority-class share, the
accuracy of always predicting that class, which an accuracy must beat to show learning),
``primal-residual`` (||A x_t - y_t||), ``seconds`` (of
iteration t) and ``elapsed`` (of iterations 1..t, evaluations excluded: the clock of 002's Fig. 1).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpadmm.linadmm import privacy, updates
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import Problem, load
from dpadmm.models import binary
from dpadmm.privacy import noise
from dpadmm.privacy.ledger import Ledger
from dpadmm.privacy.randomness import SIMULATION, Secret, statement
from dpadmm.runs.loop import seed_writers, timed_rounds

DTYPES = {"float64": torch.float64, "float32": torch.float32}


# Goldstein et al.'s eta of Algorithm 8: the combined residual must fall by this factor, else restart.
RESTART_DECAY = 0.999


@dataclass
class State:
    """The iterates of S runs: x [S, d], u [S, m] and, for AccADMM, the extrapolated ones, theta_t [S] and
    the last combined residual [S] (for the restart)."""

    x: torch.Tensor
    u: torch.Tensor
    x_hat: torch.Tensor
    u_hat: torch.Tensor
    theta: torch.Tensor
    residual: torch.Tensor
    x_sum: torch.Tensor  # sum of x_1..x_t, for the averaged iterate


@dataclass(frozen=True)
class Settings:
    """The constants of an iteration, resolved from the configuration and the problem."""

    rho: float
    eta: float
    gamma: float
    l1: float
    accelerated: bool
    restart: bool


def settings(config: LinAdmmConfig, a: torch.Tensor) -> Settings:
    """gamma = 0 resolves to the theory's gamma_min for this A."""
    gamma = config.gamma or updates.gamma_min(a, config.eta, config.rho)
    return Settings(rho=config.rho, eta=config.eta, gamma=gamma, l1=config.l1, accelerated=config.accelerated,
                    restart=config.restart == "goldstein")


def initial_state(config: LinAdmmConfig, a: torch.Tensor, runs: int,
                  start_gradient: torch.Tensor | None = None) -> State:
    """x_0 = 0 (the paper leaves x_0 open); u_0 = 0, or with dual-init = paper -(1/rho) pinv(A^T) grad f(x_0),
    for which ``start_gradient`` is the exact mean gradient at x_0 = 0, [d]."""
    d, m = a.shape[1], a.shape[0]
    x = torch.zeros((runs, d), dtype=a.dtype, device=a.device)
    u = torch.zeros((runs, m), dtype=x.dtype, device=x.device)
    if config.dual_init == "paper":
        if start_gradient is None:
            raise ValueError("dual-init='paper' needs the exact gradient at x_0 (start_gradient)")
        u = updates.paper_dual_start(a, start_gradient.expand(runs, d), config.rho)
    ones = torch.ones(runs, dtype=x.dtype, device=x.device)
    return State(x=x, u=u, x_hat=x.clone(), u_hat=u.clone(), theta=ones, residual=ones * torch.inf,
                 x_sum=torch.zeros_like(x))


def gradient_noise(seeds: Sequence[int], t: int, num_features: int, std: float, like: torch.Tensor
                   ) -> torch.Tensor:
    """P_t ~ N(0, sigma^2 I_d) per run [S, d], from each seed's keyed stream (agent 0, iteration t)."""
    agent = torch.zeros(1, dtype=torch.int64, device=like.device)
    scale = torch.full((1,), std, dtype=torch.float64, device=like.device)
    return torch.cat([noise.gaussian(s, agent, t, 0, (num_features,), scale, dtype=like.dtype,
                                     stream=noise.STREAM_GRADIENT) for s in seeds])


SERVER_AGENT = 0  # the agent id of the one party that draws 002's noise (the server), in both kinds


def release(total: torch.Tensor, num_samples: int, seeds: Sequence[int], t: int, std: float,
            randomness: Secret | None = None) -> torch.Tensor:
    """The mechanism of iteration t: the mean of the clipped gradient sums plus P_t ~ N(0, sigma^2 I)
    (step 2 of Algorithms 2 and 3), [S, d] from sums [S, d] over all n samples; no noise when std = 0.

    ``randomness`` (deployment, one run): the mean released by the grid Gaussian mechanism of standard
    deviation sigma from the key of agent :data:`SERVER_AGENT` (stream STREAM_GRADIENT, iteration t), the
    same mechanism, sampled so that its output depends on the mean only through its rounding."""
    gradient = total / num_samples
    if std and randomness is not None:
        if len(seeds) != 1 or total.shape[0] != 1:
            raise ValueError(f"seeds={list(seeds)} is not allowed with deployment randomness: one run")
        agent = torch.tensor([SERVER_AGENT])
        scale = torch.tensor([std], dtype=torch.float64)
        noisy = randomness.release("gaussian", gradient, scale, agent, t, 0, noise.STREAM_GRADIENT)
        return noisy.to(gradient)
    if std:
        gradient = gradient + gradient_noise(seeds, t, total.shape[1], std, gradient)
    return gradient


def iterate(problem_a: torch.Tensor, state: State, noisy_gradient: torch.Tensor, constants: Settings,
            ) -> tuple[State, torch.Tensor]:
    """One iteration of Algorithm 2 (or 3) given the noisy mean gradient at the point it was asked for
    (:func:`query_point`); returns the new state and y_t."""
    a, c = problem_a, constants
    x_base, u_base = (state.x_hat, state.u_hat) if c.accelerated else (state.x, state.u)
    y = updates.y_step(a, x_base, u_base, c.l1, c.rho)
    x = updates.x_step(a, x_base, y, u_base, noisy_gradient, c.rho, c.eta, c.gamma)
    u = updates.dual_step(a, x, y, u_base)
    theta, x_hat, u_hat, residual = state.theta, x, u, state.residual
    if c.accelerated:
        theta = updates.next_theta(state.theta)
        x_hat = updates.extrapolate(x, state.x, state.theta, theta)
        u_hat = updates.extrapolate(u, state.u, state.theta, theta)
        if c.restart:  # where the combined residual did not fall enough: momentum off, from x_{t-1}, u_{t-1}
            residual = updates.combined_residual(a, x, x_base, u, u_base, c.rho)
            keep = residual < RESTART_DECAY * state.residual
            theta = torch.where(keep, theta, torch.ones_like(theta))
            x_hat = torch.where(keep.unsqueeze(-1), x_hat, state.x)
            u_hat = torch.where(keep.unsqueeze(-1), u_hat, state.u)
            residual = torch.where(keep, residual, state.residual / RESTART_DECAY)
    return State(x=x, u=u, x_hat=x_hat, u_hat=u_hat, theta=theta, residual=residual, x_sum=state.x_sum + x), y


def query_point(state: State, accelerated: bool) -> torch.Tensor:
    """Where iteration t takes its (one) gradient: x_{t-1}, or x-hat_{t-1} for AccADMM."""
    return state.x_hat if accelerated else state.x


def start(config: LinAdmmConfig, problem: Problem, runs: int) -> State:
    """:func:`initial_state` of ``runs`` runs on ``problem``; with dual-init = paper from the exact mean
    gradient at x_0 = 0."""
    gradient = None
    if config.dual_init == "paper":
        zero = torch.zeros((1, problem.num_features), dtype=problem.a.dtype, device=problem.a.device)
        gradient = binary.clipped_gradient_sum(problem.features, problem.labels, zero, None)[0] / (
            problem.num_samples)
    return initial_state(config, problem.a, runs, gradient)


def step(config: LinAdmmConfig, problem: Problem, state: State, seeds: Sequence[int], t: int, sigma: float,
         constants: Settings) -> tuple[State, torch.Tensor, torch.Tensor]:
    """Iteration t of every run on the engine's data: the clipped gradient sum at the query point, its noisy
    mean (the release, normalised by the public count n), the ADMM steps. Returns (state, y_t, release)."""
    point = query_point(state, constants.accelerated)
    total = binary.clipped_gradient_sum(problem.features, problem.labels, point, config.grad_bound,
                                        problem.row_norms)
    noisy = release(total, problem.num_samples, seeds, t, sigma)
    state, y = iterate(problem.a, state, noisy, constants)
    return state, y, noisy


@dataclass(frozen=True)
class Result:
    """The evaluated iterations of each run, where each was written, and the privacy ledger (None if
    non-private)."""

    records: list[list[dict[str, Any]]]
    state: State
    directories: list[Path | None]
    ledger: Ledger | None
    problem: Problem


def evaluate(problem: Problem, state: State, y: torch.Tensor, t: int, l1: float, train: bool = True
             ) -> list[dict[str, float]]:
    """The metrics of every run after iteration t. ``train=False`` leaves out the objectives, which read the
    raw training rows (a simulation's diagnostic; a deployed server reports none)."""
    a = problem.a
    average = state.x_sum / t
    runs = range(state.x.shape[0])
    records: list[dict[str, float]] = [{"round": t} for _ in runs]
    if train:
        objective = updates.objective(binary.loss(problem.features, problem.labels, state.x), a, state.x, l1)
        objective_avg = updates.objective(binary.loss(problem.features, problem.labels, average), a, average,
                                          l1)
        for s in runs:
            records[s].update({"objective": float(objective[s]), "objective-avg": float(objective_avg[s])})
    accuracy = binary.accuracy(problem.test_features, problem.test_labels, state.x)
    accuracy_avg = binary.accuracy(problem.test_features, problem.test_labels, average)
    residual = torch.linalg.vector_norm(state.x @ a.T - y, dim=1)
    majority = binary.majority_share(problem.test_labels)  # the accuracy of always predicting that class
    for s in runs:
        records[s].update({"test-accuracy": float(accuracy[s]), "test-accuracy-avg": float(accuracy_avg[s]),
                           "test-majority": majority, "primal-residual": float(residual[s])})
    return records


def run(config: LinAdmmConfig, seeds: Sequence[int] | None = None, *, problem: Problem | None = None,
        write: bool = True, directories: Sequence[str | Path] | None = None, progress: bool = True) -> Result:
    """Run ``config`` for each of ``seeds`` (default: its own seed) as one batch; write each run's folder
    (``directories``, else fresh ones named after the configuration)."""
    seeds = [config.seed] if seeds is None else list(seeds)
    if problem is None:
        problem = load(config.dataset, config.data_dir, config.graph_alpha, DTYPES[config.dtype],
                       config.device)
    n = problem.num_samples
    ledger = privacy.ledger(config, n) if config.private else None
    if ledger:  # the engine simulates: every draw is keyed by the seed
        ledger = dataclasses.replace(ledger, randomness=statement([SIMULATION]))
    sigma = privacy.noise_std(config, n)
    constants = settings(config, problem.a)
    spent = functools.partial(privacy.ledger, config, n)
    writers = seed_writers(config, seeds, ledger, directories, spent=spent) if write else []
    state = start(config, problem, len(seeds))
    y = torch.zeros(0)

    def one(t: int) -> None:
        nonlocal state, y
        state, y, _ = step(config, problem, state, seeds, t, sigma, constants)

    records = timed_rounds(config.rounds, one, lambda t: evaluate(problem, state, y, t, config.l1),
                           eval_every=config.eval_every, writers=writers, runs=len(seeds), progress=progress,
                           unit="iteration", cuda=problem.a.is_cuda)
    folders: list[Path | None] = [w.directory for w in writers] or [None] * len(seeds)
    return Result(records=records, state=state, directories=folders, ledger=ledger, problem=problem)


def summary(config: LinAdmmConfig, record: dict[str, Any]) -> str:
    """The line ``dpadmm train`` prints for the last evaluated iteration."""
    eps = f"eps={config.target_epsilon:g} for the run" if config.private else "non-private"
    return (f"{config.algorithm} ({eps}, {config.dataset}, T={config.rounds}): objective "
            f"{record['objective']:.6g} (averaged iterate {record['objective-avg']:.6g}), test accuracy "
            f"{record['test-accuracy']:.4f} ({majority_note(record)})")


def majority_note(record: dict[str, Any]) -> str:
    """What the test accuracy of ``record`` must beat: always predicting the test set's majority class."""
    return f"always predicting the majority class scores {record['test-majority']:.4f}"
