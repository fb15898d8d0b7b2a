"""The problem of a run of paper 004: each agent's samples, the graph, and the optimum x*, per seed.

Sec. 5: "each agent gets 100 random samples" of UCI Adult and "a random communication graph with the
given N and |E| is generated in each run", 10 runs. Here both are functions of the run's seed:

- the samples: N b distinct training rows drawn uniformly without replacement (``numpy``'s PCG64 with
  the seed and a constant of its own), agent i getting the i-th b of them (``partition='contiguous'``,
  the paper's IID agents) or the b that a label-skewed partition deals it from those rows
  (:func:`dpadmm.data.partition.equal_partition`, seeded by the same stream); rows scaled to unit norm
  (the paper's "normalise rows"), labels +-1 (Sec. 5 writes 0/1, with which its loss
  log(1 + exp(-L x^T z)) would be constant for the label 0);
- the graph: :func:`dpadmm.decentral.graphs.build` with the same seed (another stream);
- x* = argmin sum_i f_i(x), the consensus optimum, by Newton's method on the d-dimensional problem
  (strongly convex: the regulariser gives every f_i curvature >= 1), to machine precision. The paper
  does not say how it computed x*; its metric needs one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpadmm.data import Dataset
from dpadmm.data.adult import COLUMNS
from dpadmm.data.checks import write_npz
from dpadmm.data.libsvm import normalise_rows
from dpadmm.data.node import load_device_data
from dpadmm.data.partition import equal_partition, parse_scheme
from dpadmm.decentral import graphs, updates
from dpadmm.decentral.config import DecentralConfig

log = logging.getLogger("dpadmm.node")

DATA_STREAM = 0xBB67AE85  # mixed into the seed: which samples an agent gets, a stream of its own
FEATURES = {"adult": len(COLUMNS)}  # d of each data set: public, so a server without data knows it


@dataclass(frozen=True, eq=False)
class Agents:
    """What S runs of N agents hold and know: each agent its samples, features [S, N, b, d] (unit rows)
    and labels +-1 [S, N, b], and all of them the graph, adjacency [S, N, N] (bool; a public function of
    the seed). A Flower agent holds a view of this with only its own row of data filled in."""

    features: torch.Tensor
    labels: torch.Tensor
    adjacency: torch.Tensor

    @property
    def closed(self) -> torch.Tensor:
        """Each agent's closed neighbourhood, [S, N, N] bool."""
        eye = torch.eye(self.adjacency.shape[-1], dtype=torch.bool, device=self.adjacency.device)
        return self.adjacency | eye


@dataclass(frozen=True, eq=False)
class Problem:
    """The agents of S runs and the optimum x* [S, d] of each, which only the evaluation uses."""

    agents: Agents
    optimum: torch.Tensor


def sample_rows(dataset: Dataset, agents: int, samples: int, seed: int, partition: str = "contiguous"
                ) -> torch.Tensor:
    """The training rows each agent of a run gets, [N, b]: N b distinct rows drawn uniformly, dealt by
    ``partition`` (public: a function of the rows' labels and the seed)."""
    total = agents * samples
    if total > dataset.num_train:
        raise ValueError(f"agents={agents} x samples={samples} = {total} rows, but {dataset.name} has "
                         f"{dataset.num_train} training rows")
    rng = np.random.Generator(np.random.PCG64([seed, DATA_STREAM]))
    rows = rng.choice(dataset.num_train, size=total, replace=False)
    scheme = parse_scheme(partition)
    if scheme.skewed:
        rows = rows[equal_partition(dataset.y_train.numpy()[rows], agents, scheme,
                                    int(rng.integers(2**32)))]
    return torch.from_numpy(rows).view(agents, samples)


def own_samples(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An agent's samples as the algorithms use them, from the encoded rows x [..., b, d] and labels 0/1
    [..., b]: rows scaled to unit norm, labels +-1. An agent computes this from its own rows alone."""
    return normalise_rows(x.reshape(-1, x.shape[-1])).view(x.shape), 2 * y - 1


def agents_samples(dataset: Dataset, agents: int, samples: int, seed: int, partition: str = "contiguous"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, b, d] with unit rows, labels +-1 [N, b]) of one run."""
    rows = sample_rows(dataset, agents, samples, seed, partition)
    return own_samples(dataset.x_train[rows], dataset.y_train[rows])


def optimum(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """x* = argmin_x sum_i f_i(x) of each run, [S, d], from features [S, N, b, d] and labels [S, N, b]: Newton
    with the sums of the agents' gradients and Hessians (:mod:`dpadmm.decentral.updates`)."""
    runs, agents, _, d = features.shape

    def every(x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(1).expand(-1, agents, -1)

    return updates.newton(lambda x: updates.gradient(features, labels, every(x)).sum(dim=1),
                          lambda x: updates.hessian(features, labels, every(x)).sum(dim=1),
                          features.new_zeros((runs, d)), tol=1e-15)


def build(config: DecentralConfig, dataset: Dataset, seeds: Sequence[int], dtype: torch.dtype = torch.float64,
          device: str | torch.device = "cpu") -> Problem:
    """The problem of each of ``seeds`` (its samples, graph and optimum), stacked."""
    drawn = [agents_samples(dataset, config.agents, config.samples, s, config.partition) for s in seeds]
    features = torch.stack([f for f, _ in drawn]).to(dtype=dtype, device=device)
    labels = torch.stack([y for _, y in drawn]).to(dtype=dtype, device=device)
    adjacency = torch.stack([graphs.build(config.graph, config.agents, config.edges, s).adjacency
                             for s in seeds]).to(device)
    return Problem(agents=Agents(features=features, labels=labels, adjacency=adjacency),
                   optimum=optimum(features, labels))



def agent_view(config: DecentralConfig, dataset: Dataset, agent: int, dtype: torch.dtype = torch.float64
               ) -> Agents:
    """What agent ``agent`` of the run ``config.seed`` holds and knows, in simulation: its samples of the
    run's draw (:func:`own_view`)."""
    _check_agent(config, agent)
    features, labels = agents_samples(dataset, config.agents, config.samples, config.seed, config.partition)
    return own_view(config, agent, features[agent], labels[agent], dtype)


def own_view(config: DecentralConfig, agent: int, features: torch.Tensor, labels: torch.Tensor,
             dtype: torch.dtype = torch.float64) -> Agents:
    """Agent ``agent``'s view as one run of all N agents: its own samples (features [b, d] with unit rows,
    labels +-1 [b]) in its row, the other rows zero, and the whole graph, which is public. The engine's
    functions compute its row from this exactly as from the full federation. b must be ``samples``:
    the guarantee's B_inf = 2/b_i assumes it."""
    _check_agent(config, agent)
    if features.shape[0] != config.samples:
        raise ValueError(f"agent {agent} holds {features.shape[0]} samples but the run has samples="
                         f"{config.samples}; every agent needs exactly that many (B_inf = 2/b_i assumes it)")
    if features.shape[1] != FEATURES[config.dataset]:
        raise ValueError(f"agent {agent}'s samples have {features.shape[1]} columns; {config.dataset} has "
                         f"{FEATURES[config.dataset]}")
    all_features = features.new_zeros((config.agents, *features.shape))
    all_labels = labels.new_zeros((config.agents, *labels.shape))
    all_features[agent], all_labels[agent] = features, labels
    adjacency = graphs.build(config.graph, config.agents, config.edges, config.seed).adjacency
    return Agents(features=all_features.unsqueeze(0).to(dtype), labels=all_labels.unsqueeze(0).to(dtype),
                  adjacency=adjacency.unsqueeze(0))


def public_agents(config: DecentralConfig, dtype: torch.dtype = torch.float64) -> Agents:
    """What everyone knows of a run: the graph and the dimension d, with no samples (b = 0): the view of a
    deployed server, which holds no data."""
    adjacency = graphs.build(config.graph, config.agents, config.edges, config.seed).adjacency
    d = FEATURES[config.dataset]
    return Agents(features=torch.zeros((1, config.agents, 0, d), dtype=dtype),
                  labels=torch.zeros((1, config.agents, 0), dtype=dtype), adjacency=adjacency.unsqueeze(0))


def agent_file_name(agent: int) -> str:
    return f"agent-{agent}.npz"


def read_agent_file(config: DecentralConfig, agent: int, path: str | os.PathLike,
                    dtype: torch.dtype = torch.float64) -> Agents:
    """A deployed agent's view from its own file (node config ``data-path``): an .npz with ``x`` [b, d],
    the encoded columns in [0, 1] (:mod:`dpadmm.data.adult`), and ``y`` [b], labels 0/1
    (:func:`dpadmm.data.node.load_device_data` reads it: a row outside [0, 1] or with another label becomes a
    zero row of label 0, counted in the device's log only, so that no sample's value decides whether the
    agent answers, and the agent keeps its b samples)."""
    x, y, zeroed = load_device_data(path, num_classes=2, keep_count=True)
    if zeroed:
        log.warning("dpadmm node: data-path %s: %d row(s) outside [0, 1] or labels 0/1 count as zero rows",
                    path, zeroed)
    features, labels = own_samples(x, y)
    return own_view(config, agent, features, labels, dtype)


def write_agent_files(dataset: Dataset, agents: int, samples: int, seed: int, out: str | os.PathLike,
                      partition: str = "contiguous") -> list[Path]:
    """One file per agent (``agent-<i>.npz``, :func:`read_agent_file`'s layout) holding its ``samples`` rows
    of the draw of a run with ``seed`` and ``partition``, so that a deployment on them equals the simulation
    and the engine. Existing files are refused."""
    folder = Path(out).expanduser()
    rows = sample_rows(dataset, agents, samples, seed, partition)
    paths = [folder / agent_file_name(i) for i in range(agents)]
    taken = [str(p) for p in paths if p.exists()]
    if taken:
        raise FileExistsError(f"{taken[0]} exists; give an empty --out folder")
    folder.mkdir(parents=True, exist_ok=True)
    for path, own in zip(paths, rows, strict=True):
        write_npz(path, x=dataset.x_train[own].numpy(), y=dataset.y_train[own].numpy().astype(np.int64))
    return paths


def _check_agent(config: DecentralConfig, agent: int) -> None:
    if not 0 <= agent < config.agents:
        raise ValueError(f"partition-id={agent} is not allowed; it must be in 0..{config.agents - 1}")
