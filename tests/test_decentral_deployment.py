"""Paper 004 deployed for real on loopback: each agent's SuperNode reads only its own file, the server none.

A TLS SuperLink with SuperNode authentication and one SuperNode per agent, all started with the
documented `dpadmm deploy` commands (:class:`tests.conftest.Deployment`). `dpadmm deploy agents` writes
agent-<i>.npz, each agent's samples of the run's draw; the run config has no data folder, so the
ServerApp holds no data. The SuperNodes take the deployment kind of randomness by themselves (nothing in
the run config asks for it): each agent's weights and noise come from its node's own secret, in the
deployment's node-state folder, bound to the run identity the router draws. Two runs of the same run
config therefore exchange different iterates, and each equals the engine iteration by iteration in what
the server can see (the consensus and the a-priori epsilon) once the engine is given the nodes' keys, which
the test reads as only a node's owner could. (The SecAgg+ form runs in such a deployment too, but each of
its four stages an iteration waits for Flower's SuperNodes, which poll every 3 s: 128 s for 3
iterations of 3 agents here, too long for the suite; ``tests/test_decentral_flower.py`` runs it in a
real `flwr run` simulation.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpadmm.data.adult import load_adult
from dpadmm.decentral import engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import build
from dpadmm.privacy.randomness import NodeSecret, Secret, run_key
from dpadmm.runs.results import read_jsonl, read_metrics
from tests.conftest import Deployment, run_config_of

pytestmark = pytest.mark.slow

AGENTS, SEED = 3, 4


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, binary_dir: Path) -> Iterator[Deployment]:
    """The agents' files, certificates and keys, a SuperLink and one SuperNode per agent."""
    d = Deployment(tmp_path_factory.mktemp("decentral-deployment"), nodes=AGENTS)
    files = d.root / "files"
    d.dpadmm("deploy", "agents", "--data-dir", str(binary_dir / "adult"), "--agents", str(AGENTS), "--seed",
             str(SEED), "--out", str(files))
    d.prepare([f"node-{i}" for i in range(AGENTS)])
    with d.running([f"partition-id={i} data-path='{files / f'agent-{i}.npz'}'" for i in range(AGENTS)]):
        yield d


def _config(out: Path) -> DecentralConfig:
    return DecentralConfig(agents=AGENTS, edges=2, rounds=2, seed=SEED, node_timeout=120, round_timeout=120,
                           out=str(out))


def _identities(d: Deployment) -> list[str]:
    """The run identities agent 0's node answered, in the order of the runs (its record of answered
    rounds)."""
    seen: list[str] = []
    for line in read_jsonl(d.root / "node-state" / "agent-0.answered.jsonl"):
        if line["run"] not in seen:
            seen.append(line["run"])
    return seen


def _replayed(d: Deployment, config: DecentralConfig, identity: str) -> list[dict]:
    """What the server of the run ``identity`` must have seen: the engine's iterations with the nodes' keys
    for that run, reported as the router reports them (the consensus and the a-priori epsilon)."""
    nodes = d.root / "node-state"
    keys = Secret({i: run_key(NodeSecret(nodes, i).secret(), identity, i) for i in range(AGENTS)})
    problem = build(config, load_adult(config.data_dir), [config.seed])
    state = engine.start(config, problem.agents, [config.seed])
    records = []
    for k in range(1, config.rounds + 1):
        state, _ = engine.iterate(config, problem.agents, state, [config.seed], k, keys)
        records += engine.public_metrics(config, problem.agents.adjacency, state.x, k)
    return records


def test_two_routed_runs_on_the_agents_files_send_their_own_noise(deployment: Deployment,
                                                                  binary_dir: Path) -> None:
    out = deployment.root / "routed"
    config = _config(out)
    for _ in range(2):  # the same run config twice (the second run's folder is routed_1)
        assert deployment.submit(run_config_of(config)).wait(timeout=600) == 0
    log = (deployment.root / "flwr-run.log").read_text()
    assert log.count("dpadmm iteration 2/2: consensus") == 2, log[-3000:]
    assert log.count("deployment randomness: each node's noise and samples came from its own") == 2
    runs = [read_metrics(out), read_metrics(out.with_name("routed_1"))]
    identities = _identities(deployment)
    assert len(identities) == 2
    whole = dataclasses.replace(config, data_dir=str(binary_dir / "adult"))
    for flower, identity in zip(runs, identities, strict=True):
        assert [r["round"] for r in flower] == [1, 2] and "log-error" not in flower[0]  # no x* on the server
        for ours, theirs in zip(flower, _replayed(deployment, whole, identity), strict=True):
            for key in ("consensus", "epsilon"):
                assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])
    assert runs[0][0]["consensus"] != runs[1][0]["consensus"]  # other iterates from the first iteration
    # Neither run is the seed's: the keyed engine run is what a server holding the run config could compute.
    keyed = engine.run(whole, write=False, progress=False).records[0]
    assert all(r["consensus"] != k["consensus"] for run in runs for r, k in zip(run, keyed, strict=True))
