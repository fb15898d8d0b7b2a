"""The device's own runtime (clients.runtime): it answers with the installed dpadmm whatever the run's FAB
holds, under the device's policy and lifetime budget. The loopback tests attack a real deployment (TLS
SuperLink, authenticated SuperNodes started with `dpadmm deploy supernode`) as a malicious server would."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from clients import runtime
from dpadmm.privacy.device import POLICY_FILE, STATE_ENV, Device, Policy
from dpadmm.privacy.randomness import NodeSecret, new_run_identity
from dpadmm.wire import IDENTITY_KEY, refusal_in
from tests.conftest import Deployment, flat_app_config, last_run_status, shipped_app

AGENTS = 2


def test_a_run_of_another_app_or_version_is_refused() -> None:
    version = runtime.installed_version()
    assert runtime.fab_refusal(runtime.APP_ID, version) is None
    assert runtime.fab_refusal("mallory/dpadmm", version) == (
        f"this device runs only dpadmm/dpadmm {version}, installed by its operator; the run's app is "
        f"mallory/dpadmm {version}, which it refuses to answer")
    assert "dpadmm/dpadmm 9.9.9, which it refuses" in str(runtime.fab_refusal(runtime.APP_ID, "9.9.9"))


@pytest.mark.usefixtures("server_process")
def test_a_failure_reaches_the_server_as_one_fixed_text(caplog: pytest.LogCaptureFixture) -> None:
    """Whatever the ClientApp raised (here a text with a number computed from the data), the server gets the
    same text; the node's own log has the details."""
    question = Message(content=RecordDict({"config": ConfigRecord({})}), message_type=MessageType.TRAIN,
                       dst_node_id=1)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    texts = []
    for leaked in (0.00544373, 0.00545059):
        def failing(message: Message, context: Context, leaked: float = leaked) -> Message:
            raise ValueError(f"the largest |value| is {leaked}")

        with caplog.at_level(logging.ERROR, logger="dpadmm.node"):
            reply, status, details = runtime.answer(question, context, runtime.APP_ID,
                                                    runtime.installed_version(), failing)
        assert reply.has_error() and status == "failed" and details == runtime.FAILED
        texts.append(reply.error.reason)
        assert str(leaked) in caplog.text
    assert texts == [runtime.FAILED, runtime.FAILED]


@pytest.mark.usefixtures("server_process")
def test_the_device_logs_each_refusal_and_its_reason(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The installed ClientApp refuses a query on a device whose policy accepts another algorithm: the
    device's own log states the refusal and its reason (not "completed"), and the task is ``failed`` with
    the reason, as the server's log states it."""
    (tmp_path / "policy.toml").write_text(Policy(algorithms=("objp",)).to_toml())
    question = Message(content=RecordDict({"config": ConfigRecord({"query": "partition-id",
                                                                   IDENTITY_KEY: new_run_identity()})}),
                       message_type=MessageType.QUERY, dst_node_id=1)
    context = Context(run_id=5, node_id=1, state=RecordDict(), run_config=flat_app_config(),
                      node_config={"partition-id": 0, "num-partitions": 10, "state-dir": str(tmp_path)})
    with caplog.at_level(logging.INFO, logger="dpadmm.node"):
        reply, status, details = runtime.answer(question, context, runtime.APP_ID,
                                                runtime.installed_version())
    reason = "algorithm='objpm' is not accepted by this device; its operator accepts objp"
    assert refusal_in(reply) == details == reason and status == "failed"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"dpadmm node: refused a query message of run {question.metadata.run_id}: {reason}")]


def test_the_runtime_says_at_start_which_policy_is_in_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """`dpadmm node serve` (and `dpadmm deploy supernode`, which runs it) states the policy of its state
    folder at start: the defaults on a device that never answered, an error on one that answered and lost
    its policy file (it then refuses every run), else the file."""
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    stop = threading.Event()
    stop.set()  # say what it says at start, then stop before asking the SuperNode anything

    def started() -> list[tuple[str, str]]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dpadmm.node"):
            runtime.serve(runtime.Options(), stop)
        return [(r.levelname, r.getMessage()) for r in caplog.records][1:]

    policy = tmp_path / "policy.toml"
    [(level, said)] = started()
    assert level == "INFO" and said.startswith(f"dpadmm node: no policy file {policy}: the defaults are in "
                                               "force (one run at most (eps = 8, delta = 1e-05)")
    assert said.endswith(f"(state folder {tmp_path}, unless a node config names another state-dir)")
    NodeSecret(tmp_path, 0).secret()
    [(level, said)] = started()
    assert level == "ERROR" and said.startswith(f"dpadmm node: the device's policy {policy} is missing but "
                                                "this device has answered before (agent-0.key exists)")
    policy.write_text(Policy().to_toml())
    assert started() == [("INFO", f"dpadmm node: the device's policy is {policy} (state folder {tmp_path}, "
                                  "unless a node config names another state-dir)")]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Two authenticated SuperNodes with their own npz files, whose operator set a lifetime budget of two
    main jobs (eps = 16); everything else is the policy's defaults."""
    d = Deployment(tmp_path_factory.mktemp("runtime"), nodes=AGENTS, policy=Policy(lifetime_epsilon=16.0))
    configs = d.mnist_agents(AGENTS)
    d.prepare([f"node-{i}" for i in range(AGENTS)])
    with d.running(configs):
        yield d


ROUNDS = 2


def _main_job(out: Path, table: str = "iadmm") -> str:
    """The main job's keys as --run-config (``table``: the main preset's, or iadmm-papers with
    preset='papers')."""
    keys = {"num-agents": AGENTS, "rounds": ROUNDS, "node-timeout": 120.0, "round-timeout": 120.0,
            "out": f"'{out}'"}
    return " ".join(f"{table}.{k}={v}" for k, v in keys.items())


def _run(d: Deployment, run_config: str, app: Path | None = None) -> tuple[str, str, str]:
    """(status, details, log) of one `flwr run ... --stream` on the deployment."""
    log = d.root / "flwr-run.log"
    seen = log.stat().st_size if log.exists() else 0
    command = ["flwr", "run", str(app or shipped_app()), d.connection, "--stream", "--run-config", run_config]
    subprocess.run(command, env=d.env, cwd=d.root, stdout=log.open("a"), stderr=subprocess.STDOUT,
                   timeout=600, check=True)
    with log.open() as text:
        text.seek(seen)
        output = text.read()
    status, details = last_run_status(d.env, d.connection)
    return status, details, output


def _exfiltrating_app(d: Deployment) -> Path:
    """The project's app, same name and version, whose ClientApp module copies the node's secret and the start
    of its data into a file of the attacker's choosing on import: what a FAB's code could do on a node that
    runs it."""
    app = d.root / "exfiltrating-app"
    shutil.copytree(shipped_app(), app)
    target = d.root / "exfiltrated"
    code = (app / "clients" / "client_app.py").read_text()
    (app / "clients" / "client_app.py").write_text(code + f"""
import os as _os, pathlib as _pathlib
_state = _pathlib.Path(_os.environ.get("DPADMM_NODE_STATE", "."))
_pathlib.Path({str(target)!r}).write_bytes(b"".join(p.read_bytes() for p in _state.glob("agent-*.key")))
""")
    return app


@pytest.mark.slow
def test_the_device_runs_its_own_code_and_spends_only_its_own_budget(deployment: Deployment) -> None:
    d = deployment
    state = d.root / "node-state"
    # 1. A FAB with the same name and version but other code: the devices answer with their installation,
    # so the run completes and the FAB's code never runs on them.
    status, details, log = _run(d, _main_job(d.root / "run-1"), _exfiltrating_app(d))
    assert status == "finished:completed", (details, log[-3000:])
    assert "dpadmm: test error" in log and not (d.root / "exfiltrated").exists()
    assert [len(Device(state, i).charges()) for i in range(AGENTS)] == [1, 1]
    # ... and a FAB of another version is refused outright, the device's reason in the server's log
    other = d.root / "other-version-app"
    shutil.copytree(shipped_app(), other)
    pyproject = other / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{runtime.installed_version()}"',
                                                       'version = "9.9.9"', 1))
    status, details, log = _run(d, _main_job(d.root / "other-version"), other)
    assert status == "finished:failed", (details, log[-3000:])
    version = runtime.installed_version()
    assert (f"this device runs only dpadmm/dpadmm {version}, installed by its operator; the run's app is "
            "dpadmm/dpadmm 9.9.9, which it refuses to answer") in log
    # 2. What a server sets cannot make a device release without its guarantee: refused at admission,
    # before any release, with the device's reason in the server's log; nothing charged.
    refused = d.root / "refused"
    for run_config, reason in [
        (f"algorithm='iadmm' {_main_job(refused)} iadmm.target-epsilon=0.0", "releases without noise"),
        (f"{_main_job(refused)} iadmm.target-epsilon=0.0 iadmm.epsilon=1000000.0 iadmm.mechanism='laplace'",
         "its operator allows at most (eps = 8, delta = 1e-05) per run"),
        (f"preset='papers' {_main_job(refused, 'iadmm-papers')} iadmm-papers.sensitivity='data-dependent'",
         "covered by no guarantee"),
    ]:
        status, details, log = _run(d, run_config)
        assert status == "finished:failed" and reason in log, (run_config, details, log[-3000:])
        assert not refused.exists()  # refused before round 1: nothing written, nothing released
    assert [len(Device(state, i).charges()) for i in range(AGENTS)] == [1, 1]
    # 3. A second run under a new identity spends the rest of the lifetime budget; a node restarted keeps
    # its record; a third run is refused however new its identity: averaging runs away is bounded.
    status, details, log = _run(d, _main_job(d.root / "run-2"))
    assert status == "finished:completed", (details, log[-3000:])
    d.stop("supernode-0")
    d.start_supernode(0)
    # ... and refused at the partition query, before any device releases: agent 1 is now a device with its
    # whole budget left (its own state folder, the same policy), asked and admitting the run, and nothing of
    # it is released or charged (the refusal used to come at round 1's train message, after the other devices
    # had released round 1 and charged the run, and the server's folder said completed-rounds: 1)
    fresh = d.root / "fresh-state"
    fresh.mkdir()
    shutil.copy(state / POLICY_FILE, fresh / POLICY_FILE)
    d.stop("supernode-1")
    d.start_supernode(1, f"{d.node_configs[1]} state-dir='{fresh}'")
    d.wait_online(AGENTS, "SuperNode 0 back and SuperNode 1 with budget left")
    node_1_log = d.root / "supernode-1.log"
    seen = node_1_log.stat().st_size
    started = time.monotonic()
    status, details, log = _run(d, _main_job(d.root / "run-3"))
    assert status == "finished:failed" and "the device's lifetime budget would be crossed" in log, log[-3000:]
    assert not (d.root / "run-3").exists()  # refused at the partition query: no round, no run folder
    assert time.monotonic() - started < 300
    assert [len(Device(state, i).charges()) for i in range(AGENTS)] == [2, 2]
    with node_1_log.open() as text:
        text.seek(seen)
        assert "dpadmm node: answered a query message" in text.read()
    assert Device(fresh, 1).charges() == {}
    assert not any((fresh / f"agent-1.{what}").exists() for what in ("key", "answered.jsonl"))  # no release
    spent = sum(c.epsilon for c in Device(state, 0).charges().values())
    assert 15.9 < spent <= 16.0 * (1 + 1e-6)
    shown = d.dpadmm("node", "status", "--state-dir", str(state)).stdout
    assert "over 2 run(s)" in shown
    for run in ("run-1", "run-2"):  # the server's folder and the device name each run alike
        assert f"  run {json.loads((d.root / run / 'config.json').read_text())['run-identity']}: " in shown
