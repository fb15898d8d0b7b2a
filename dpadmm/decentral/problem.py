"""The problem of a run of paper 004: each agent's samples, the graph, and the optimum x*, per seed.

Sec. 5: "each agent gets 100 random samples" of UCI Adult and "a random communication graph with the
given N and |E| is generated in each run", 10 runs. Here both are functions of the run's seed:

- the samples: N b distinct training rows drawn uniformly without replacement (``numpy``'s PCG64 with
  the seed and a constant of its own), agent i getting the i-th b of them; rows scaled to unit norm
  (the paper's "normalise rows"), labels +-1 (NOTES-004, G4);
- the graph: :func:`dpadmm.decentral.graphs.build` with the same seed (another stream);
- x* = argmin sum_i f_i(x), the consensus optimum, by Newton's method on the d-dimensional problem
  (strongly convex: the regulariser gives every f_i curvature >= 1), to machine precision. The paper
  does not say how it computed x*; its metric needs one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpadmm.data import Dataset
from dpadmm.data.libsvm import normalise_rows
from dpadmm.decentral import graphs, updates
from dpadmm.decentral.config import DecentralConfig

DATA_STREAM = 0xBB67AE85  # mixed into the seed: which samples an agent gets, a stream of its own
NEWTON_STEPS = 50  # at most; x* stops when the step is below 1e-15 (about 6 steps here)


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


def agents_samples(dataset: Dataset, agents: int, samples: int, seed: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N, b, d] with unit rows, labels +-1 [N, b]) of one run."""
    total = agents * samples
    if total > dataset.num_train:
        raise ValueError(f"agents={agents} x samples={samples} = {total} rows, but {dataset.name} has "
                         f"{dataset.num_train} training rows")
    rng = np.random.Generator(np.random.PCG64([seed, DATA_STREAM]))
    rows = torch.from_numpy(rng.choice(dataset.num_train, size=total, replace=False))
    features = normalise_rows(dataset.x_train[rows]).view(agents, samples, -1)
    labels = (2 * dataset.y_train[rows] - 1).view(agents, samples)
    return features, labels


def optimum(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """x* = argmin_x sum_i f_i(x) of each run, [S, d], from features [S, N, b, d] and labels [S, N, b]: Newton
    with the gradient sum_i grad f_i (:func:`dpadmm.decentral.updates.gradient`) and its Hessian."""
    runs, agents, samples, d = features.shape
    z = features.reshape(runs, agents * samples, d)
    y = labels.reshape(runs, agents * samples).to(z.dtype)
    x = z.new_zeros((runs, d))
    eye = torch.eye(d, dtype=z.dtype, device=z.device)
    for _ in range(NEWTON_STEPS):
        grad = updates.gradient(features, labels, x.unsqueeze(1).expand(-1, agents, -1)).sum(dim=1)
        p = torch.sigmoid(-y * (z @ x.unsqueeze(-1)).squeeze(-1))
        hessian = (z.transpose(1, 2) * (p * (1 - p)).unsqueeze(1)) @ z / samples + agents * eye
        step = torch.linalg.solve(hessian, grad.unsqueeze(-1)).squeeze(-1)
        x = x - step
        if float(step.abs().max()) < 1e-15:
            break
    return x


def build(config: DecentralConfig, dataset: Dataset, seeds: Sequence[int], dtype: torch.dtype = torch.float64,
          device: str | torch.device = "cpu") -> Problem:
    """The problem of each of ``seeds`` (its samples, graph and optimum), stacked."""
    drawn = [agents_samples(dataset, config.agents, config.samples, s) for s in seeds]
    features = torch.stack([f for f, _ in drawn]).to(dtype=dtype, device=device)
    labels = torch.stack([y for _, y in drawn]).to(dtype=dtype, device=device)
    adjacency = torch.stack([graphs.build(config.graph, config.agents, config.edges, s).adjacency
                             for s in seeds]).to(device)
    return Problem(agents=Agents(features=features, labels=labels, adjacency=adjacency),
                   optimum=optimum(features, labels))



def agent_view(config: DecentralConfig, dataset: Dataset, agent: int, dtype: torch.dtype = torch.float64
               ) -> Agents:
    """What agent ``agent`` of the run ``config.seed`` holds and knows, as one run of all N agents: its own
    samples in its row (the other rows zero) and the whole graph, which is public. The engine's functions
    compute its row from this exactly as from the full federation."""
    if not 0 <= agent < config.agents:
        raise ValueError(f"partition-id={agent} is not allowed; it must be in 0..{config.agents - 1}")
    features, labels = agents_samples(dataset, config.agents, config.samples, config.seed)
    mine = torch.zeros(config.agents, dtype=torch.bool)
    mine[agent] = True
    features = torch.where(mine.view(-1, 1, 1), features, torch.zeros_like(features))
    labels = torch.where(mine.view(-1, 1), labels, torch.zeros_like(labels))
    adjacency = graphs.build(config.graph, config.agents, config.edges, config.seed).adjacency
    return Agents(features=features.unsqueeze(0).to(dtype), labels=labels.unsqueeze(0).to(dtype),
                  adjacency=adjacency.unsqueeze(0))
