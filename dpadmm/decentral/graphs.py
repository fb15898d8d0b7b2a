"""The communication graphs of paper 004: who exchanges iterates with whom.

An agent talks only to its neighbours. Algorithms 1 and 2 are written for the complete graph; the
experiments draw "a random communication graph with the given N and |E|" in every run (N = 10 and
|E| = 20, N = 100 and |E| = 200, N = 10 and |E| = 40) without saying how. Here a random graph is a
uniformly random spanning tree's worth of connectivity plus uniformly random further edges:

1. the agents in a random order, each joined to a uniformly chosen earlier one (a random tree, so
   the graph is connected, which every algorithm of the paper assumes);
2. the remaining |E| - (N - 1) edges drawn uniformly, without replacement, from the pairs not yet
   joined.

A graph is a function of (N, |E|, seed): ``numpy``'s PCG64 seeded with the run's seed and a
constant of its own, so that the graph and the noise of one seed are independent streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GRAPH_STREAM = 0x6A09E667  # mixed into the seed: the graph's stream is not the noise's
KINDS = ("random", "complete")


@dataclass(frozen=True, eq=False)
class Graph:
    """An undirected connected graph on N agents: the symmetric adjacency [N, N] (bool, no self-loops)."""

    adjacency: torch.Tensor

    @property
    def agents(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def edges(self) -> int:
        return int(self.adjacency.sum()) // 2

    @property
    def degrees(self) -> torch.Tensor:
        """|N_i| of every agent, [N] int64."""
        return self.adjacency.sum(dim=1)

    def neighbours(self, agent: int) -> list[int]:
        return [int(j) for j in torch.nonzero(self.adjacency[agent]).flatten()]

    def closed(self) -> torch.Tensor:
        """The closed neighbourhoods N_i with i itself, [N, N] bool."""
        return self.adjacency | torch.eye(self.agents, dtype=torch.bool)


def complete(agents: int) -> Graph:
    """Every pair joined."""
    _check(agents, agents * (agents - 1) // 2)
    return Graph(~torch.eye(agents, dtype=torch.bool))


def random_connected(agents: int, edges: int, seed: int) -> Graph:
    """A random connected graph with ``agents`` nodes and ``edges`` edges (the module docstring's recipe)."""
    _check(agents, edges)
    rng = np.random.Generator(np.random.PCG64([seed, GRAPH_STREAM]))
    adjacency = np.zeros((agents, agents), dtype=bool)
    order = rng.permutation(agents)
    for position in range(1, agents):
        a, b = order[position], order[rng.integers(position)]
        adjacency[a, b] = adjacency[b, a] = True
    free = np.argwhere(np.triu(~adjacency, k=1))  # the pairs i < j not yet joined, in row order
    extra = free[rng.choice(len(free), size=edges - (agents - 1), replace=False)]
    adjacency[extra[:, 0], extra[:, 1]] = adjacency[extra[:, 1], extra[:, 0]] = True
    return Graph(torch.from_numpy(adjacency))


def build(kind: str, agents: int, edges: int, seed: int) -> Graph:
    """``random`` (``edges`` edges, ``seed``) or ``complete`` (``edges`` ignored)."""
    if kind == "complete":
        return complete(agents)
    if kind == "random":
        return random_connected(agents, edges, seed)
    raise ValueError(f"graph={kind!r} is not allowed; choose one of {', '.join(KINDS)}")


def _check(agents: int, edges: int) -> None:
    if agents < 2:
        raise ValueError(f"agents={agents} is not allowed; a graph needs at least 2 agents")
    most = agents * (agents - 1) // 2
    if not agents - 1 <= edges <= most:
        raise ValueError(f"edges={edges} is not allowed with agents={agents}; a connected graph has between "
                         f"{agents - 1} and {most} edges")
