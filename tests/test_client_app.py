"""The ClientApp's data: its partition in simulation, the device's own file in deployment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from clients.client_app import (
    agent_data_for,
    decentral_agent,
    decentral_dataset,
    device_request_for,
    query,
    read_node,
)
from clients.randomness import node_charge
from dpadmm.data.vertical import load_vertical, write_vertical_files
from dpadmm.decentral.config import DecentralConfig
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.privacy.device import Device, Policy
from dpadmm.privacy.randomness import new_run_identity
from dpadmm.wire import IDENTITY_KEY
from strategies.nodes import claimed_partition, refusal_in
from tests.conftest import flat_app_config, replace_one_device


def test_device_file_gives_the_same_agent_as_the_partition(mnist_dir: Path, tmp_path: Path) -> None:
    config = papers(algorithm="objp", dataset="mnist", data_dir=str(mnist_dir))
    dataset = load_for(config)
    block = dataset.partition(config.num_agents)[3]
    pixels = np.rint(dataset.x_train[block].numpy() * 255).astype(np.uint8)
    np.savez(tmp_path / "agent-3.npz", x=pixels, y=dataset.y_train[block].numpy())
    device = agent_data_for(config, {"partition-id": 3, "data-path": str(tmp_path / "agent-3.npz"),
                                     "num-samples-total": dataset.num_train}, num_classes=10)
    simulated = agent_data_for(config, {"partition-id": 3, "num-partitions": 10}, num_classes=10)
    expected = agent_data(dataset, config, [3])
    for data in (device, simulated):
        assert data.total == 60000 and data.agents.tolist() == [3]
        assert torch.equal(data.x, expected.x) and torch.equal(data.y, expected.y)


def test_bad_node_configs_are_named(tmp_path: Path) -> None:
    config = papers(algorithm="objp")
    np.savez(tmp_path / "d.npz", x=np.zeros((3, 784), np.uint8), y=np.array([0, 1, 12]))
    with pytest.raises(ValueError, match="num-samples-total"):
        agent_data_for(config, {"partition-id": 0, "data-path": str(tmp_path / "d.npz")}, num_classes=10)
    with pytest.raises(ValueError, match="partition-id=10 is not allowed"):
        agent_data_for(config, {"partition-id": 10, "num-partitions": 10}, num_classes=10)
    # a row outside the run's classes is dropped, not refused: a refusal decided by one sample would tell the
    # server about it (clients.gate); only the device's log counts it
    data = agent_data_for(config, {"partition-id": 0, "data-path": str(tmp_path / "d.npz"),
                                   "num-samples-total": 100}, num_classes=10)
    assert data.counts.tolist() == [2.0]
    np.savez(tmp_path / "none.npz", x=np.zeros((1, 784), np.uint8), y=np.array([12]))
    # more samples than the federation's count: the operator's setting, in a text naming no count of the data
    with pytest.raises(ValueError, match=r"holds more samples than num-samples-total=1, the federation's "
                                         r"count; give the count of all agents' samples$"):
        agent_data_for(config, {"partition-id": 0, "data-path": str(tmp_path / "d.npz"),
                                "num-samples-total": 1}, num_classes=10)
    with pytest.raises(ValueError, match="holds no usable sample"):  # no usable row: the file's fault
        agent_data_for(config, {"partition-id": 0, "data-path": str(tmp_path / "none.npz"),
                                "num-samples-total": 100}, num_classes=10)
    with pytest.raises(ValueError, match="10 SuperNodes but num-agents=5 needs 5"):
        agent_data_for(papers(num_agents=5), {"partition-id": 0, "num-partitions": 10}, num_classes=10)


def test_the_client_app_imports_no_accountant() -> None:
    """A deployed SuperNode starts a ClientApp process per message: it must not pay the second that
    dp-accounting (with SciPy's statistics) takes to import, which no client uses for a fixed epsilon."""
    probe = ("import sys\nimport clients.client_app\n"
             "print('dp_accounting' in sys.modules, 'scipy.stats' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.split() == ["False", "False"]


def test_a_worker_serving_many_agents_reads_the_data_set_once(binary_dir: Path) -> None:
    """A simulation worker serves agents in turn, more than it keeps views of: it must not read UCI Adult
    again for each (that made an iteration of 10 agents take 5.7 s instead of 0.2 s)."""
    decentral_dataset.cache_clear()
    config = DecentralConfig(data_dir=str(binary_dir / "adult"))
    for agent in [*range(10), 0]:
        view = decentral_agent(config, {"partition-id": agent, "num-partitions": 10})
        assert float(view.features[0, agent].abs().sum()) > 0
    assert decentral_dataset.cache_info().misses == 1


@pytest.mark.usefixtures("server_process")
def test_a_node_reads_its_configuration_and_data_before_it_says_its_partition(binary_dir: Path,
                                                                            tmp_path: Path) -> None:
    """The partition query, which the server sends before round 1, is answered only once the node has read
    what its rounds will read: a simulated party of a federation too large, or a deployed party whose file is
    one column short, refuses with the reason (the server then ends the run before anything is written)."""
    write_vertical_files(load_vertical("a9a", binary_dir / "a9a"), (66, 57), tmp_path)
    with np.load(tmp_path / "party-1.npz") as own:
        np.savez(tmp_path / "short.npz", ids=own["ids"], x=own["x"][:, :-1], test_ids=own["test_ids"],
                 x_test=own["x_test"][:, :-1])
    run_config = {**flat_app_config(), "algorithm": "admm-sharing", "sharing.parties": "66,57",
                  "sharing.data-dir": str(binary_dir / "a9a")}

    def asked(node_config: dict[str, object]) -> Message:  # a device holding runs to 001's relation
        node = {**node_config, "state-dir": str(replace_one_device(tmp_path / "state"))}
        context = Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config=run_config)
        question = RecordDict({"config": ConfigRecord({"query": "partition-id"})})
        return query(Message(content=question, message_type=MessageType.QUERY, dst_node_id=7), context)

    for node_config in ({"partition-id": 1, "num-partitions": 2},
                        {"partition-id": 1, "data-path": str(tmp_path / "party-1.npz")}):
        answer = asked(node_config)
        assert refusal_in(answer) is None and claimed_partition(answer) == 1
    assert refusal_in(asked({"partition-id": 2, "num-partitions": 3})) == (
        "the federation has 3 SuperNodes but parties='66,57' needs 2, one per party: flwr run . "
        "--federation-config 'num-supernodes=2'")
    refused = refusal_in(asked({"partition-id": 1, "data-path": str(tmp_path / "short.npz")}))
    assert refused is not None and str(tmp_path / "short.npz") in refused
    assert "x has 56 columns but parties='66,57' gives party 1 57" in refused and "\n" not in refused
    assert claimed_partition(asked({"partition-id": 1, "data-path": str(tmp_path / "short.npz")})) is None


@pytest.mark.usefixtures("server_process")
def test_a_device_whose_budget_is_spent_refuses_at_the_query(tmp_path: Path) -> None:
    """The query names the run (its identity): the device checks there what the run's first release would
    check, its lifetime budget included, and writes nothing. A run already charged is admitted again; a new
    one that would cross the budget is refused before any node releases round 1 (it was refused only at
    round 1's train message, after the other devices had released and each charged the whole run)."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "policy.toml").write_text(Policy(lifetime_epsilon=8.0).to_toml())  # one main job in all
    node_config = {"partition-id": 1, "num-partitions": 2, "randomness": "deployment",
                   "state-dir": str(state)}
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                      run_config={**flat_app_config(), "iadmm.num-agents": 2})

    def asked(identity: str | None) -> Message:
        question = {"query": "partition-id"} | ({} if identity is None else {IDENTITY_KEY: identity})
        return query(Message(content=RecordDict({"config": ConfigRecord(question)}),
                             message_type=MessageType.QUERY, dst_node_id=7), context)

    first = new_run_identity()
    assert claimed_partition(asked(first)) == 1
    assert not Device(state, 1).path.exists()  # checked at the query, charged at the first release only
    config, held = read_node(context)
    node_charge(node_config, {IDENTITY_KEY: first}, 1, 1,  # the run's first release
                lambda: device_request_for(config, held, node_config))
    assert claimed_partition(asked(first)) == 1  # the run charged is admitted again (a resumed run)
    refused = refusal_in(asked(new_run_identity()))
    assert refused is not None and refused.startswith(
        "the device's lifetime budget would be crossed: it has spent (eps = 7.99")
    assert "its operator allows (eps = 8, delta = 0.0001) in all" in refused
    assert claimed_partition(asked(None)) == 1  # a server that names no run: its first release decides
    assert list(Device(state, 1).charges()) == [first]
