"""A real deployment on loopback: a TLS SuperLink with SuperNode authentication, SuperNodes with
their own data files, and faults (a SuperNode killed and restarted, the server killed and
restarted). Every process is real and started with the documented `dpadmm deploy` commands;
every process is stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.iadmm import engine
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.runs.results import read_jsonl, read_metrics
from tests.conftest import ROOT, free_ports, stop_flwr_processes

pytestmark = pytest.mark.slow

AGENTS = 3
ROUNDS_WITH_DROPOUT = 9  # enough for a killed SuperNode to be let back in (about a minute)
CONNECTION = "dpadmm-test"


class Deployment:
    """The processes of one loopback deployment, all with FLWR_HOME=<tmp>/flwr-home."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "flwr-home"
        bin_dir = str(Path(sys.executable).parent)
        self.env = dict(os.environ, FLWR_HOME=str(self.home), FLWR_TELEMETRY_ENABLED="0",
                        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        PATH=f"{bin_dir}:{os.environ['PATH']}")
        self.port, *self.node_ports = free_ports(AGENTS + 2)
        self.processes: dict[str, subprocess.Popen] = {}

    def dpadmm(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "dpadmm.cli", *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    def start(self, name: str, *args: str) -> subprocess.Popen:
        """A `dpadmm deploy ...` process in its own session (it execs the Flower command)."""
        log = open(self.root / f"{name}.log", "a")  # noqa: SIM115 (kept open for the process)
        process = subprocess.Popen([sys.executable, "-m", "dpadmm.cli", "deploy", *args], env=self.env,
                                   cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def kill(self, name: str) -> None:
        """SIGKILL a process and everything in its session (a crash, not a shutdown)."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def start_superlink(self) -> None:
        self.start("superlink", "superlink", "--certs", str(self.root / "certs"), "--host", "127.0.0.1",
                   "--port", str(self.port), "--database", str(self.root / "superlink.db"))
        self.wait_for(lambda: self.flwr("supernode", "list", CONNECTION).returncode == 0, "the SuperLink")

    def start_supernode(self, i: int, key: str | None = None) -> subprocess.Popen:
        node_config = (f"partition-id={min(i, AGENTS - 1)} data-path='{self.root / f'agent-{i}.npz'}' "
                       f"num-samples-total={self.total}")
        return self.start(f"supernode-{i}", "supernode", "--superlink", f"127.0.0.1:{self.port}",
                          "--node-config", node_config, "--ca-cert", str(self.root / "certs" / "ca.crt"),
                          "--key", str(self.root / "keys" / (key or f"node-{i}")),
                          "--port", str(self.node_ports[i]))

    def restart_supernode(self, i: int, timeout: float = 240) -> threading.Thread:
        """Start SuperNode i again until the SuperLink accepts it, as systemd's Restart=on-failure would.

        The SuperLink refuses a node id it still believes online: a killed SuperNode's
        successor is refused (exit code 305) until two missed heartbeats (up to a minute).
        """
        def keep_trying() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                process = self.start_supernode(i)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=20)
                if process.poll() is None:
                    return  # accepted: it is running
                self.processes.pop(f"supernode-{i}", None)
                time.sleep(5)

        thread = threading.Thread(target=keep_trying, daemon=True)
        thread.start()
        return thread

    def online(self) -> int:
        listing = self.flwr("supernode", "list", CONNECTION)
        return listing.stdout.count("online")

    def submit(self, run_config: str) -> subprocess.Popen:
        log = open(self.root / "flwr-run.log", "a")  # noqa: SIM115
        return subprocess.Popen(["flwr", "run", ".", CONNECTION, "--stream", "--run-config", run_config],
                                env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    @staticmethod
    def wait_for(condition, what: str, timeout: float = 120) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}")
            time.sleep(0.5)

    def stop_all(self) -> list[int]:
        for name in list(self.processes):
            self.kill(name)
        return stop_flwr_processes(self.home)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Certificates, keys, one SuperLink and three registered SuperNodes, each with its own npz file."""
    d = Deployment(tmp_path_factory.mktemp("deployment"))
    dataset = load_for(RunConfig(num_agents=AGENTS))
    d.total = dataset.num_train
    for i, block in enumerate(dataset.partition(AGENTS)):
        pixels = np.rint(dataset.x_train[block].numpy() * 255).astype(np.uint8)
        np.savez(d.root / f"agent-{i}.npz", x=pixels, y=dataset.y_train[block].numpy())
    np.savez(d.root / f"agent-{AGENTS}.npz", x=pixels, y=dataset.y_train[block].numpy())
    d.dpadmm("deploy", "certs", "--out", str(d.root / "certs"), "--hosts", "127.0.0.1,localhost")
    d.dpadmm("deploy", "keys", "--out", str(d.root / "keys"),
             "--names", ",".join([f"node-{i}" for i in range(AGENTS)] + ["rogue"]))
    d.dpadmm("deploy", "connection", "--name", CONNECTION, "--address", f"127.0.0.1:{d.port}",
             "--ca-cert", str(d.root / "certs" / "ca.crt"), "--flwr-home", str(d.home))
    try:
        d.start_superlink()
        for i in range(AGENTS):
            registered = d.flwr("supernode", "register", str(d.root / "keys" / f"node-{i}.pub"), CONNECTION)
            assert "registered successfully" in registered.stdout, registered.stdout + registered.stderr
            d.start_supernode(i)
        d.wait_for(lambda: d.online() == AGENTS, "three SuperNodes online")
        yield d
    finally:
        assert d.stop_all() == []


def test_an_unregistered_supernode_is_refused(deployment: Deployment) -> None:
    rogue = deployment.start_supernode(AGENTS, key="rogue")
    assert rogue.wait(timeout=120) != 0  # it gives up: the SuperLink does not know its key
    deployment.processes.pop(f"supernode-{AGENTS}")
    assert "Failed to activate SuperNode" in (deployment.root / f"supernode-{AGENTS}.log").read_text()
    assert deployment.online() == AGENTS


def _run_config(out: Path, rounds: int) -> str:
    return (f"num-agents={AGENTS} rounds={rounds} local-steps=2 epsilon=0.5 seed=1 node-timeout=120 "
            f"round-timeout=40 out='{out}'")


def _wait_for_round(path: Path, t: int, run: subprocess.Popen, timeout: float = 300) -> None:
    def done() -> bool:
        assert run.poll() is None, "the run ended early"
        return path.exists() and any(r["round"] >= t for r in read_jsonl(path))

    Deployment.wait_for(done, f"round {t} in {path}", timeout)


def test_a_killed_supernode_drops_out_and_rejoins(deployment: Deployment) -> None:
    out = deployment.root / "dropout-run"
    run = deployment.submit(_run_config(out, rounds=ROUNDS_WITH_DROPOUT))
    _wait_for_round(out / "rounds.jsonl", 1, run)
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
    # Exactly the engine's run on the same participation: the rejoined agent lost nothing.
    config = RunConfig(num_agents=AGENTS, rounds=ROUNDS_WITH_DROPOUT, local_steps=2, epsilon=0.5, seed=1)
    data = agent_data(load_for(config), config, range(AGENTS))
    zeros = torch.zeros((1, AGENTS, *data.shape), dtype=torch.float64)
    state = engine.EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                               lam=zeros.clone())
    for report in rounds:
        active = torch.zeros((1, AGENTS), dtype=torch.bool)
        active[0, report["replied"]] = True
        engine.step(config, data, state, report["round"], active=active)
    final = torch.load(out / "checkpoint.pt", weights_only=True)
    torch.testing.assert_close(final["w"]["weight"], state.w[0], rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(final["lam"]["weight"], state.lam[0], rtol=1e-5, atol=1e-12)
    assert read_metrics(out)[-1]["test-error"] < 0.9


def test_a_restarted_server_resumes_to_the_uninterrupted_model(deployment: Deployment) -> None:
    straight, interrupted = deployment.root / "straight", deployment.root / "interrupted"
    assert deployment.submit(_run_config(straight, rounds=4)).wait(timeout=600) == 0

    run = deployment.submit(_run_config(interrupted, rounds=4))
    _wait_for_round(interrupted / "rounds.jsonl", 2, run)
    deployment.kill("superlink")  # the SuperLink with its ServerApp, mid-run
    run.wait(timeout=60)
    deployment.start_superlink()
    deployment.wait_for(lambda: deployment.online() == AGENTS, "the SuperNodes to reconnect")
    assert deployment.submit(_run_config(interrupted, rounds=4)).wait(timeout=600) == 0

    log = (deployment.root / "flwr-run.log").read_text()
    assert "DP-IADMM: resuming after round" in log
    assert [r["round"] for r in read_jsonl(interrupted / "rounds.jsonl")] == [1, 2, 3, 4]
    assert [r["round"] for r in read_metrics(interrupted)] == [1, 2, 3, 4]
    final = {name: torch.load(folder / "checkpoint.pt", weights_only=True)
             for name, folder in (("straight", straight), ("interrupted", interrupted))}
    assert final["straight"]["round"] == final["interrupted"]["round"] == 4
    assert torch.equal(final["straight"]["w"]["weight"], final["interrupted"]["w"]["weight"])  # bit for bit
    assert torch.equal(final["straight"]["lam"]["weight"], final["interrupted"]["lam"]["weight"])
