"""dpadmm.decentral.graphs: seeded connected graphs with the paper's N and |E|."""

from __future__ import annotations

import pytest
import torch

from dpadmm.decentral import graphs


def _connected(graph: graphs.Graph) -> bool:
    seen, frontier = {0}, [0]
    while frontier:
        for j in graph.neighbours(frontier.pop()):
            if j not in seen:
                seen.add(j)
                frontier.append(j)
    return len(seen) == graph.agents


@pytest.mark.parametrize(("agents", "edges"), [(10, 20), (100, 200), (10, 40), (5, 4), (5, 10)])
def test_a_random_graph_is_connected_with_the_asked_edges(agents: int, edges: int) -> None:
    for seed in range(5):
        graph = graphs.random_connected(agents, edges, seed)
        a = graph.adjacency
        assert graph.agents == agents and graph.edges == edges
        assert torch.equal(a, a.T) and not a.diagonal().any() and _connected(graph)


def test_a_graph_is_a_function_of_its_seed() -> None:
    first, again = (graphs.random_connected(10, 20, 3).adjacency for _ in range(2))
    assert torch.equal(first, again)
    drawn = {tuple(graphs.random_connected(10, 20, s).adjacency.flatten().tolist()) for s in range(10)}
    assert len(drawn) == 10  # a new graph per run, as the paper draws


def test_the_complete_graph_and_neighbourhoods() -> None:
    graph = graphs.build("complete", 4, 0, 0)
    assert graph.edges == 6 and graph.degrees.tolist() == [3, 3, 3, 3] and graph.neighbours(1) == [0, 2, 3]
    assert graph.closed().all()


@pytest.mark.parametrize(("kind", "agents", "edges", "message"), [
    ("random", 10, 8, "edges=8 is not allowed with agents=10; a connected graph has between 9 and 45 edges"),
    ("random", 10, 46, "edges=46 is not allowed"),
    ("random", 1, 0, "agents=1 is not allowed"),
    ("ring", 10, 10, "graph='ring' is not allowed; choose one of random, complete"),
])
def test_bad_graphs_are_named(kind: str, agents: int, edges: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        graphs.build(kind, agents, edges, 0)
