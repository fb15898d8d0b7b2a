"""The batched engine of ADMM sharing (001 Algorithm 1, eq. (16)): seeds and parties as batch dimensions.

A round for S runs and M parties: every party's x-step at once (Jacobi, eq. (6)), each party's
message D_m x_m with its noise, the server's z-step (eq. (7)) and dual step (eq. (8)). The Flower
strategy and client call the same functions. The noise of party m in round t of run s is the
keyed Gaussian stream (seed_s, agent m, round t, :data:`~dpadmm.privacy.noise.STREAM_MESSAGE`): a
run is a function of its configuration and seed.

Metrics per evaluated round (``metrics.jsonl``): ``round``, ``train-objective`` (F at the parties'
x, eq. (2)), ``test-log-loss``, ``test-error``, ``primal-residual`` (||sum_m D_m x~_m - z||, the
constraint of eq. (4) on what was sent), ``seconds`` (of the round) and ``elapsed`` (of rounds
1..t, evaluations excluded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpadmm.data import Dataset
from dpadmm.data.libsvm import load_binary, normalise_rows
from dpadmm.data.vertical import load_mnist_4v9, pad_blocks, split_columns
from dpadmm.privacy import noise
from dpadmm.privacy.ledger import Ledger
from dpadmm.runs.loop import seed_writers, timed_rounds
from dpadmm.sharing import privacy, updates
from dpadmm.sharing.config import SharingConfig

DTYPES = {"float64": torch.float64, "float32": torch.float32}
RIDGE = 1e-6  # tau_m = RIDGE trace(D_m^T D_m) / d_m: the paper's noise where D_m is rank-deficient


@dataclass(frozen=True)
class Problem:
    """A vertical split: every party's training and test block (rows of unit norm within the block,
    zero-padded to the widest), labels +-1, and the blocks' geometry."""

    name: str
    widths: tuple[int, ...]
    blocks: torch.Tensor  # [M, N, d]
    test_blocks: torch.Tensor  # [M, N_test, d]
    mask: torch.Tensor  # [M, d], the real columns
    labels: torch.Tensor  # [N]
    test_labels: torch.Tensor
    geometry: updates.Geometry
    ridge: torch.Tensor  # [M]

    @property
    def num_samples(self) -> int:
        return int(self.blocks.shape[1])


def build(dataset: Dataset, widths: Sequence[int], dtype: torch.dtype = torch.float64,
          device: str | torch.device = "cpu") -> Problem:
    """The problem of ``dataset`` split into column blocks of ``widths``; each block's rows are scaled to unit
    norm (001 Assumption 2.3), which the sensitivity needs."""
    def blocks_of(x: torch.Tensor) -> list[torch.Tensor]:
        return [normalise_rows(b).to(dtype=dtype, device=device) for b in split_columns(x, widths)]

    blocks, mask = pad_blocks(blocks_of(dataset.x_train))
    test_blocks, _ = pad_blocks(blocks_of(dataset.x_test))
    geo = updates.geometry(blocks)
    width = torch.tensor(widths, dtype=dtype, device=device)
    return Problem(
        name=dataset.name, widths=tuple(widths), blocks=blocks, test_blocks=test_blocks, mask=mask,
        labels=(2 * dataset.y_train - 1).to(dtype=dtype, device=device),
        test_labels=(2 * dataset.y_test - 1).to(dtype=dtype, device=device),
        geometry=geo, ridge=RIDGE * geo.eigenvalues.sum(dim=-1) / width,
    )


def load(config: SharingConfig) -> Problem:
    """:func:`build` on the configured data set and split."""
    if config.dataset == "mnist-4v9":
        dataset = load_mnist_4v9(config.data_dir)
    else:
        dataset = load_binary(config.dataset, config.data_dir)
    return build(dataset, config.widths, DTYPES[config.dtype], config.device)


@dataclass
class State:
    """The iterates of S runs: x [S, M, d] (x~ with the paper's noise), the messages D_m x~_m [S, M, N] (each
    party's cache for the subtraction trick), z and y [S, N]."""

    x: torch.Tensor
    messages: torch.Tensor
    z: torch.Tensor
    y: torch.Tensor


def initial_state(problem: Problem, runs: int) -> State:
    """x = 0, z = 0, y = 0 (the paper's start)."""
    m, n, d = problem.blocks.shape
    zeros = problem.blocks.new_zeros
    return State(x=zeros((runs, m, d)), messages=zeros((runs, m, n)), z=zeros((runs, n)), y=zeros((runs, n)))


def draws(seeds: Sequence[int], parties: int, t: int, size: int, like: torch.Tensor) -> torch.Tensor:
    """Standard normal draws [S, M, size] of round t, one keyed stream per (seed, party)."""
    agents = torch.arange(parties, dtype=torch.int64, device=like.device)
    ones = torch.ones(parties, dtype=torch.float64, device=like.device)
    return torch.stack([noise.gaussian(s, agents, t, 0, (size,), ones, dtype=like.dtype,
                                       stream=noise.STREAM_MESSAGE) for s in seeds])


def release(problem: Problem, x: torch.Tensor, seeds: Sequence[int], t: int, std: float, mode: str
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x~, the messages D_m x~_m [S, M, N]) of round t: with ``message`` noise x~ = x and the message gets
    N(0, sigma^2 I_N); with ``paper`` noise x~ = x + xi, xi ~ N(0, sigma^2 (D_m^T D_m + tau I)^-1) (eq. (16)).
    No noise when std = 0."""
    m, n, d = problem.blocks.shape
    if std and mode == "paper":
        standard = draws(seeds, m, t, d, x)
        x = x + problem.mask * updates.paper_noise(problem.geometry, standard, std, problem.ridge)
    messages = torch.einsum("mnd,smd->smn", problem.blocks, x)
    if std and mode == "message":
        messages = messages + std * draws(seeds, m, t, n, x)
    return x, messages


def iterate(problem: Problem, state: State, config: SharingConfig, seeds: Sequence[int], t: int, std: float
            ) -> State:
    """Round t of Algorithm 1: the parties' x-steps from the server's broadcast s - z and y, their messages,
    the server's z and y."""
    pulled = state.messages.sum(dim=1) - state.z  # what the server broadcasts: s^t - z^t
    target = updates.party_target(pulled, state.messages)
    rho = config.penalty(problem.num_samples)
    x = updates.x_step(problem.blocks, problem.geometry, target, state.y, rho, config.l2, config.x_bound)
    x, messages = release(problem, x, seeds, t, std, config.noise)
    s = messages.sum(dim=1)
    z = updates.z_step(s, state.y, problem.labels, rho)
    return State(x=x, messages=messages, z=z, y=updates.dual_step(state.y, s, z, rho))


def evaluate(problem: Problem, state: State, t: int, l2: float) -> list[dict[str, float]]:
    """The metrics of every run after round t."""
    scores = torch.einsum("mnd,smd->sn", problem.blocks, state.x)
    test_scores = torch.einsum("mnd,smd->sn", problem.test_blocks, state.x)
    train = updates.objective(scores, problem.labels, state.x, l2)
    test = updates.loss(test_scores, problem.test_labels)
    error = (test_scores * problem.test_labels <= 0).to(scores.dtype).mean(dim=-1)
    residual = torch.linalg.vector_norm(state.messages.sum(dim=1) - state.z, dim=-1)
    return [{"round": t, "train-objective": float(train[s]), "test-log-loss": float(test[s]),
             "test-error": float(error[s]), "primal-residual": float(residual[s])} for s in range(len(train))]


@dataclass(frozen=True)
class Result:
    """The evaluated rounds of each run, the final state, where each run was written, the ledger (None if
    non-private) and the problem."""

    records: list[list[dict[str, Any]]]
    state: State
    directories: list[Path | None]
    ledger: Ledger | None
    problem: Problem


def run(config: SharingConfig, seeds: Sequence[int] | None = None, *, problem: Problem | None = None,
        write: bool = True, directories: Sequence[str | Path] | None = None, progress: bool = True) -> Result:
    """Run ``config`` for each of ``seeds`` (default: its own seed) as one batch; write each run's folder."""
    seeds = [config.seed] if seeds is None else list(seeds)
    problem = load(config) if problem is None else problem
    ledger = privacy.ledger(config, problem.num_samples) if config.private else None
    std = privacy.noise_std(config, problem.num_samples)
    writers = seed_writers(config, seeds, ledger, directories) if write else []
    state = initial_state(problem, len(seeds))

    def step(t: int) -> None:
        nonlocal state
        state = iterate(problem, state, config, seeds, t, std)

    records = timed_rounds(config.rounds, step, lambda t: evaluate(problem, state, t, config.l2),
                           eval_every=config.eval_every, writers=writers, runs=len(seeds), progress=progress,
                           cuda=problem.blocks.is_cuda)
    folders: list[Path | None] = [w.directory for w in writers] or [None] * len(seeds)
    return Result(records=records, state=state, directories=folders, ledger=ledger, problem=problem)
