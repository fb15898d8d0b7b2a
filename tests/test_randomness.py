"""The two kinds of randomness (dpadmm/privacy/randomness.py, clients/randomness.py) and the attack they
stop.

The attack plays the server of a DP-IADMM run: it holds everything the server sends and receives (the run
config with its seed, the state it sends an agent, the run identity, the agent's reply) and recomputes the
agent's message for a data set D and for D' (one sample removed) with the code the agent runs. Against the
simulation kind (draws keyed by the seed) it finds D, bit for bit: membership is certain. Against the
deployment kind (the node's own secret) it finds neither.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from clients.dpiadmm import train_reply
from clients.randomness import FORCED_SIMULATION, in_simulation_engine, node_kind, node_randomness
from dpadmm import wire
from dpadmm.iadmm import privacy
from dpadmm.iadmm.config import RunConfig, main_job, papers
from dpadmm.iadmm.engine import EngineState, step
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.iadmm.local import agent_round
from dpadmm.models.logistic import AgentData
from dpadmm.privacy import secure
from dpadmm.privacy.randomness import (
    DEPLOYMENT,
    SIMULATION,
    NodeSecret,
    Secret,
    forced_kind,
    new_run_identity,
    run_key,
    state_dir,
    statement,
)


@pytest.fixture(scope="module")
def main_config() -> RunConfig:
    """The main job (Gaussian, Poisson samples at q = 0.2, E = 10), calibrated as its agents calibrate it."""
    return privacy.calibrate(main_job())


def _agent(config: RunConfig, drop: int | None = None) -> AgentData:
    """Agent 0's data, or the same without its sample ``drop`` (an add-remove neighbour; I is public)."""
    data = agent_data(load_for(config), config, [0])
    if drop is None:
        return data
    keep = [i for i in range(int(data.counts[0])) if i != drop]
    return AgentData.from_blocks([data.x[0, keep]], [data.y[0, keep].argmax(dim=1)],
                                 num_classes=data.y.shape[2], total=data.total, agents=[0])


def _sent(config: RunConfig, identity: str, t: int = 1, shift: float = 0.0) -> Message:
    """The server's train message of round t to agent 0: w, lambda_0 and z_0 (zeros, plus ``shift`` in w)."""
    shape = _agent(config).shape
    w = torch.full(shape, shift, dtype=torch.float64)
    zeros = torch.zeros(shape, dtype=torch.float64)
    arrays = ArrayRecord(wire.pack({"w": {"weight": w}, "lambda": {"weight": zeros}, "z": {"weight": zeros}}))
    settings = ConfigRecord({"server-round": t, "partition-id": 0, "run-identity": identity})
    return Message(content=RecordDict({"arrays": arrays, "config": settings}), dst_node_id=1,
                   message_type=MessageType.TRAIN)


def _message(reply: Message) -> np.ndarray:
    return wire.unpack(reply.content["arrays"])["z"]["weight"].numpy()


def server_recomputes(config: RunConfig, sent: Message, reply: Message, data: AgentData) -> bool:
    """The attack: the agent's message recomputed from the run config, the state sent and a candidate data
    set, with the agent's own code (keyed draws, as the run config's seed gives them); True if it is the
    reply, bit for bit."""
    received = wire.unpack(sent.content["arrays"])
    w, lam, z = (torch.from_numpy(received[role]["weight"].numpy().copy()) for role in wire.DOWN)
    t = int(sent.content["config"]["server-round"])
    guess = agent_round(config, data, w, lam[None], z[None], t).z_sent[0].numpy()
    return bool(np.array_equal(guess, _message(reply)))


@pytest.mark.usefixtures("server_process")
def test_the_server_recomputes_a_simulated_agent_and_not_a_deployed_one(main_config: RunConfig,
                                                                         tmp_path: Path) -> None:
    with_sample, without = _agent(main_config), _agent(main_config, drop=5)
    identity = new_run_identity()
    simulated = train_reply(_sent(main_config, identity), main_config, with_sample, 0,
                            node_config={"randomness": "simulation"})
    assert simulated.content["config"]["randomness"] == FORCED_SIMULATION
    assert server_recomputes(main_config, _sent(main_config, identity), simulated, with_sample)
    assert not server_recomputes(main_config, _sent(main_config, identity), simulated, without)

    deployed = train_reply(_sent(main_config, identity), main_config, with_sample, 0,
                           node_config={"state-dir": str(tmp_path)})
    assert deployed.content["config"]["randomness"] == DEPLOYMENT
    assert not server_recomputes(main_config, _sent(main_config, identity), deployed, with_sample)
    assert not server_recomputes(main_config, _sent(main_config, identity), deployed, without)
    # What the deployed agent sent is the mechanism's release all the same: the engine, given the node's key,
    # computes it bit for bit (this is how a node's owner, and the deployment tests, check a run).
    key = run_key(NodeSecret(tmp_path, 0).secret(), identity, 0)
    zeros = torch.zeros((1, *with_sample.shape), dtype=torch.float64)
    expected = agent_round(main_config, with_sample, zeros[0], zeros, zeros, 1, randomness=Secret({0: key}))
    assert np.array_equal(expected.z_sent[0].numpy(), _message(deployed))


@pytest.mark.usefixtures("server_process")
def test_a_deployed_agent_repeats_a_round_but_answers_no_other_request_for_it(tmp_path: Path) -> None:
    # the papers' objp on one sample added or removed: the relation a device's default policy holds runs to
    config = papers(algorithm="objp", epsilon=0.5, num_agents=10, rounds=3, neighbouring="add-remove")
    data = _agent(config)
    node = {"state-dir": str(tmp_path)}
    identity = new_run_identity()
    first = train_reply(_sent(config, identity), config, data, 0, node_config=node)
    again = train_reply(_sent(config, identity), config, data, 0, node_config=node)  # a resumed server
    assert np.array_equal(_message(first), _message(again))
    with pytest.raises(ValueError, match="already answered round 1 of this run for another request"):
        train_reply(_sent(config, identity, shift=1e-3), config, data, 0, node_config=node)
    other_run = train_reply(_sent(config, new_run_identity()), config, data, 0, node_config=node)
    assert not np.array_equal(_message(first), _message(other_run))  # two runs never share noise
    second_round = train_reply(_sent(config, identity, t=2), config, data, 0, node_config=node)
    assert not np.array_equal(_message(first), _message(second_round))
    # The node's secret survives it (a file only its user reads); a new node has another one.
    assert os.stat(tmp_path / "agent-0.key").st_mode & 0o777 == 0o600
    restarted = train_reply(_sent(config, identity), config, data, 0, node_config=node)
    assert np.array_equal(_message(first), _message(restarted))
    elsewhere = train_reply(_sent(config, identity), config, data, 0,
                            node_config={"state-dir": str(tmp_path / "another-node")})
    assert not np.array_equal(_message(first), _message(elsewhere))


@pytest.mark.usefixtures("server_process")
def test_a_deployed_node_needs_the_run_identity(tmp_path: Path) -> None:
    config = papers(algorithm="objp", epsilon=0.5)
    with pytest.raises(ValueError, match="no run identity"):
        train_reply(_sent(config, ""), config, _agent(config), 0, node_config={"state-dir": str(tmp_path)})


def test_a_deployed_release_depends_on_the_gradient_only_through_the_grid() -> None:
    """The defence against the floating-point attacks: two gradients that round to the same grid point give
    the same release under the same draws (the keyed draw's low bits would differ)."""
    secret = Secret({0: secure.new_key()})
    generator = torch.Generator().manual_seed(0)
    grid = secure.grid("gaussian", 0.01, 7840)
    g = torch.round(torch.randn(1, 784, 10, dtype=torch.float64, generator=generator) / grid) * grid
    nudged = g + (torch.rand(g.shape, dtype=torch.float64, generator=generator) - 0.5) * 0.9 * grid
    assert not torch.equal(g, nudged)
    scale = torch.tensor([0.01], dtype=torch.float64)
    a = secret.release("gaussian", g, scale, torch.tensor([0]), 1, 1, 0)
    b = secret.release("gaussian", nudged, scale, torch.tensor([0]), 1, 1, 0)
    assert torch.equal(a, b)
    assert torch.equal(torch.round(a / grid), a / grid)  # on the grid
    with pytest.raises(ValueError, match="not agent 3"):
        secret.release("laplace", g, scale, torch.tensor([3]), 1, 1, 0)


def test_the_engine_given_the_nodes_keys_runs_the_deployed_mechanism() -> None:
    """engine.step with every agent's key draws from their secret streams: not the keyed run, and each agent
    alone (as its node computes it) gives its row of the batch."""
    config = papers(algorithm="objpm", epsilon=0.5, num_agents=3, rounds=2, local_steps=2,
                       sampling_rate=0.5, mechanism="gaussian", clip_norm=10.0, neighbouring="add-remove")
    data = agent_data(load_for(config), config, range(3))
    keys = Secret({p: secure.new_key() for p in range(3)})
    zeros = torch.zeros((1, 3, *data.shape), dtype=torch.float64)
    states = {kind: EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                                lam=zeros.clone()) for kind in ("keyed", "secret")}
    step(config, data, states["keyed"], 1)
    step(config, data, states["secret"], 1, randomness=keys)
    assert not torch.equal(states["keyed"].z, states["secret"].z)
    alone = agent_round(config, data.select(slice(1, 2)), states["secret"].w[0], zeros[0, 1:2],
                        zeros[0, 1:2], 1, randomness=Secret({1: keys.keys[1]}))
    assert torch.equal(alone.z_sent[0], states["secret"].z[0, 1])


def test_the_kind_is_the_nodes_to_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPADMM_RANDOMNESS", raising=False)
    assert not in_simulation_engine()  # a test process is no Ray actor of Flower's simulation engine
    assert node_kind({}) == DEPLOYMENT
    assert node_kind({"randomness": "simulation"}) == FORCED_SIMULATION
    monkeypatch.setenv("DPADMM_RANDOMNESS", "simulation")
    assert node_kind({}) == FORCED_SIMULATION
    assert node_kind({"randomness": "deployment"}) == DEPLOYMENT  # the node config before the environment
    monkeypatch.setenv("DPADMM_RANDOMNESS", "secret")
    with pytest.raises(ValueError, match=r"\$DPADMM_RANDOMNESS='secret' is not allowed; choose one of "
                                         "simulation, deployment"):
        forced_kind({})
    with pytest.raises(ValueError, match="node config randomness='keyed' is not allowed"):
        forced_kind({"randomness": "keyed"})


def test_a_simulated_node_hashes_no_request_and_builds_no_device_request() -> None:
    """The request's digest (a hash of every array of the message) and the device's run request are for a
    deployed node's records: a simulated node, which keeps none, computes neither."""
    def never() -> str:
        raise AssertionError("computed on a simulated node")

    randomness, kind, charge = node_randomness({"randomness": "simulation"}, {}, 0, 1, never, never)
    assert randomness is None and charge is None and kind == FORCED_SIMULATION


def test_the_state_folder_and_a_damaged_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPADMM_NODE_STATE", raising=False)
    assert state_dir({}) == Path.home() / ".dpadmm" / "node"
    monkeypatch.setenv("DPADMM_NODE_STATE", str(tmp_path / "env"))
    assert state_dir({}) == tmp_path / "env"
    assert state_dir({"state-dir": str(tmp_path / "own")}) == tmp_path / "own"
    node = NodeSecret(tmp_path, 4)
    secret = node.secret()
    assert len(secret) == 32 and node.secret() == secret
    (tmp_path / "agent-4.key").write_bytes(secret[:7])
    with pytest.raises(ValueError, match="holds 7 bytes, not a 32-byte secret"):
        node.secret()
    cut = '{"run": "r", "round": 1, "request": "a"}\n{"run": "r", "ro'
    (tmp_path / "agent-5.answered.jsonl").write_text(cut)
    NodeSecret(tmp_path, 5).answer("r", 1, "a")  # a line cut short by a crash is no answer
    with pytest.raises(ValueError, match="already answered round 1"):
        NodeSecret(tmp_path, 5).answer("r", 1, "b")


def _at_once(threads: int, call: Callable[[int], object]) -> list[object]:
    """``call(i)`` in ``threads`` real threads released together by a barrier: each one's result, or the
    exception it raised."""
    barrier = threading.Barrier(threads)

    def run(i: int) -> object:
        barrier.wait()
        try:
            return call(i)
        except Exception as error:  # noqa: BLE001 - the outcome under test
            return error

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(run, range(threads)))


def test_two_requests_for_one_round_at_once_are_never_both_answered(tmp_path: Path) -> None:
    """8 threads, half with one request and half with another for (run, round 1): the record is read and
    appended under the agent's lock, so exactly one request is recorded and the other's threads refused."""
    identity = new_run_identity()
    outcomes = _at_once(8, lambda i: NodeSecret(tmp_path, 0).answer(identity, 1, "ab"[i % 2] * 64))
    refused = [o for o in outcomes if isinstance(o, ValueError)]
    assert len(refused) == 4 and all("already answered round 1" in str(o) for o in refused)
    assert outcomes.count(None) == 4
    records = (tmp_path / "agent-0.answered.jsonl").read_text().splitlines()
    assert len(records) == 1
    answered = json.loads(records[0])["request"]
    assert [o is None for o in outcomes] == [("ab"[i % 2] * 64) == answered for i in range(8)]


def test_a_fresh_devices_secret_is_made_once_under_concurrency(tmp_path: Path) -> None:
    """Two threads creating a fresh device's secret collided on one temporary file (FileExistsError after
    the run was charged): now every caller gets the same 32 bytes, and no temporary file is left."""
    keys = _at_once(8, lambda i: NodeSecret(tmp_path / "fresh", 0).secret())
    assert all(isinstance(k, bytes) and len(k) == 32 for k in keys) and len(set(keys)) == 1
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["agent-0.budget.lock", "agent-0.key"]
    assert (tmp_path / "fresh" / "agent-0.key").read_bytes() == keys[0]


def test_every_statement_says_its_randomness() -> None:
    assert "reproducible from the run config" in statement([SIMULATION])
    assert "train loss" in statement([SIMULATION])
    assert "own 256-bit secret" in statement([DEPLOYMENT])
    forced = statement([DEPLOYMENT, FORCED_SIMULATION])
    assert forced.startswith("WARNING") and "NOT private against anyone holding the run config" in forced
    assert "describes the mechanism a deployment runs" in statement(None)
    ledger = privacy.ledger(main_job(), total_samples=5000)
    assert "randomness: the guarantee describes the mechanism a deployment runs" in ledger.summary()
