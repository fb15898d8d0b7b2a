"""strategies.linadmm: the DP-ADMM server (002) decides its own kind of randomness and, deployed, adds the
noise from its own secret.

The server is the one party of 002 that draws: simulation on Flower's in-memory grid (what `flwr run` on the
simulation engine and ``run_simulation`` give the ServerApp), deployment on any other grid, and
``$DPADMM_RANDOMNESS`` may force either. The clients' replies come from the real ``clients.linadmm`` function,
the strategy's iteration is checked against the engine given the server's key for the run identity.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from clients.linadmm import gradient_reply
from dpadmm.linadmm import engine, privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import constraint_matrix
from dpadmm.models import binary
from dpadmm.privacy import secure
from dpadmm.privacy.randomness import Secret, run_key, server_state_dir
from dpadmm.wire import POINT_KEY
from strategies.linadmm import DPLinADMM, server_secret
from strategies.nodes import server_kind

F64 = torch.float64
EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [0, 5]])
CLIENTS, ROWS, D = 2, 150, 6



def _clients() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each client's rows (unit norm) and labels +-1."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(CLIENTS * ROWS, D, generator=gen, dtype=F64)
    features = base / torch.linalg.vector_norm(base, dim=1, keepdim=True)
    labels = torch.where(features @ torch.linspace(-1, 2, D, dtype=F64) > 0, 1.0, -1.0).to(F64)
    return [(features[i * ROWS:(i + 1) * ROWS], labels[i * ROWS:(i + 1) * ROWS]) for i in range(CLIENTS)]


def _config(**changes: object) -> LinAdmmConfig:
    settings: dict[str, object] = {"target_epsilon": 0.5, "rounds": 3, "num_agents": CLIENTS, "seed": 4,
                                   **changes}
    return LinAdmmConfig(**settings)  # type: ignore[arg-type]


def _iteration(strategy: DPLinADMM, t: int) -> None:
    """One iteration as the round loop runs it: the point to every client, their real replies, the server's
    aggregation (and noise)."""
    point = engine.query_point(strategy.state, strategy.constants.accelerated)[0]
    replies = []
    for p, (features, labels) in enumerate(_clients()):
        asked = Message(content=RecordDict({"arrays": ArrayRecord({POINT_KEY: Array(point.numpy())}),
                                            "config": ConfigRecord({"server-round": t, "partition-id": p})}),
                        message_type=MessageType.TRAIN, dst_node_id=p + 1)
        replies.append(gradient_reply(asked, strategy.config, features, labels, p))
    strategy.aggregate_train(t, replies)


def _engine(config: LinAdmmConfig, randomness: Secret | None) -> engine.State:
    """The engine's iterations on all the clients' rows at once, keyed (None) or with the server's key."""
    a = constraint_matrix(EDGES, D)
    n = CLIENTS * ROWS
    sigma = privacy.noise_std(config, n)
    constants = engine.settings(config, a)
    state = engine.initial_state(config, a, 1)
    for t in range(1, config.rounds + 1):
        point = engine.query_point(state, constants.accelerated)
        total = sum(binary.clipped_gradient_sum(f, y, point, config.grad_bound) for f, y in _clients())
        state, _ = engine.iterate(a, state, engine.release(total, n, [config.seed], t, sigma, randomness),
                                  constants)
    return state


def _in_memory_grid() -> InMemoryGrid:
    """The grid Flower's simulation gives a ServerApp (flwr.simulation.run_simulation builds it so)."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    return InMemoryGrid(factory)


def test_the_server_decides_its_kind_from_its_grid_and_its_environment(tmp_path: Path) -> None:
    simulated = _in_memory_grid()
    assert server_kind(simulated, {}) == "simulation" and server_kind(None, {}) == "deployment"
    assert server_kind(None, {"DPADMM_RANDOMNESS": "simulation"}) == "forced-simulation"
    assert server_kind(simulated, {"DPADMM_RANDOMNESS": "deployment"}) == "deployment"
    with pytest.raises(ValueError, match=r"\$DPADMM_RANDOMNESS='keyed' is not allowed"):
        server_kind(None, {"DPADMM_RANDOMNESS": "keyed"})
    assert server_state_dir({}) == Path.home() / ".dpadmm" / "server"
    assert server_secret({"DPADMM_SERVER_STATE": str(tmp_path)}).key_path == tmp_path / "agent-0.key"


@pytest.mark.usefixtures("server_process")
@pytest.mark.parametrize("algorithm", ["dp-admm", "dp-accadmm"])
def test_a_deployed_server_adds_the_noise_the_engine_draws_from_its_key(algorithm: str,
                                                                        tmp_path: Path) -> None:
    """Three iterations of the strategy with the server's secret equal the engine's with the server's key for
    the strategy's run identity; a second run (another identity) draws other noise, and the keyed one
    (simulation) is the seed's."""
    config = _config(algorithm=algorithm)
    a = constraint_matrix(EDGES, D)
    finals = []
    for run in ("one", "two"):
        secret = server_secret({"DPADMM_SERVER_STATE": str(tmp_path / run)})
        strategy = DPLinADMM(config, a, CLIENTS * ROWS, secret)
        for t in range(1, config.rounds + 1):
            _iteration(strategy, t)
        key = Secret({0: run_key(secret.secret(), strategy.run_identity, 0)})
        torch.testing.assert_close(strategy.state.x, _engine(config, key).x, rtol=1e-9, atol=1e-12)
        finals.append(strategy.state.x)
    assert not torch.equal(finals[0], finals[1])
    keyed = DPLinADMM(config, a, CLIENTS * ROWS)
    for t in range(1, config.rounds + 1):
        _iteration(keyed, t)
    torch.testing.assert_close(keyed.state.x, _engine(config, None).x, rtol=1e-9, atol=1e-12)
    assert not torch.equal(keyed.state.x, finals[0])


@pytest.mark.usefixtures("server_process")
def test_a_deployed_server_releases_one_gradient_per_iteration(tmp_path: Path) -> None:
    """The server records each iteration it released: the same gradient again (a repeated aggregation) is the
    same release, another gradient for that iteration is refused (its noise would be used twice)."""
    config = _config()
    strategy = DPLinADMM(config, constraint_matrix(EDGES, D), CLIENTS * ROWS,
                         server_secret({"DPADMM_SERVER_STATE": str(tmp_path)}))
    start = strategy.state
    _iteration(strategy, 1)
    first = strategy.state.x
    strategy.state = start
    _iteration(strategy, 1)
    assert torch.equal(strategy.state.x, first)
    strategy.state = engine.initial_state(config, strategy.a, 1)
    strategy.state.x_hat = strategy.state.x = strategy.state.x + 0.1  # another point: another gradient
    with pytest.raises(ValueError, match="already answered round 1 of this run for another request"):
        _iteration(strategy, 1)


def test_the_deployed_noisy_gradient_depends_on_the_mean_only_through_the_grid() -> None:
    key = Secret({0: secure.new_key()})
    n, sigma = 1000, 0.01
    mean = torch.randn((1, 40), dtype=F64, generator=torch.Generator().manual_seed(2)) * 0.1
    grid = secure.grid("gaussian", sigma, 40)
    cell = torch.round(mean / grid) * grid
    within = cell + (mean - cell) / 2  # the same cell (|offset| <= grid / 4)
    sent = engine.release(mean * n, n, [0], 3, sigma, key)
    assert torch.equal(engine.release(within * n, n, [0], 3, sigma, key), sent)
    assert torch.equal(torch.round(sent / grid), sent / grid)
    assert not torch.equal(engine.release(mean * n, n, [0], 3, sigma, Secret({0: secure.new_key()})), sent)
    assert torch.equal(engine.release(mean * n, n, [0], 3, 0.0, key), (mean * n) / n)  # non-private: no noise
    with pytest.raises(ValueError, match=r"seeds=\[0, 1\] is not allowed with deployment randomness"):
        engine.release(torch.zeros((2, 40), dtype=F64), n, [0, 1], 3, sigma, key)
