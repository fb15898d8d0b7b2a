"""ADMM sharing (001) deployed for real on loopback: each party's SuperNode reads only its own file.

A TLS SuperLink with SuperNode authentication and one SuperNode per party, all started with the
documented `dpadmm deploy` commands (:class:`tests.conftest.Deployment`). `dpadmm deploy vertical`
cuts the real a9a into party-0.npz (66 columns), party-1.npz (57 columns) and labels.npz. The
server reads only the labels (``sharing.labels-path``), no party reads the data set (``data-dir`` is
empty). The SuperNodes take the deployment kind of randomness by themselves: each party's noise comes
from its node's own secret (in the deployment's node-state folder) for the run identity the server draws,
and the run equals the engine's on the whole data set round by round once the engine is given the parties'
keys, which the test reads as only a node's owner could. A party whose file lists the same samples in
another order stops the run with the alignment error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dpadmm.privacy.randomness import NodeSecret, Secret, run_key
from dpadmm.runs.results import failure, read_jsonl, read_metrics
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig
from tests.conftest import Deployment, last_run_status, run_config_of

pytestmark = pytest.mark.slow

PARTIES = (66, 57)


def _node_config(path: Path, party: int) -> str:
    return f"partition-id={party} data-path='{path}'"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, binary_dir: Path) -> Iterator[Deployment]:
    """The files, certificates and keys (node-2 for the misaligned party), a SuperLink and both parties."""
    d = Deployment(tmp_path_factory.mktemp("sharing-deployment"), nodes=4)
    files = d.root / "files"
    d.dpadmm("deploy", "vertical", "--dataset", "a9a", "--data-dir", str(binary_dir / "a9a"),
             "--parties", ",".join(map(str, PARTIES)), "--out", str(files))
    with np.load(files / "party-1.npz") as own:  # party 1's samples in another order, each row with its id
        order = np.random.default_rng(0).permutation(len(own["ids"]))
        np.savez(files / "party-1-permuted.npz", ids=own["ids"][order], x=own["x"][order],
                 test_ids=own["test_ids"], x_test=own["x_test"])
        np.savez(files / "party-1-short.npz", ids=own["ids"], x=own["x"][:, :-1],  # one column short
                 test_ids=own["test_ids"], x_test=own["x_test"][:, :-1])
    d.prepare(["node-0", "node-1", "node-2", "node-3"])
    with d.running([_node_config(files / f"party-{party}.npz", party) for party in range(len(PARTIES))]):
        d.register("node-2")
        d.register("node-3")
        yield d


def _config(out: Path, **changes: object) -> SharingConfig:
    return SharingConfig(epsilon=1.0, rounds=3, x_bound=0.5, seed=5, node_timeout=120, round_timeout=120,
                         out=str(out), parties=",".join(map(str, PARTIES)), **changes)


def _replayed(d: Deployment, config: SharingConfig) -> list[dict]:
    """The engine's run of ``config`` on the whole data set with the parties' keys for the run identity their
    nodes answered (the last run of party 0's record): what the deployed run must have computed."""
    identity = read_jsonl(d.root / "node-state" / "agent-0.answered.jsonl")[-1]["run"]
    keys = Secret({m: run_key(NodeSecret(d.root / "node-state", m).secret(), identity, m)
                   for m in range(len(PARTIES))})
    problem = engine.load(config)
    std = privacy.noise_std(config, problem.num_samples)
    state, records = engine.initial_state(problem, 1), []
    for t in range(1, config.rounds + 1):
        state = engine.iterate(problem, state, config, [config.seed], t, std, keys)
        records += engine.evaluate(problem, state, t, config.l2)
    return records


def test_each_party_reads_its_own_file_and_the_run_equals_the_engine(deployment: Deployment,
                                                                     binary_dir: Path) -> None:
    out = deployment.root / "aligned"
    config = _config(out, labels_path=str(deployment.root / "files" / "labels.npz"))
    assert deployment.submit(run_config_of(config)).wait(timeout=600) == 0
    log = (deployment.root / "flwr-run.log").read_text()
    # deployed parties send no test scores (a noise-free function of their rows): the rounds record the
    # primal residual of the released messages only
    assert "dpadmm round 3/3: primal residual" in log and "not tested" in log, log[-3000:]
    assert "deployment randomness: each node's noise and samples came from its own" in log
    flower = read_metrics(out)
    assert [r["round"] for r in flower] == [1, 2, 3] and not any("test-error" in r for r in flower)
    whole = dataclasses.replace(config, labels_path="", data_dir=str(binary_dir / "a9a"))
    for ours, theirs in zip(flower, _replayed(deployment, whole), strict=True):
        assert ours["primal-residual"] == pytest.approx(theirs["primal-residual"], rel=1e-9, abs=1e-12)
    keyed = engine.run(whole, write=False, progress=False).records[0]  # what the run config's seed gives
    assert all(ours["primal-residual"] != theirs["primal-residual"]
               for ours, theirs in zip(flower, keyed, strict=True))


def _party_1_reads(d: Deployment, node: int, file: str, out: Path, log_name: str) -> str:
    """Party 1's SuperNode (whichever node holds it now) is shut down and SuperNode ``node`` takes its place
    reading ``file``; a run is submitted, and its log returned. `flwr run --stream` exits 0 whatever the run's
    outcome: a ServerApp's failure (exit code 201) is in the log it streams."""
    for name in [n for n in d.processes if n.startswith("supernode-") and n != "supernode-0"]:
        d.stop(name)
    d.wait_online(1, "party 1's SuperNode to leave")
    d.start_supernode(node, _node_config(d.root / "files" / file, 1))
    d.wait_online(2, f"the SuperNode reading {file} online")
    config = _config(out, labels_path=str(d.root / "files" / "labels.npz"))
    d.submit(run_config_of(config), log_name).wait(timeout=600)
    return (d.root / log_name).read_text()


def test_a_party_of_other_sample_order_stops_the_run(deployment: Deployment) -> None:
    """Party 1's SuperNode is shut down and a node holding the same samples permuted takes its place. Its
    first reply shows it (its ids' digest): the run, started, fails in round 1 and its folder is marked so."""
    out = deployment.root / "misaligned"
    log = _party_1_reads(deployment, 2, "party-1-permuted.npz", out, "misaligned.log")
    assert "party 1's sample ids are not aligned with the labels'" in log, log[-3000:]
    assert "must list the same ids in the same order" in log
    assert "dpadmm round 1/3" not in log and not read_metrics(out)  # stopped in round 1
    assert "party 1's sample ids are not aligned" in failure(out)["reason"]


def test_a_party_file_one_column_short_ends_the_run_with_its_reason(deployment: Deployment) -> None:
    """Party 1's node now reads a file one column short of its 57: the node refuses its data when the server
    asks which party it holds, and the server ends the run with the node's reason before round 1 (not
    "completed" with empty metrics), leaving no run folder."""
    out = deployment.root / "short"
    log = _party_1_reads(deployment, 3, "party-1-short.npz", out, "short.log")
    reason = "x has 56 columns but parties='66,57' gives party 1 57"
    lines = [line for line in log.splitlines() if "dpadmm: the run cannot go on: node" in line]
    assert len(lines) == 1 and reason in lines[0], log[-3000:]
    assert "[ROUND 1" not in log and not out.exists()
    status, details = last_run_status(deployment.env, deployment.connection)
    assert status == "finished:failed" and reason in details


def test_two_nodes_claiming_one_party_end_the_run_naming_the_claim(deployment: Deployment) -> None:
    """Party 1's SuperNode is replaced by one that also says partition 0: the server binds the first, and when
    node-timeout passes without party 1 it ends the run naming the double claim and the family's own key
    (parties), not a num-agents this family does not have."""
    d = deployment
    for name in [n for n in d.processes if n.startswith("supernode-") and n != "supernode-0"]:
        d.stop(name)
    d.wait_online(1, "party 1's SuperNode to leave")
    d.start_supernode(2, _node_config(d.root / "files" / "party-0.npz", 0))
    d.wait_online(2, "the second SuperNode of party 0 online")
    labels = str(d.root / "files" / "labels.npz")
    config = dataclasses.replace(_config(d.root / "duplicate", labels_path=labels), node_timeout=10)
    d.submit(run_config_of(config), "duplicate.log").wait(timeout=600)
    status, details = last_run_status(d.env, d.connection)
    assert status == "finished:failed", (status, details)
    assert "only 1 of the 2 nodes of parties='66,57' connected" in details, details
    assert "claimed partition 0, which node" in details and "its own partition-id" in details
    assert "num-agents" not in details
