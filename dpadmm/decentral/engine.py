"""The batched engine of paper 004's algorithms: runs (seeds) and agents as batch dimensions.

Iteration k = 1..K for S runs of N agents: every agent draws its aggregation weights (keyed stream
(seed, agent, k, :data:`~dpadmm.privacy.noise.STREAM_AGGREGATOR`)), computes its update from what its
neighbours exchanged at k - 1 (:mod:`dpadmm.decentral.updates`), adds Laplace noise of rate beta_k
(stream :data:`~dpadmm.privacy.noise.STREAM_EXCHANGE`) and exchanges the result; Algorithm 1's agents
then update their duals. Every run starts from x^0 ~ N(0, I) per agent (stream
:data:`~dpadmm.privacy.noise.STREAM_START`, the same for every algorithm of a seed; the paper says only
"randomly").
A run is a function of its configuration and seed.

Metrics per evaluated iteration (``metrics.jsonl``): ``round``; ``log-error``, the mean over agents of
ln(||x_i^k - x*|| / d) (Fig. 2's "accuracy logarithm", whose base and agent the paper leaves open),
``log-error-max`` (the worst agent) and ``log-error-average`` (of the agents' average, the one model
a SecAgg+ server holds); ``consensus`` (the largest ||x_i - x_j|| over edges); for a
private run ``epsilon`` (the a-priori loss of every agent so far, sum of d alpha_k beta_k B, the
guarantee) and ``epsilon-ex-post`` / ``epsilon-ex-post-max`` (eq. (10)'s realised loss so far, the mean
over agents and the largest: a diagnostic that depends on the agents' data); ``seconds`` and
``elapsed``. With ``exchange=secret`` the agents learn only the sum of the iterates (Algorithm 3).

Two kinds of randomness (:mod:`dpadmm.privacy.randomness`). The engine itself, ``dpadmm train`` and a Flower
simulation draw the weights and the noise from the streams keyed by the run's seed, as above (the
*simulation* kind). A deployed agent draws them from its own secret (``randomness``, a
:class:`~dpadmm.privacy.randomness.Secret`): its weights by :meth:`~dpadmm.privacy.randomness.Secret.uniform`
and its exchanged iterate by the grid Laplace mechanism,
:meth:`~dpadmm.privacy.randomness.Secret.release`, so that what it sends depends on its update only through
the update's rounding to the grid. x^0 depends on no data and stays keyed by the seed in both kinds, as do
the shares of the engine's Algorithm 3 (on Flower, SecAgg+ draws its own masks). :func:`iterate` given a
``Secret`` with every agent's key recomputes a deployment.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpadmm.data import Dataset
from dpadmm.decentral import privacy, secret, updates
from dpadmm.decentral import problem as problems
from dpadmm.decentral.config import DecentralConfig
from dpadmm.privacy import noise
from dpadmm.privacy.randomness import SIMULATION, Secret
from dpadmm.privacy.randomness import statement as randomness_statement
from dpadmm.runs.loop import seed_writers, timed_rounds

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def load_dataset(name: str, data_dir: str) -> Dataset:
    """Data set ``name`` (a value of the ``dataset`` key) from ``data_dir``."""
    from dpadmm.data.adult import load_adult

    if name != "adult":
        raise ValueError(f"dataset={name!r} is not allowed; choose adult")
    return load_adult(data_dir)


def dataset_of(config: DecentralConfig) -> Dataset:
    """The configured data set."""
    return load_dataset(config.dataset, config.data_dir)


@dataclass
class State:
    """The exchanged iterates x [S, N, d], Algorithm 1's duals (zeros for the others) and, with secret
    sharing, the neighbour sums [S, N, d] of x as the agents learnt them (None: from x itself)."""

    x: torch.Tensor
    dual: torch.Tensor
    sums: torch.Tensor | None = None


SHARE_STREAM = 0x3C6EF372  # mixed into (seed, k): the shares of Algorithm 3, a stream of their own


def secret_sums(config: DecentralConfig, x: torch.Tensor, seeds: Sequence[int], k: int
                ) -> torch.Tensor | None:
    """With ``exchange=secret``: each agent's sum of the others' iterates of iteration k, learnt by
    Algorithm 3 (fixed-point additive shares of every x_j, the partial sums broadcast, the total
    reconstructed; the agent subtracts its own), [S, N, d]; None for the plain exchange."""
    if config.exchange != "secret":
        return None
    codec = secret.FixedPoint(agents=int(x.shape[1]))
    totals = [secret.secure_sum(x[i].detach().cpu().numpy(), codec,
                                np.random.Generator(np.random.PCG64([seed, k, SHARE_STREAM])))
              for i, seed in enumerate(seeds)]
    total = torch.from_numpy(np.stack(totals)).to(x).unsqueeze(1)  # [S, 1, d]
    return total - x


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


def start(config: DecentralConfig, agents: problems.Agents, seeds: Sequence[int]) -> State:
    """The first state of a run: x^0, zero duals, and with secret sharing the sums of x^0."""
    state = initial_state(agents, seeds)
    state.sums = secret_sums(config, state.x, seeds, 0)
    return state


PLACEHOLDER_WEIGHT = 0.5  # the weight of a row whose agent's key a Secret does not hold (never sent)


def held_agents(randomness: Secret, agents: int, seeds: Sequence[int]) -> list[int]:
    """The rows [0, N) whose agents' keys ``randomness`` holds: a node's own agent, or every agent when the
    engine recomputes a deployment. Deployment randomness runs one run (one seed)."""
    if len(seeds) != 1:
        raise ValueError(f"seeds={list(seeds)} is not allowed with deployment randomness: it runs one run")
    return sorted(a for a in randomness.keys if 0 <= a < agents)


def aggregator_weights(config: DecentralConfig, seeds: Sequence[int], k: int, like: torch.Tensor,
                       randomness: Secret | None = None) -> torch.Tensor:
    """w of iteration k, [S, N, d]: U(0, 1) per agent and coordinate, or 1/2 for fixed weights.

    The random weights are the paper's random penalties (004 Sec. 3, Algorithm 1 step 1: w = (N - 1)
    rho-bar / D): their privacy role is that Term A is uniform on an interval nobody else knows. In simulation
    (``randomness=None``) they come from the keyed stream (seed, agent, k, STREAM_AGGREGATOR); in deployment
    from the agents' own secrets, for the agents whose keys ``randomness`` holds. The other rows are
    placeholders (:data:`PLACEHOLDER_WEIGHT`): a Flower agent computes a view of all N agents, of which only
    its own row is real and sent, and it cannot (and must not) draw another agent's weights.
    """
    if config.weights == "fixed":
        return torch.full_like(like, 0.5)
    _, agents, d = like.shape
    if randomness is None:
        return _keyed(lambda s, ids: noise.uniform(s, ids, k, 0, noise.STREAM_AGGREGATOR, d), seeds, agents,
                      like)
    weights = torch.full_like(like, PLACEHOLDER_WEIGHT)
    held = held_agents(randomness, agents, seeds)
    if held:
        drawn = randomness.uniform(torch.tensor(held), k, 0, noise.STREAM_AGGREGATOR, d)
        weights[0, held] = drawn.to(dtype=like.dtype, device=like.device)
    return weights


def exchange_noise(config: DecentralConfig, seeds: Sequence[int], k: int, like: torch.Tensor
                   ) -> torch.Tensor:
    """Delta^k [S, N, d]: Laplace of rate beta_k (scale 1/beta_k) per coordinate, keyed; 0 without noise."""
    if not config.private:
        return torch.zeros_like(like)
    _, agents, d = like.shape
    return _keyed(lambda s, ids: noise.laplace(s, ids, k, 0, (d,), exchange_scale(config, k, agents, like),
                                               stream=noise.STREAM_EXCHANGE), seeds, agents, like)


def exchange_scale(config: DecentralConfig, k: int, agents: int, like: torch.Tensor) -> torch.Tensor:
    """The Laplace scale 1/beta_k of iteration k for each of ``agents`` agents, [N] float64."""
    d = like.shape[-1]
    return torch.full((agents,), 1 / privacy.rate(config, d, k), dtype=torch.float64,
                      device=like.device)


def exchanged(config: DecentralConfig, value: torch.Tensor, seeds: Sequence[int], k: int, like: torch.Tensor,
              randomness: Secret | None = None) -> torch.Tensor:
    """x^k as the agents exchange it, from their updates ``value`` [S, N, d] (Theorem 2.2's mechanism).

    Simulation: value + Delta^k (:func:`exchange_noise`). Deployment: each held agent's row released by the
    grid Laplace mechanism of scale 1/beta_k (:meth:`~dpadmm.privacy.randomness.Secret.release`, stream
    STREAM_EXCHANGE), which depends on the row only through its rounding to a grid 2**-GRID_BITS / d of the
    scale and costs at most 2**-GRID_BITS more epsilon per release (:func:`dpadmm.decentral.privacy.statement`
    counts it); the other rows are left without noise, placeholders never sent (:func:`aggregator_weights`).
    No noise without privacy, in either kind.
    """
    if randomness is None:
        return value + exchange_noise(config, seeds, k, like)
    held = held_agents(randomness, int(value.shape[1]), seeds)
    if not config.private or not held:
        return value
    out = value.clone()
    scale = exchange_scale(config, k, int(value.shape[1]), like)[held]
    out[0, held] = randomness.release("laplace", value[0, held], scale, torch.tensor(held), k, 0,
                                      noise.STREAM_EXCHANGE).to(value)
    return out


def update(config: DecentralConfig, agents: problems.Agents, state: State, weights: torch.Tensor,
           k: int) -> updates.Released:
    """The configured algorithm's k-th update of every agent, before the noise."""
    x, features, labels = state.x, agents.features, agents.labels
    step = config.alpha(k)  # eta_k for the gradient methods (Algorithm 1 uses 1/D through penalty)
    if config.algorithm == "ldp-admm" and config.x_step == "exact":
        return updates.admm_exact_step(x, state.dual, features, labels, agents.adjacency, weights,
                                       config.penalty, state.sums)
    if config.algorithm == "ldp-admm":
        grad = updates.gradient(features, labels, x)
        return updates.admm_step(x, state.dual, grad, agents.adjacency, weights, config.penalty, state.sums)
    if config.algorithm == "ldp-dgd":
        mean = x.mean(dim=1, keepdim=True).expand_as(x)
        return updates.dgd_step(x, updates.gradient(features, labels, mean), weights, step)
    grad = updates.gradient(features, labels, x)
    if config.algorithm == "ldp-dgd-star":
        return updates.midrange_step(x, grad, agents.closed, weights, step)
    return updates.mixing_step(x, grad, updates.metropolis(agents.adjacency), step)


def release(config: DecentralConfig, agents: problems.Agents, state: State, seeds: Sequence[int], k: int,
            randomness: Secret | None = None) -> tuple[torch.Tensor, updates.Released]:
    """The iterates x^k every agent exchanges in iteration k (its weights, its update, its noise), from
    x^{k-1} and the duals of k - 1; and the update before the noise (its interval is the ex-post
    accountant's). ``randomness``: the deployment kind's draws (:func:`aggregator_weights`,
    :func:`exchanged`); None, the simulation kind's."""
    weights = aggregator_weights(config, seeds, k, state.x, randomness)
    released = update(config, agents, state, weights, k)
    return exchanged(config, released.x, seeds, k, state.x, randomness), released


def dual(config: DecentralConfig, agents: problems.Agents, previous: torch.Tensor, x: torch.Tensor,
         sums: torch.Tensor | None = None) -> torch.Tensor:
    """Algorithm 1's duals after the exchange of x (unchanged for the other algorithms)."""
    if config.algorithm != "ldp-admm":
        return previous
    return updates.admm_dual(previous, x, agents.adjacency, config.zeta, sums=sums)


def iterate(config: DecentralConfig, agents: problems.Agents, state: State, seeds: Sequence[int], k: int,
            randomness: Secret | None = None) -> tuple[State, updates.Released]:
    """Iteration k: every agent's release and, once all are exchanged, Algorithm 1's dual update.
    ``randomness`` with every agent's key (one run) recomputes a deployment's iteration from its nodes'
    keys."""
    x, released = release(config, agents, state, seeds, k, randomness)
    sums = secret_sums(config, x, seeds, k)
    return State(x=x, dual=dual(config, agents, state.dual, x, sums), sums=sums), released


def log_error(optimum: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """ln(||x - x*|| / d), the paper's accuracy logarithm, of iterates x [S, ..., d] against x* [S, d]."""
    reference = optimum.view(optimum.shape[0], *([1] * (x.dim() - 2)), optimum.shape[-1])
    return torch.log(torch.linalg.vector_norm(x - reference, dim=-1) / x.shape[-1])


def public_metrics(config: DecentralConfig, adjacency: torch.Tensor, x: torch.Tensor, k: int
                   ) -> list[dict[str, float]]:
    """What anyone who sees the exchanged iterates x [S, N, d] can report after iteration k, per run:
    ``consensus`` (the largest ||x_i - x_j|| over edges) and, for a private run, the a-priori ``epsilon``."""
    gaps = torch.cdist(x, x)  # [S, N, N]
    consensus = torch.where(adjacency, gaps, torch.zeros_like(gaps)).flatten(1).amax(dim=1)
    records = []
    for s in range(x.shape[0]):
        record = {"round": k, "consensus": float(consensus[s])}
        if config.private:
            record["epsilon"] = privacy.loss_through(config, int(x.shape[-1]), k)
        records.append(record)
    return records


def evaluate(config: DecentralConfig, problem: problems.Problem, state: State, k: int,
             ex_post: torch.Tensor | None = None) -> list[dict[str, float]]:
    """The metrics of every run after iteration k; ``ex_post`` [S, N] is each agent's ex-post loss so far."""
    errors = log_error(problem.optimum, state.x)  # [S, N]
    average = log_error(problem.optimum, state.x.mean(dim=1))  # [S]
    records = []
    for s, public in enumerate(public_metrics(config, problem.agents.adjacency, state.x, k)):
        record = {"round": k, "log-error": float(errors[s].mean()), "log-error-max": float(errors[s].max()),
                  "log-error-average": float(average[s]), **public}
        if ex_post is not None:
            record["epsilon-ex-post"] = float(ex_post[s].mean())
            record["epsilon-ex-post-max"] = float(ex_post[s].max())
        records.append(record)
    return records


def ex_post_step(config: DecentralConfig, x: torch.Tensor, released: updates.Released, k: int
                 ) -> torch.Tensor:
    """Each agent's ex-post loss of release k (eq. (10) summed over its coordinates), [S, N]: a diagnostic
    that depends on its private data (the interval comes from its gradient), never the guarantee."""
    shift = config.alpha(k) * config.bound
    # the interval is Term A's range when w ~ U(0, 1); with fixed weights the mean is one point
    lo, hi = (released.x, released.x) if config.weights == "fixed" else (released.lo, released.hi)
    return privacy.ex_post(x, lo, hi, shift, privacy.rate(config, x.shape[-1], k)).sum(dim=-1)


@dataclass(frozen=True)
class Result:
    """The evaluated iterations of each run, the final state, where each run was written, the a-priori
    statement (None if non-private) and the problem."""

    records: list[list[dict[str, Any]]]
    state: State
    directories: list[Path | None]
    ledger: privacy.Statement | None
    problem: problems.Problem


def run(config: DecentralConfig, seeds: Sequence[int] | None = None, *, dataset: Dataset | None = None,
        write: bool = True, directories: Sequence[str | Path] | None = None, progress: bool = True) -> Result:
    """Run ``config`` for each of ``seeds`` (default: its own seed) as one batch; write each run's folder.
    A private run also records each agent's ex-post loss (``epsilon-ex-post``: the mean over agents,
    ``-max`` the largest), which the agents could compute only from their own data."""
    seeds = [config.seed] if seeds is None else list(seeds)
    dataset = dataset_of(config) if dataset is None else dataset
    problem = problems.build(config, dataset, seeds, DTYPES[config.dtype], config.device)
    d = int(problem.optimum.shape[-1])
    statement = privacy.statement(config, d) if config.private else None
    if statement:  # the engine simulates: every draw is keyed by the seed
        statement = dataclasses.replace(statement, randomness=randomness_statement([SIMULATION]))
    writers = seed_writers(config, seeds, statement, directories,  # privacy.json
                           spent=functools.partial(privacy.spent, config, d)) if write else []
    state = start(config, problem.agents, seeds)
    spent = torch.zeros(state.x.shape[:2], dtype=torch.float64, device=state.x.device)

    def step(k: int) -> None:
        nonlocal state, spent
        state, released = iterate(config, problem.agents, state, seeds, k)
        if config.private:
            spent = spent + ex_post_step(config, state.x, released, k)

    records = timed_rounds(config.rounds, step,
                           lambda k: evaluate(config, problem, state, k, spent if config.private else None),
                           eval_every=config.eval_every, writers=writers, runs=len(seeds), progress=progress,
                           unit="iteration", cuda=problem.optimum.is_cuda)
    folders: list[Path | None] = [w.directory for w in writers] or [None] * len(seeds)
    return Result(records=records, state=state, directories=folders, ledger=statement, problem=problem)


def summary(config: DecentralConfig, record: dict[str, Any]) -> str:
    """The line ``dpadmm train`` prints for the last evaluated iteration."""
    noise = ("non-private" if not config.private else f"Laplace calibrated to eps = {config.target_epsilon:g}"
             if config.target_epsilon else f"Laplace, beta_k = {config.noise_growth:g}^k")
    line = (f"{config.algorithm} ({config.weights} weights, {noise}, N={config.agents}, {config.graph} "
            f"graph, K={config.rounds}): log-error {record['log-error']:.4f} (worst agent "
            f"{record['log-error-max']:.4f}), consensus {record['consensus']:.4g}")
    if "epsilon-ex-post" in record:
        line += (f"; ex-post loss {record['epsilon-ex-post']:.4g} of the a-priori {record['epsilon']:.4g} "
                 "(a diagnostic: it depends on the agents' data)")
    return line
