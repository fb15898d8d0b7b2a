"""The batched engine of paper 004's algorithms: runs (seeds) and agents as batch dimensions.

Iteration k = 1..K for S runs of N agents: every agent draws its aggregation weights (keyed stream
(seed, agent, k, :data:`~dpadmm.privacy.noise.STREAM_AGGREGATOR`)), computes its update from what its
neighbours exchanged at k - 1 (:mod:`dpadmm.decentral.updates`), adds Laplace noise of rate beta_k
(stream :data:`~dpadmm.privacy.noise.STREAM_EXCHANGE`) and exchanges the result; Algorithm 1's agents
then update their duals. Every run starts from x^0 ~ N(0, I) per agent (stream
:data:`~dpadmm.privacy.noise.STREAM_START`, the same for every algorithm of a seed: NOTES-004, G16).
A run is a function of its configuration and seed.

Metrics per evaluated iteration (``metrics.jsonl``): ``round``; ``log-error``, the mean over agents of
ln(||x_i^k - x*|| / d) (the paper's "accuracy logarithm", natural log, NOTES-004 G13) and
``log-error-max`` (the worst agent); ``consensus`` (the largest ||x_i - x_j|| over edges); for a
private run ``epsilon`` (the a-priori loss of every agent so far, sum of d alpha_k beta_k B, the
guarantee); ``seconds`` and ``elapsed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpadmm.data import Dataset
from dpadmm.decentral import problem as problems
from dpadmm.decentral import updates
from dpadmm.decentral.config import DecentralConfig
from dpadmm.privacy import noise
from dpadmm.runs.loop import seed_writers, timed_rounds

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def dataset_of(config: DecentralConfig) -> Dataset:
    """The configured data set."""
    from dpadmm.data.adult import load_adult

    return load_adult(config.data_dir)


@dataclass
class State:
    """The exchanged iterates x [S, N, d] and Algorithm 1's duals (zeros for the others)."""

    x: torch.Tensor
    dual: torch.Tensor


def _keyed(draw: Callable[[int, torch.Tensor], torch.Tensor], seeds: Sequence[int], agents: int,
           like: torch.Tensor) -> torch.Tensor:
    """[S, N, d] from a keyed draw per seed of every agent's row."""
    ids = torch.arange(agents, device=like.device)
    return torch.stack([draw(s, ids) for s in seeds]).to(dtype=like.dtype)


def initial_state(agents: problems.Agents, seeds: Sequence[int]) -> State:
    """x^0 ~ N(0, I) per agent (keyed; it depends on no data, so anyone can draw it), duals 0."""
    _, n, _, d = agents.features.shape
    ones = torch.ones(n, dtype=torch.float64, device=agents.features.device)
    x = _keyed(lambda s, ids: noise.gaussian(s, ids, 0, 0, (d,), ones, stream=noise.STREAM_START), seeds, n,
               agents.features)
    return State(x=x, dual=torch.zeros_like(x))


def aggregator_weights(config: DecentralConfig, seeds: Sequence[int], k: int, like: torch.Tensor
                       ) -> torch.Tensor:
    """w of iteration k, [S, N, d]: U(0, 1) per agent and coordinate (keyed), or 1/2 for fixed weights."""
    if config.weights == "fixed":
        return torch.full_like(like, 0.5)
    _, agents, d = like.shape
    return _keyed(lambda s, ids: noise.uniform(s, ids, k, 0, noise.STREAM_AGGREGATOR, d), seeds, agents, like)


def exchange_noise(config: DecentralConfig, seeds: Sequence[int], k: int, like: torch.Tensor
                   ) -> torch.Tensor:
    """Delta^k [S, N, d]: Laplace of rate beta_k (scale 1/beta_k) per coordinate, keyed; 0 without noise."""
    if not config.private:
        return torch.zeros_like(like)
    _, agents, d = like.shape
    scale = torch.full((agents,), 1 / config.rate(k), dtype=torch.float64, device=like.device)
    return _keyed(lambda s, ids: noise.laplace(s, ids, k, 0, (d,), scale, stream=noise.STREAM_EXCHANGE),
                  seeds, agents, like)


def update(config: DecentralConfig, agents: problems.Agents, state: State, weights: torch.Tensor,
           k: int) -> updates.Released:
    """The configured algorithm's k-th update of every agent, before the noise."""
    x, features, labels = state.x, agents.features, agents.labels
    step = config.step_decay**k
    if config.algorithm == "ldp-admm":
        grad = updates.gradient(features, labels, x)
        return updates.admm_step(x, state.dual, grad, agents.adjacency, weights, config.penalty)
    if config.algorithm == "ldp-dgd":
        mean = x.mean(dim=1, keepdim=True).expand_as(x)
        return updates.dgd_step(x, updates.gradient(features, labels, mean), weights, step)
    grad = updates.gradient(features, labels, x)
    if config.algorithm == "ldp-dgd-star":
        return updates.midrange_step(x, grad, agents.closed, weights, step)
    return updates.mixing_step(x, grad, updates.metropolis(agents.adjacency), step)


def release(config: DecentralConfig, agents: problems.Agents, state: State, seeds: Sequence[int], k: int
            ) -> tuple[torch.Tensor, updates.Released]:
    """The iterates x^k every agent exchanges in iteration k (its weights, its update, its noise), from
    x^{k-1} and the duals of k - 1; and the update before the noise (its interval is the ex-post
    accountant's)."""
    weights = aggregator_weights(config, seeds, k, state.x)
    released = update(config, agents, state, weights, k)
    return released.x + exchange_noise(config, seeds, k, state.x), released


def dual(config: DecentralConfig, agents: problems.Agents, previous: torch.Tensor, x: torch.Tensor
         ) -> torch.Tensor:
    """Algorithm 1's duals after the exchange of x (unchanged for the other algorithms)."""
    if config.algorithm != "ldp-admm":
        return previous
    return updates.admm_dual(previous, x, agents.adjacency, config.zeta)


def iterate(config: DecentralConfig, agents: problems.Agents, state: State, seeds: Sequence[int], k: int
            ) -> tuple[State, updates.Released]:
    """Iteration k: every agent's release and, once all are exchanged, Algorithm 1's dual update."""
    x, released = release(config, agents, state, seeds, k)
    return State(x=x, dual=dual(config, agents, state.dual, x)), released


def worst_case(config: DecentralConfig, k: int, d: int) -> float:
    """The a-priori loss of one agent over iterations 1..k: sum of d alpha_j beta_j B (Theorem 2.2's bound,
    the pure-LDP guarantee against every other agent)."""
    return sum(d * config.alpha(j) * config.rate(j) * config.bound for j in range(1, k + 1))


def statement(config: DecentralConfig, d: int) -> str:
    """The run's privacy in words, with what it covers (the closing line of a run)."""
    if not config.private:
        return "privacy: none (non-private run, no noise)"
    total = worst_case(config, config.rounds, d)
    covered = "" if config.covered else (
        f" NOT COVERED: B_inf = {config.bound:g} is below 2/b_i = {2 / config.samples:g}, the bound that "
        "holds, so the true loss can be up to that ratio larger (the paper's setting).")
    return (f"privacy (004, {config.algorithm}): each agent's {config.rounds} exchanged iterates are "
            f"{total:.6g}-LDP, pure, a priori (the sum over k of d alpha_k beta_k B; Laplace of rate "
            f"beta_k = {config.noise_growth:g}^k per coordinate, B_inf = {config.bound:g}), "
            "against all other agents colluding, who see every exchanged iterate; neighbouring: one of the "
            "agent's samples replaced. Trusted: nobody. Not covered: what the final model reveals beyond the "
            "transcript, and the ex-post loss, which depends on the agent's data." + covered)


def evaluate(config: DecentralConfig, problem: problems.Problem, state: State, k: int
             ) -> list[dict[str, float]]:
    """The metrics of every run after iteration k."""
    d = state.x.shape[-1]
    distance = torch.linalg.vector_norm(state.x - problem.optimum.unsqueeze(1), dim=-1)  # [S, N]
    log_error = torch.log(distance / d)
    gaps = torch.cdist(state.x, state.x)  # [S, N, N]
    consensus = torch.where(problem.agents.adjacency, gaps, torch.zeros_like(gaps)).flatten(1).amax(dim=1)
    records = []
    for s in range(state.x.shape[0]):
        record = {"round": k, "log-error": float(log_error[s].mean()),
                  "log-error-max": float(log_error[s].max()), "consensus": float(consensus[s])}
        if config.private:
            record["epsilon"] = worst_case(config, k, d)
        records.append(record)
    return records


@dataclass(frozen=True)
class Result:
    """The evaluated iterations of each run, the final state, where each run was written and the problem."""

    records: list[list[dict[str, Any]]]
    state: State
    directories: list[Path | None]
    problem: problems.Problem


def run(config: DecentralConfig, seeds: Sequence[int] | None = None, *, dataset: Dataset | None = None,
        write: bool = True, directories: Sequence[str | Path] | None = None, progress: bool = True) -> Result:
    """Run ``config`` for each of ``seeds`` (default: its own seed) as one batch; write each run's folder."""
    seeds = [config.seed] if seeds is None else list(seeds)
    dataset = dataset_of(config) if dataset is None else dataset
    problem = problems.build(config, dataset, seeds, DTYPES[config.dtype], config.device)
    writers = seed_writers(config, seeds, None, directories) if write else []
    state = initial_state(problem.agents, seeds)

    def step(k: int) -> None:
        nonlocal state
        state, _ = iterate(config, problem.agents, state, seeds, k)

    records = timed_rounds(config.rounds, step, lambda k: evaluate(config, problem, state, k),
                           eval_every=config.eval_every, writers=writers, runs=len(seeds), progress=progress,
                           unit="iteration", cuda=problem.optimum.is_cuda)
    folders: list[Path | None] = [w.directory for w in writers] or [None] * len(seeds)
    return Result(records=records, state=state, directories=folders, problem=problem)

