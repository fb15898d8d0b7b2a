"""Paper 004 deployed for real on loopback: each agent's SuperNode reads only its own file, the server none.

A TLS SuperLink with SuperNode authentication and one SuperNode per agent, all started with the
documented `dpadmm deploy` commands (:class:`tests.conftest.Deployment`). `dpadmm deploy agents` writes
agent-<i>.npz, each agent's samples of the run's draw; the run config has no data folder, so the
ServerApp holds no data. The run equals the engine iteration by iteration in what the server can see
(the consensus and the a-priori epsilon). (The SecAgg+ form runs in such a deployment too, but each of
its four stages an iteration waits for Flower's SuperNodes, which poll every 3 s: 128 s for 3
iterations of 3 agents here, too long for the suite; ``tests/test_decentral_flower.py`` runs it in a
real `flwr run` simulation.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpadmm.decentral import engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.runs.results import read_metrics
from tests.conftest import Deployment, decentral_run_config

pytestmark = pytest.mark.slow

AGENTS, SEED = 3, 4


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, binary_dir: Path) -> Iterator[Deployment]:
    """The agents' files, certificates and keys, a SuperLink and one SuperNode per agent."""
    d = Deployment(tmp_path_factory.mktemp("decentral-deployment"), nodes=AGENTS)
    files = d.root / "files"
    d.dpadmm("deploy", "agents", "--data-dir", str(binary_dir / "adult"), "--agents", str(AGENTS), "--seed",
             str(SEED), "--out", str(files))
    names = [f"node-{i}" for i in range(AGENTS)]
    d.prepare(names)
    try:
        d.start_superlink()
        for i, name in enumerate(names):
            d.register(name)
            d.start_supernode(i, f"partition-id={i} data-path='{files / f'agent-{i}.npz'}'")
        d.wait_for(lambda: d.online() == AGENTS, "every agent's SuperNode online")
        yield d
    finally:
        assert d.stop_all() == []


def _config(out: Path) -> DecentralConfig:
    return DecentralConfig(agents=AGENTS, edges=2, rounds=2, seed=SEED, node_timeout=120, round_timeout=120,
                           out=str(out))


def test_the_routed_run_on_the_agents_files_equals_the_engine(deployment: Deployment, binary_dir: Path
                                                              ) -> None:
    out = deployment.root / "routed"
    config = _config(out)
    assert deployment.submit(decentral_run_config(config)).wait(timeout=600) == 0
    log = (deployment.root / "flwr-run.log").read_text()
    assert "dpadmm iteration 2/2: consensus" in log, log[-3000:]
    flower = read_metrics(out)
    assert [r["round"] for r in flower] == [1, 2] and "log-error" not in flower[0]  # the server has no x*
    whole = dataclasses.replace(config, data_dir=str(binary_dir / "adult"))
    local = engine.run(whole, write=False, progress=False).records[0]
    for ours, theirs in zip(flower, local, strict=True):
        for key in ("consensus", "epsilon"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])
