"""A real deployment on loopback: a TLS SuperLink with SuperNode authentication, SuperNodes with
their own data files, and faults (a SuperNode killed and restarted, the server killed and
restarted). Every process is real and started with the documented `dpadmm deploy` commands;
every process is stopped at the end.

The SuperNodes take the deployment kind of randomness by themselves (nothing in the run config asks for
it): each agent's noise and samples come from its node's own secret, in the deployment's node-state
folder. The tests read those secrets, as only a node's owner could, to recompute a run with the engine.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dpadmm.iadmm import engine
from dpadmm.iadmm.config import RunConfig, papers
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.privacy.randomness import NodeSecret, Secret, run_key
from dpadmm.runs.results import read_jsonl, read_metrics
from tests.conftest import Deployment, run_config_of

pytestmark = pytest.mark.slow

AGENTS = 3
# Enough for a SuperNode killed after round 1 to be back by the last round: the SuperLink refuses its
# successor until 60 s after the last heartbeat it got (they come every 17.5-22.5 s), 37-60 s after the kill.
# Round 2 waits round-timeout = 40 s for the killed node's reply; once the SuperLink counts it offline, a
# round without it takes seconds: 4-7 s with the devices' warm runtime (dpadmm node serve), nothing else
# running, where 9 rounds ended before the node was let back in. 20 rounds leave 70 s or more after round 2.
ROUNDS_WITH_DROPOUT = 20


def _node_config(d: Deployment, i: int) -> str:
    """Agent min(i, P-1)'s node config: its own npz file (SuperNode P, the rogue, claims the last agent)."""
    return (f"partition-id={min(i, AGENTS - 1)} data-path='{d.root / f'agent-{i}.npz'}' "
            f"num-samples-total={d.total}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Certificates, keys, one SuperLink and three registered SuperNodes, each with its own npz file."""
    d = Deployment(tmp_path_factory.mktemp("deployment"), nodes=AGENTS + 1)
    d.mnist_agents(AGENTS)
    shutil.copy(d.root / f"agent-{AGENTS - 1}.npz", d.root / f"agent-{AGENTS}.npz")
    d.prepare([f"node-{i}" for i in range(AGENTS)] + ["rogue"])
    with d.running([_node_config(d, i) for i in range(AGENTS)]):
        yield d


def test_an_unregistered_supernode_is_refused(deployment: Deployment) -> None:
    rogue = deployment.start_supernode(AGENTS, _node_config(deployment, AGENTS), key="rogue")
    assert rogue.wait(timeout=120) != 0  # it gives up: the SuperLink does not know its key
    deployment.processes.pop(f"supernode-{AGENTS}")
    assert "Failed to activate SuperNode" in (deployment.root / f"supernode-{AGENTS}.log").read_text()
    assert deployment.online() == AGENTS


def _run_config(out: Path, rounds: int) -> str:
    return run_config_of(papers(num_agents=AGENTS, rounds=rounds, local_steps=2, epsilon=0.5, seed=1,
                                   node_timeout=120, round_timeout=40, out=str(out)))


def _wait_for_round(d: Deployment, path: Path, t: int, run: subprocess.Popen, timeout: float = 300) -> None:
    """Wait until the run has recorded round ``t``; a run that ended before fails with its log's end."""
    def done() -> bool:
        if path.exists() and any(r["round"] >= t for r in read_jsonl(path)):
            return True
        assert run.poll() is None, f"the run ended before round {t}:\n" + "\n".join(
            (d.root / "flwr-run.log").read_text().splitlines()[-30:])
        return False

    Deployment.wait_for(done, f"round {t} in {path}", timeout)


def _replayed(d: Deployment, out: Path, config: RunConfig) -> engine.EngineState:
    """The engine's run on the deployment's participation (rounds.jsonl), with the nodes' own keys for the
    run identity the server kept in its checkpoint: what the deployed run must have computed."""
    identity = torch.load(out / "checkpoint.pt", weights_only=True)["run_identity"]
    nodes = d.root / "node-state"
    keys = Secret({p: run_key(NodeSecret(nodes, p).secret(), identity, p) for p in range(AGENTS)})
    data = agent_data(load_for(config), config, range(AGENTS))
    zeros = torch.zeros((1, AGENTS, *data.shape), dtype=torch.float64)
    state = engine.EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                               lam=zeros.clone())
    reports = read_jsonl(out / "rounds.jsonl")
    assert any(report["replied"] for report in reports)
    for report in reports:
        # every replying node chose its randomness itself; a round that timed out on every node (a loaded
        # machine) has no reply, so no randomness to report, and the replay steps no agent in it
        assert report["randomness"] == (["deployment"] if report["replied"] else [])
        active = torch.zeros((1, AGENTS), dtype=torch.bool)
        active[0, report["replied"]] = True
        engine.step(config, data, state, report["round"], active=active, randomness=keys)
    return state


def test_a_killed_supernode_drops_out_and_rejoins(deployment: Deployment) -> None:
    out = deployment.root / "dropout-run"
    run = deployment.submit(_run_config(out, rounds=ROUNDS_WITH_DROPOUT))
    _wait_for_round(deployment, out / "rounds.jsonl", 1, run)
    deployment.kill("supernode-2")
    restarting = deployment.restart_supernode(2)
    assert run.wait(timeout=600) == 0
    restarting.join()
    log = (deployment.root / "flwr-run.log").read_text()
    assert f"dpadmm round {ROUNDS_WITH_DROPOUT}/{ROUNDS_WITH_DROPOUT}: test error" in log
    rounds = read_jsonl(out / "rounds.jsonl")
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS_WITH_DROPOUT + 1))
    assert rounds[0]["replied"] == [0, 1, 2]
    assert 2 not in rounds[1]["replied"] and 2 in rounds[1]["no_reply"] + [r["partition"] for r in
                                                                           rounds[1]["rejected"]]
    assert rounds[-1]["replied"] == [0, 1, 2]  # back, with its lambda_p from the server
    assert all(r["replied"][:2] == [0, 1] for r in rounds)
    # Exactly the engine's run on the same participation, with the nodes' keys: the rejoined agent lost
    # nothing (its secret survived its restart).
    config = papers(num_agents=AGENTS, rounds=ROUNDS_WITH_DROPOUT, local_steps=2, epsilon=0.5, seed=1)
    state = _replayed(deployment, out, config)
    final = torch.load(out / "checkpoint.pt", weights_only=True)
    torch.testing.assert_close(final["w"]["weight"], state.w[0], rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(final["lam"]["weight"], state.lam[0], rtol=1e-5, atol=1e-12)
    assert read_metrics(out)[-1]["test-error"] < 0.9


def test_a_restarted_server_resumes_to_the_uninterrupted_model(deployment: Deployment) -> None:
    straight, interrupted = deployment.root / "straight", deployment.root / "interrupted"
    # every agent's node, SuperNode 2 back from the test before: a run starts only with all of them
    deployment.wait_online(AGENTS, "the three SuperNodes online")
    assert deployment.submit(_run_config(straight, rounds=3)).wait(timeout=600) == 0

    run = deployment.submit(_run_config(interrupted, rounds=3))
    _wait_for_round(deployment, interrupted / "rounds.jsonl", 2, run)
    deployment.kill("superlink")  # the SuperLink with its ServerApp, mid-run
    run.wait(timeout=60)
    deployment.start_superlink()
    deployment.wait_online(AGENTS, "the SuperNodes to reconnect")
    assert deployment.submit(_run_config(interrupted, rounds=3)).wait(timeout=600) == 0

    log = (deployment.root / "flwr-run.log").read_text()
    assert "DP-IADMM: resuming after round" in log
    assert [r["round"] for r in read_jsonl(interrupted / "rounds.jsonl")] == [1, 2, 3]
    assert [r["round"] for r in read_metrics(interrupted)] == [1, 2, 3]
    final = {name: torch.load(folder / "checkpoint.pt", weights_only=True)
             for name, folder in (("straight", straight), ("interrupted", interrupted))}
    assert final["straight"]["round"] == final["interrupted"]["round"] == 3
    # Two runs of the same run config: different identities, so the nodes sent different messages.
    assert final["straight"]["run_identity"] != final["interrupted"]["run_identity"]
    assert not torch.equal(final["straight"]["z"]["weight"], final["interrupted"]["z"]["weight"])
    # The resumed run kept its identity and its nodes repeated the cut-short round: it ends where the
    # uninterrupted run with its nodes' draws ends.
    config = papers(num_agents=AGENTS, rounds=3, local_steps=2, epsilon=0.5, seed=1)
    state = _replayed(deployment, interrupted, config)
    torch.testing.assert_close(final["interrupted"]["w"]["weight"], state.w[0], rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(final["interrupted"]["lam"]["weight"], state.lam[0], rtol=1e-5, atol=1e-12)
