"""The batched engine of ADMM sharing (001 Algorithm 1, eq. (16)): seeds and parties as batch dimensions.

A round for S runs and M parties: every party's x-step at once (Jacobi, eq. (6)), each party's
message D_m x_m with its noise, the server's z-step (eq. (7)) and dual step (eq. (8)). The Flower
strategy and client call the same functions. The noise of party m in round t of run s is the
keyed Gaussian stream (seed_s, agent m, round t, :data:`~dpadmm.privacy.noise.STREAM_MESSAGE`): a
run is a function of its configuration and seed.

That is the *simulation* kind of randomness (:mod:`dpadmm.privacy.randomness`): the engine, ``dpadmm
train`` and a Flower simulation. A deployed party draws its noise from its own secret instead
(``randomness``, a :class:`~dpadmm.privacy.randomness.Secret`): its message is released by the grid
Gaussian mechanism (:meth:`~dpadmm.privacy.randomness.Secret.release`), which depends on D_m x_m only
through its rounding to a grid 2**-GRID_BITS / sqrt(N) of sigma. ``noise = paper`` (eq. (16)'s correlated
xi on x_m) has no such sampler and is refused in deployment (:data:`PAPER_REFUSED`). :func:`iterate` given a
``Secret`` with every party's key recomputes a deployment.

Metrics per evaluated round (``metrics.jsonl``): ``round``, ``train-objective`` (F at the parties'
x, eq. (2)), ``test-log-loss``, ``test-error``, ``test-majority`` (the test set's majority-class share: always
predicting that class errs on 1 minus it), ``test-undecided`` (the share of test scores exactly 0, which
count as errors: all of them after round 1, whose x is still 0, so round 1's test error is 1),
``primal-residual`` (||sum_m D_m x~_m - z||, the constraint of eq. (4) on what was sent), ``seconds`` (of
the round) and ``elapsed`` (of rounds 1..t, evaluations excluded).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpadmm.data import Dataset
from dpadmm.data.libsvm import normalise_rows
from dpadmm.data.vertical import load_vertical, pad_blocks, split_columns
from dpadmm.models.binary import majority_share
from dpadmm.privacy import noise
from dpadmm.privacy.ledger import Ledger
from dpadmm.privacy.randomness import SIMULATION, Secret, statement
from dpadmm.runs.loop import seed_writers, timed_rounds
from dpadmm.sharing import privacy, updates
from dpadmm.sharing.config import SharingConfig

DTYPES = {"float64": torch.float64, "float32": torch.float32}
RIDGE = 1e-6  # tau_m = RIDGE trace(D_m^T D_m) / d_m: the paper's noise of eq. (16) (updates.paper_noise)
# Why a deployed party refuses noise = paper (one line, naming the value and what is allowed).
PAPER_REFUSED = ("noise='paper' is not allowed with deployment randomness: the correlated Gaussian of 001 "
                 "eq. (16) has no grid sampler (and its guarantee is not covered); use noise='message'")


@dataclass(frozen=True)
class Parties:
    """What parties hold: each one's training and test block (rows of unit norm within the block, zero-padded
    to the widest), the blocks' geometry and ridge, and their numbers ``ids``, which key their noise streams.
    The engine holds all parties; a Flower client, its own (one)."""

    ids: torch.Tensor  # [M], int64
    blocks: torch.Tensor  # [M, N, d]
    test_blocks: torch.Tensor  # [M, N_test, d]
    mask: torch.Tensor  # [M, d], the real columns
    geometry: updates.Geometry
    ridge: torch.Tensor  # [M]


@dataclass(frozen=True)
class Problem:
    """A vertical split: the parties and the labels +-1 (which the server holds)."""

    name: str
    widths: tuple[int, ...]
    parties: Parties
    labels: torch.Tensor  # [N]
    test_labels: torch.Tensor

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])


def parties_from_blocks(blocks: Sequence[torch.Tensor], test_blocks: Sequence[torch.Tensor],
                        ids: Sequence[int], dtype: torch.dtype = torch.float64,
                        device: str | torch.device = "cpu") -> Parties:
    """The parties ``ids`` holding the raw column blocks ``blocks`` (training) and ``test_blocks``, in order.

    Each block's rows are scaled to unit norm here (001 Assumption 2.3, which the sensitivity needs), so
    that a party built from a deployed party's own file (:func:`dpadmm.data.vertical.read_party_file`)
    holds exactly what the same party holds in simulation, cut from the whole data set (:func:`parties_of`).
    """
    def scaled(raw: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [normalise_rows(b).to(dtype=dtype, device=device) for b in raw]

    padded, mask = pad_blocks(scaled(blocks))
    geo = updates.geometry(padded)
    width = torch.tensor([b.shape[1] for b in blocks], dtype=dtype, device=device)
    return Parties(ids=torch.tensor(list(ids), dtype=torch.int64, device=device), blocks=padded,
                   test_blocks=pad_blocks(scaled(test_blocks))[0], mask=mask, geometry=geo,
                   ridge=RIDGE * geo.eigenvalues.sum(dim=-1) / width)


def parties_of(dataset: Dataset, widths: Sequence[int], ids: Sequence[int] | None = None,
               dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> Parties:
    """The parties ``ids`` (default: all) of ``dataset`` split into column blocks of ``widths``
    (:func:`parties_from_blocks`)."""
    ids = list(range(len(widths))) if ids is None else list(ids)
    blocks, test_blocks = split_columns(dataset.x_train, widths), split_columns(dataset.x_test, widths)
    return parties_from_blocks([blocks[m] for m in ids], [test_blocks[m] for m in ids], ids, dtype, device)


def build(dataset: Dataset, widths: Sequence[int], dtype: torch.dtype = torch.float64,
          device: str | torch.device = "cpu") -> Problem:
    """The problem of ``dataset`` split into column blocks of ``widths`` (labels 0/1 become +-1)."""
    parties = parties_of(dataset, widths, None, dtype, device)
    return Problem(name=dataset.name, widths=tuple(widths), parties=parties,
                   labels=(2 * dataset.y_train - 1).to(dtype=dtype, device=device),
                   test_labels=(2 * dataset.y_test - 1).to(dtype=dtype, device=device))


def dataset_of(config: SharingConfig) -> Dataset:
    """The configured data set, unsplit."""
    return load_vertical(config.dataset, config.data_dir)


def load(config: SharingConfig) -> Problem:
    """:func:`build` on the configured data set and split.

    The engine holds every party and the labels of the configured data set; ``labels-path`` names the
    Flower server's labels file in a deployment, which the engine has no use for, so it is refused
    rather than ignored."""
    if config.labels_path:
        raise ValueError(f"labels-path={config.labels_path!r} is not allowed here; it is the Flower server's "
                         "labels file in a deployment (docs/deployment.md), while this run reads the whole "
                         "data set of dataset and data-dir; leave labels-path empty")
    return build(dataset_of(config), config.widths, DTYPES[config.dtype], config.device)


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
    m, n, d = problem.parties.blocks.shape
    zeros = problem.labels.new_zeros
    return State(x=zeros((runs, m, d)), messages=zeros((runs, m, n)), z=zeros((runs, n)), y=zeros((runs, n)))


def draws(seeds: Sequence[int], ids: torch.Tensor, t: int, size: int, like: torch.Tensor) -> torch.Tensor:
    """Standard normal draws [S, M, size] of round t, one keyed stream per (seed, party id)."""
    ones = torch.ones(len(ids), dtype=torch.float64, device=like.device)
    return torch.stack([noise.gaussian(s, ids, t, 0, (size,), ones, dtype=like.dtype,
                                       stream=noise.STREAM_MESSAGE) for s in seeds])


def release(parties: Parties, x: torch.Tensor, seeds: Sequence[int], t: int, std: float, mode: str,
            randomness: Secret | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x~, the messages D_m x~_m [S, M, N]) of round t: with ``message`` noise x~ = x and the message gets
    N(0, sigma^2 I_N); with ``paper`` noise x~ = x + xi, xi ~ N(0, sigma^2 (D_m^T D_m + tau I)^-1) (eq. (16)).
    No noise when std = 0.

    ``randomness`` (deployment, one run, a key for every party of ``parties``): each party's message is the
    grid Gaussian release of D_m x_m with standard deviation sigma (001 Theorem 3's mechanism, stream
    STREAM_MESSAGE). Why not ``paper`` noise: xi is a Gaussian with a covariance computed from the party's
    private block, and its image in the message, D_m xi, lies in col(D_m); releasing the standard normals
    on a grid and mapping them through that covariance would let the low bits of the output depend on the
    private block again, and the mode's guarantee is not covered anyway (:mod:`dpadmm.sharing.privacy`), so a
    deployed party refuses it (:data:`PAPER_REFUSED`)."""
    if randomness is not None:
        return _deployed_release(parties, x, seeds, t, std, mode, randomness)
    _, n, d = parties.blocks.shape
    if std and mode == "paper":
        standard = draws(seeds, parties.ids, t, d, x)
        x = x + parties.mask * updates.paper_noise(parties.geometry, standard, std, parties.ridge)
    messages = updates.scores(parties.blocks, x)
    if std and mode == "message":
        messages = messages + std * draws(seeds, parties.ids, t, n, x)
    return x, messages


def _deployed_release(parties: Parties, x: torch.Tensor, seeds: Sequence[int], t: int, std: float, mode: str,
                      randomness: Secret) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`release` with the parties' own secrets: the grid Gaussian mechanism on each message."""
    if len(seeds) != 1:
        raise ValueError(f"seeds={list(seeds)} is not allowed with deployment randomness: it runs one run")
    if std and mode == "paper":
        raise ValueError(PAPER_REFUSED)
    return x, deployed_messages(updates.scores(parties.blocks, x), parties.ids, t, std, randomness)


def deployed_messages(messages: torch.Tensor, ids: torch.Tensor, t: int, std: float, randomness: Secret
                      ) -> torch.Tensor:
    """The messages [1, M, N] of the parties ``ids`` as deployed parties send them in round t: each released
    by the grid Gaussian mechanism of standard deviation sigma = ``std`` (001 Theorem 3), from the party's
    own key (stream STREAM_MESSAGE); unchanged when std = 0 (a non-private run)."""
    if not std:
        return messages
    scale = torch.full((len(ids),), std, dtype=torch.float64)
    noisy = randomness.release("gaussian", messages[0], scale, ids.cpu(), t, 0, noise.STREAM_MESSAGE)
    return noisy.to(messages).unsqueeze(0)


def party_step(parties: Parties, pulled: torch.Tensor, own: torch.Tensor, y: torch.Tensor,
               config: SharingConfig, rho: float, seeds: Sequence[int], t: int, std: float,
               randomness: Secret | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The parties' side of round t (Algorithm 1, party steps 2-4): from the pulled s - z [S, N], their
    own last messages [S, M, N] and y [S, N], the x-step of eq. (6) and the noisy message; returns
    (x~, messages). ``randomness``: the deployment kind's (:func:`release`)."""
    target = updates.party_target(pulled, own)
    x = updates.x_step(parties.geometry, target, y, rho, config.l2, config.x_bound)
    return release(parties, x, seeds, t, std, config.noise, randomness)


def server_step(messages: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, rho: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's side of round t (Algorithm 1, central steps 1-3): s = sum of the messages, z of eq. (7),
    y of eq. (8); returns (z, y)."""
    s = messages.sum(dim=1)
    z = updates.z_step(s, y, labels, rho)
    return z, updates.dual_step(y, s, z, rho)


def iterate(problem: Problem, state: State, config: SharingConfig, seeds: Sequence[int], t: int, std: float,
            randomness: Secret | None = None) -> State:
    """Round t of Algorithm 1: the server's broadcast s - z and y, every party's step, the server's step.
    ``randomness`` with every party's key (one run) recomputes a deployment's round from its nodes' keys."""
    rho = config.penalty(problem.num_samples)
    pulled = state.messages.sum(dim=1) - state.z
    x, messages = party_step(problem.parties, pulled, state.messages, state.y, config, rho, seeds, t, std,
                             randomness)
    z, y = server_step(messages, state.y, problem.labels, rho)
    return State(x=x, messages=messages, z=z, y=y)


def evaluate(problem: Problem, state: State, t: int, l2: float) -> list[dict[str, float]]:
    """The metrics of every run after round t."""
    scores = updates.scores(problem.parties.blocks, state.x).sum(dim=1)
    test_scores = updates.scores(problem.parties.test_blocks, state.x).sum(dim=1)
    train = updates.objective(scores, problem.labels, state.x, l2)
    test = updates.loss(test_scores, problem.test_labels)
    error = updates.error(test_scores, problem.test_labels)
    undecided = updates.undecided(test_scores)
    majority = majority_share(problem.test_labels)
    residual = torch.linalg.vector_norm(state.messages.sum(dim=1) - state.z, dim=-1)
    return [{"round": t, "train-objective": float(train[s]), "test-log-loss": float(test[s]),
             "test-error": float(error[s]), "test-majority": majority, "test-undecided": float(undecided[s]),
             "primal-residual": float(residual[s])} for s in range(len(train))]


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
        write: bool = True, directories: Sequence[str | Path] | None = None, progress: bool = True,
        std: float | None = None) -> Result:
    """Run ``config`` for each of ``seeds`` (default: its own seed) as one batch; write each run's folder.

    ``std`` replaces Theorem 3's sigma of ``config.epsilon`` by a noise level of the caller's (001's Fig. 3
    sweeps noise levels, :mod:`dpadmm.sharing.reproduce`); such a run has no ledger, since its configuration
    does not describe its noise, and is not written: the caller states what its sigma implies."""
    if std is not None and (write or not std >= 0):
        raise ValueError(f"std={std!r} is not allowed with write={write}; a noise level of the caller's must "
                         "be >= 0 and its run is not written (its config.json would not describe it)")
    seeds = [config.seed] if seeds is None else list(seeds)
    problem = load(config) if problem is None else problem
    ledger = privacy.ledger(config, problem.num_samples) if config.private and std is None else None
    if ledger:  # the engine simulates: every draw is keyed by the seed
        ledger = dataclasses.replace(ledger, randomness=statement([SIMULATION]))
    std = privacy.noise_std(config, problem.num_samples) if std is None else std
    spent = functools.partial(privacy.ledger, config, problem.num_samples)
    writers = seed_writers(config, seeds, ledger, directories, spent=spent) if write else []
    state = initial_state(problem, len(seeds))

    def step(t: int) -> None:
        nonlocal state
        state = iterate(problem, state, config, seeds, t, std)

    records = timed_rounds(config.rounds, step, lambda t: evaluate(problem, state, t, config.l2),
                           eval_every=config.eval_every, writers=writers, runs=len(seeds), progress=progress,
                           cuda=problem.labels.is_cuda)
    folders: list[Path | None] = [w.directory for w in writers] or [None] * len(seeds)
    return Result(records=records, state=state, directories=folders, ledger=ledger, problem=problem)


def summary(config: SharingConfig, record: dict[str, Any]) -> str:
    """The line ``dpadmm train`` prints for the last evaluated round."""
    eps = f"eps={config.epsilon:g} per round" if config.private else "non-private"
    return (f"{config.algorithm} ({eps}, {config.dataset}, parties {config.parties}, T={config.rounds}): "
            f"training objective {record['train-objective']:.6g}, test log loss "
            f"{record['test-log-loss']:.6g}, test error {record['test-error']:.4f} "
            f"({error_note(record, majority=True)})")


def error_note(record: dict[str, Any], majority: bool) -> str:
    """What the test error of ``record`` is measured against: always predicting the majority class (with
    ``majority``) and the share of test scores that are exactly 0, which count as errors (where any are:
    after round 1 all are, so its error is 1 although the model has only not decided yet)."""
    notes = [f"always predicting the majority class errs on {1 - record['test-majority']:.4f}"] if majority \
        else []
    if record.get("test-undecided", 0.0) > 0:
        notes.append(f"{record['test-undecided']:.4f} of the test scores are 0: no decision, counted as "
                     "errors")
    return "; ".join(notes)
