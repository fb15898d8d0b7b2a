"""The device's own runtime (clients.runtime): it answers with the installed dpadmm whatever the run's FAB
holds, under the device's policy and lifetime budget. The loopback tests attack a real deployment (TLS
SuperLink, authenticated SuperNodes started with `dpadmm deploy supernode`) as a malicious server would."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from clients import runtime
from dpadmm.privacy.device import POLICY_FILE, STATE_ENV, Device, Policy
from dpadmm.privacy.randomness import NodeSecret, new_run_identity
from dpadmm.wire import IDENTITY_KEY, refusal_in
from tests.conftest import ROOT, Deployment, flat_app_config, free_ports, last_run_status, shipped_app

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


MiB = 2**20


def supernode(port: int, state: str, messages: list[tuple[str, int, int]], version: str) -> None:
    """A SuperNode as `flower-supernode` holds a server's messages: its runtime API (Flower's own, served as
    `flower-supernode` serves it) over its in-memory state, where each message (kind, bytes, chunk bytes)
    waits as a task of a run of its own, already pulled from a SuperLink. Prints by run, as JSON, once every
    task is finished: the reply's refusal text (None without a reply), the task's sub-status and details.
    Each run's FAB is dpadmm at ``version``. ``kind``: "random" values, "zeros" (an array whose chunks past
    the first, which holds the array's header, are one chunk, sent once), or "inline" (random values that
    the message's metadata holds, as the SuperNode passes on a message whose ServerApp pushed it with its
    content). Run in a process of its own (``python -c``), as a SuperNode beside the runtime."""
    import numpy as np
    import uvicorn
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MessageType
    from flwr.app.message import array as flower_array
    from flwr.app.message import remove_content_from_message
    from flwr.common.constant import Status
    from flwr.supercore.constant import TaskType
    from flwr.supercore.fab import Fab
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        iterate_object_tree,
    )
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run, RunStatus
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.main import create_app
    from flwr.supernode.nodestate import NodeStateFactory
    from flwr.supernode.start_client_internal import _insert_message

    factory = NodeStateFactory(objectstore_factory=ObjectStoreFactory())
    node = factory.state()
    node.set_node_id(1)
    fab = Fab(hash_str=hashlib.sha256(b"").hexdigest(), content=b"", verifications={})
    node.store_fab(fab)
    for run_id, (kind, size, chunk) in enumerate(messages, start=1):
        node.store_run(Run(run_id, runtime.APP_ID, version, fab.hash_str, {}, "", "", "",
                           "", RunStatus("running", "", ""), "", "", None, 0, 0, 0.0, series_id=run_id))
        context = Context(run_id=run_id, node_id=1, node_config={"state-dir": state}, state=RecordDict(),
                          run_config={}, series_id=run_id)
        node.set_run_series_context(run_id, context)
        node.create_task(TaskType.CLIENT_APP, run_id, fab.hash_str)
        values = np.zeros(size // 8) if kind == "zeros" else np.random.default_rng(run_id).random(size // 8)
        flower_array.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE = chunk  # what the server's sender sets
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = run_id, run_id, 0
        content = RecordDict({"arrays": ArrayRecord({"w.weight": Array(values)}), "config": ConfigRecord({})})
        message = Message(content, message_type=MessageType.TRAIN, dst_node_id=1)
        if kind == "inline":  # a ServerApp that pushes the content in the message itself: its SuperLink
            _insert_message(message, node, node.object_store)  # and SuperNode pass it on as they store it
        else:  # as Flower's ServerApp pushes a message, and a SuperNode stores it once its objects are in
            message.metadata.__dict__["_message_id"] = message.object_id
            node.object_store.preregister(run_id, get_object_tree(message))
            node.store_message(remove_content_from_message(message))
            for object_id, part in get_all_nested_objects(message).items():
                node.object_store.put(object_id, part.deflate())
    server = uvicorn.Server(uvicorn.Config(create_app(state_factory=factory), host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 60
    while len(node.get_tasks(statuses=[Status.FINISHED])) < len(messages) and time.monotonic() < deadline:
        time.sleep(0.1)
    said: dict[int, list[str | None]] = {task.run_id: [None, task.status.sub_status, task.status.details]
                                         for task in node.get_tasks(statuses=[Status.FINISHED])}
    for reply in node.get_messages_legacy(is_reply=True):
        store = node.object_store
        tree = store.get_object_tree(reply.metadata.message_id)
        contents = {t.object_id: store.get(t.object_id) for t in iterate_object_tree(tree)}
        answered = inflate_object_from_contents(tree.object_id, contents)
        text = answered.error.reason if answered.has_error() else refusal_in(answered)
        said[reply.metadata.run_id][0] = text
    print(json.dumps(said), flush=True)
    server.should_exit = True


@pytest.mark.slow  # 30 to 35 s on two busy cores: mostly the SuperNode's start and its four 48 MiB messages
def test_a_message_over_the_limit_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Five messages, four tasks at once, the device's limit 8 MiB. 48 MiB in Flower's 5 MiB chunks: refused
    when the second chunk is announced (one chunk read); in one 48 MiB chunk: refused before its body is
    read; 48 MiB of zeros in 1 MiB chunks (the same chunk sent once: 2 MiB pulled): refused before it is
    inflated; 48 MiB inside the message's metadata (a ServerApp of its own: Flower's SuperLink passes it on):
    refused before the listing is read, the task failed without a reply (there is no message to reply to).
    1 MiB is pulled whole and answered (the runs' FAB is of another version, which :func:`runtime.answer`
    refuses: the ClientApp's own allocations stay out of the measurement). The runtime's peak allocation
    stays under half of one message: measured 11.4 to 11.9 MiB, one 5 MiB chunk as read and as parsed (the
    bound leaves room for the 1 MiB chunks' reads to overlap it); 262 MiB when the listing was read whole."""
    limit = 8 * MiB
    (tmp_path / "policy.toml").write_text(Policy(max_message_bytes=limit).to_toml())
    messages = [("random", 48 * MiB, 5 * MiB), ("random", 48 * MiB, 48 * MiB), ("zeros", 48 * MiB, MiB),
                ("inline", 48 * MiB, 5 * MiB), ("random", MiB, 5 * MiB)]
    port = free_ports(1)[0]
    code = (f"from tests.test_runtime import supernode; "
            f"supernode({port}, {str(tmp_path)!r}, {messages!r}, '9.9.9')")
    node = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    import clients.client_app  # noqa: F401 (imported before the measurement, as `node serve` does at start)

    stop = threading.Event()
    options = runtime.Options(f"127.0.0.1:{port}", poll=0.1)
    serving = threading.Thread(target=runtime.serve, args=(options, stop))
    tracemalloc.start()
    try:
        with caplog.at_level(logging.INFO, logger="dpadmm.node"):
            serving.start()
            said, _ = node.communicate(timeout=120)
            stop.set()
            serving.join(30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        stop.set()
        node.kill()
    refusal = (f"this device takes messages of at most {limit} bytes (its operator's max-message-bytes); the "
               "server's message is larger, and was refused before more than that was read")
    answered = {int(run): tuple(texts) for run, texts in json.loads(said).items()}  # reply, task status
    other = runtime.fab_refusal(runtime.APP_ID, "9.9.9")
    assert answered == {1: (refusal, "failed", refusal), 2: (refusal, "failed", refusal),
                        3: (refusal, "failed", refusal), 4: (None, "failed", refusal),
                        5: (other, "failed", other)}
    assert caplog.text.count("max-message-bytes); the server's message is larger") == 4, caplog.text
    assert "refused a message of run 4 before its listing was read" in caplog.text
    assert peak < 48 * MiB / 2, f"the runtime allocated {peak / MiB:.1f} MiB at its peak"


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
    # each device's own accountant and the server's statement agree on what the run cost, under one name
    identity = json.loads((d.root / "run-1" / "config.json").read_text())["run-identity"]
    stated = json.loads((d.root / "run-1" / "privacy.json").read_text())["whole_run"]
    for i in range(AGENTS):
        charge = Device(state, i).charges()[identity]
        assert charge.epsilon == pytest.approx(stated["epsilon_pld"], rel=1e-6), (charge, stated)
        assert charge.delta == stated["delta"]
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
