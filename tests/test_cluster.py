"""The Flower simulation, and the reproduce grids, across the nodes of an existing multi-node Ray cluster,
for real.

The cluster is built the way an operator builds one, with Ray's own CLI: ``ray start --head``
and ``ray start --address=HEAD:PORT`` for a second node, each a raylet of its own with 1 CPU,
on the loopback addresses 127.0.0.2 and 127.0.0.3 (two IPs, so that the two nodes look like
two hosts; Ray rewrites ``--node-ip-address=127.0.0.1`` to the machine's outward address, the
other loopback addresses it keeps). ``flwr run`` with ``RAY_ADDRESS`` attaches Flower's Ray
backend to that cluster (``ray.init()`` with no address reads ``RAY_ADDRESS``). With 1 CPU per
node and ``client-resources-num-cpus=1`` Flower's actor pool has one ClientApp actor per node,
and the test shows that

- ClientApps ran on both nodes: the GCS's actor table puts Flower's ``ClientAppActor`` actors on
  the two raylets started here, and Ray's task timeline has ``ClientAppActor.run`` (one
  ClientApp call) on both node IPs;
- the result does not depend on where the agents ran: w after every round equals, bit for
  bit, that of the same configuration run by a plain ``flwr run`` on a local Ray instance.

Cleanup never uses ``ray stop``, which stops *every* Ray process on the machine (other
sessions' simulations included). Each ``ray start`` runs in a session of its own, and every
process of those sessions (GCS, raylets, agents, workers), or carrying the cluster's marker
in its environment, or naming its temp dir on its command line, is terminated, then killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from benchmarks import start_local_superlink
from tests.conftest import ROOT, free_ports, shipped_app, stop_flwr_processes

pytestmark = pytest.mark.slow

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
RAY = str(Path(sys.executable).with_name("ray"))
MARKER = "DPADMM_TEST_RAY_CLUSTER"
AGENTS = 4
RUN_CONFIG = (f"iadmm.num-agents={AGENTS} iadmm.rounds=2 iadmm.seed=3 iadmm.local-steps=2 "
              "iadmm.save-weights=true")
FEDERATION = f"num-supernodes={AGENTS} client-resources-num-cpus=1"

# A driver connected to the cluster: the alive nodes, Flower's ClientApp actors with the node each
# lived on, and the node IP of every ClientApp call. The state API (`ray list actors`) needs the
# dashboard of ray[default], which Flower's `flwr[simulation]` does not install; the GCS's actor
# table (read by ray._private.state, what `ray.util.state` would serve) keeps dead actors, and
# `ray.timeline()` (public) returns the task events the GCS collected from every worker.
QUERY = """
import json, sys
import ray
import ray._private.state
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
actors = [{"class": a["ActorClassName"], "node": a["Address"]["NodeID"], "state": a["State"]}
          for a in ray._private.state.actors().values()]
runs = [e["pid"] for e in ray.timeline() if e.get("cat") == "task::ClientAppActor.run"]
ray.shutdown()
print(json.dumps({"nodes": nodes, "actors": actors, "runs": runs}))
"""


@dataclass
class RayCluster:
    """A running cluster: its GCS address and what identifies the processes that belong to it."""

    address: str
    temp_dir: Path
    sessions: set[int]
    marker: str

    def query(self) -> dict:
        """Nodes, actors and ClientApp calls, as seen by a fresh driver (a process of its own)."""
        done = subprocess.run([sys.executable, "-c", QUERY, self.address], env=_ray_env(self.marker),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


def _ray_env(marker: str) -> dict[str, str]:
    """This environment without RAY_ADDRESS, plus the marker that names the test's cluster."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return dict(env, **{MARKER: marker}, RAY_USAGE_STATS_ENABLED="0")


def _ray_start(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """``ray start ARGS`` in a new session: the session id, which its daemons keep, and what the command
    printed if it failed ("" if it started).

    Worker ports 0: each worker and driver binds a port the kernel picks. ``ray start``'s default pool,
    10002-19999, is one per raylet: two raylets on one machine (this cluster's two, or another test's
    cluster) can hand out the same free-looking port, and the second worker to bind it aborts.
    """
    process = subprocess.Popen([RAY, "start", *args, "--num-cpus=1", "--num-gpus=0", "--disable-usage-stats",
                                "--min-worker-port=0", "--max-worker-port=0",
                                "--object-store-memory=100000000"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output, _ = process.communicate(timeout=120)
    return process.pid, "" if process.returncode == 0 else output[-3000:]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cluster_pids(cluster: RayCluster) -> list[int]:
    """Live processes of the cluster: in its sessions, with its marker, or naming its temp dir."""
    marker = f"{MARKER}={cluster.marker}".encode()
    temp = str(cluster.temp_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[0] == "Z":
            continue
        try:
            ours = (int(stat[3]) in cluster.sessions
                    or marker in (entry / "environ").read_bytes().split(b"\0")
                    or temp in (entry / "cmdline").read_bytes())
        except OSError:
            continue
        if ours:
            found.append(int(entry.name))
    return found


def _stop_cluster(cluster: RayCluster) -> list[int]:
    """Terminate, then kill, the cluster's processes; return those still alive.

    GCS and raylets shut down slowly on SIGTERM (they wait for each other), so after a few
    seconds the rest are killed; nothing of the cluster needs to survive.
    """
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        pids = _cluster_pids(cluster)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = _cluster_pids(cluster)
    return _cluster_pids(cluster)


def _start_nodes(cluster: RayCluster, ports: list[int]) -> str:
    """Start the cluster's head and second node, on 10 free ``ports`` besides the GCS's; what ``ray start``
    printed if one failed."""
    env = _ray_env(cluster.marker)
    client, dashboard, *agent_ports = ports

    def node_ports(ports: list[int]) -> list[str]:
        """Ports Ray otherwise takes from fixed defaults (two nodes on one machine would collide)."""
        names = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
                 "runtime-env-agent-port")
        return [f"--{name}={port}" for name, port in zip(names, ports, strict=True)]

    # The head's (minimal) dashboard too: on the fixed 8265 it would clash with the Ray instance of a
    # simulation that a parallel test worker starts meanwhile.
    session, failure = _ray_start(["--head", f"--node-ip-address={HEAD_IP}",
                                   f"--port={cluster.address.rsplit(':', 1)[1]}",
                                   f"--temp-dir={cluster.temp_dir / 'head'}", "--include-dashboard=false",
                                   f"--dashboard-port={dashboard}", f"--ray-client-server-port={client}",
                                   *node_ports(agent_ports[:4])], env)
    cluster.sessions.add(session)
    if failure:
        return failure
    session, failure = _ray_start([f"--address={cluster.address}", f"--node-ip-address={WORKER_IP}",
                                   f"--temp-dir={cluster.temp_dir / 'worker'}", *node_ports(agent_ports[4:])],
                                  env)
    cluster.sessions.add(session)
    return failure


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Two Ray nodes of 1 CPU each, started with ``ray start``, for the module's tests (each reads what
    its own runs left: its ClientApp actors, the nodes its cells ran on); every process stopped at the end.

    Ray gives a new raylet a fixed 30 s to register with its GCS, which a machine busy with the clusters and
    simulations of parallel tests can miss ("The current node timed out during startup"): a cluster whose
    ``ray start`` failed is stopped and started once more, anew.
    """
    failures = []
    for _ in range(2):
        # Short: Ray's Unix sockets live under the temp dir, and socket paths are limited to 107 bytes.
        temp = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
        gcs, *ports = free_ports(11)
        cluster = RayCluster(address=f"{HEAD_IP}:{gcs}", temp_dir=temp, sessions=set(), marker=temp.name)
        try:
            failures.append(_start_nodes(cluster, ports))
            if not failures[-1]:
                deadline = time.monotonic() + 60
                while sorted(cluster.query()["nodes"].values()) != [HEAD_IP, WORKER_IP]:
                    assert time.monotonic() < deadline, "the second Ray node did not join the cluster"
                    time.sleep(1)
                yield cluster
        finally:
            left = _stop_cluster(cluster)
            shutil.rmtree(temp, ignore_errors=True)
        assert left == [], f"Ray processes of the test's cluster still alive: {left}"
        if not failures[-1]:
            return
    pytest.fail("ray start failed twice:\n" + "\n---\n".join(failures))


@contextlib.contextmanager
def _flwr_home(env: dict[str, str], home: Path) -> Iterator[dict[str, str]]:
    """``env`` with FLWR_HOME=home; the SuperLink and SuperExec of that home are stopped on exit.

    Stopping them between runs matters: `flwr run` reuses a SuperLink that answers on its port
    (the fixture's private one), and that SuperLink's environment (with or without RAY_ADDRESS)
    was fixed at its start.
    """
    try:
        yield dict(env, FLWR_HOME=str(home))
    finally:
        assert stop_flwr_processes(home) == []


def _flwr_run(env: dict[str, str], out: Path) -> str:
    """The test's configuration through ``flwr run <app> --stream`` (the project's app); asserts success,
    returns its output."""
    bin_dir = Path(sys.executable).parent
    env = dict(env, PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    command = ["flwr", "run", str(shipped_app()), "--stream", "--federation-config", FEDERATION,
               "--run-config", f"{RUN_CONFIG} iadmm.out='{out}'"]
    start_local_superlink(env)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "dpadmm round 2/2: test error" in output, output[-4000:]
    return output


def test_clientapps_run_on_every_node_of_an_existing_ray_cluster(
        ray_cluster: RayCluster, flwr_env: dict[str, str], tmp_path: Path) -> None:
    before = ray_cluster.query()
    assert [a for a in before["actors"] if a["class"] == "ClientAppActor"] == []

    with _flwr_home(dict(flwr_env, RAY_ADDRESS=ray_cluster.address), tmp_path / "home-cluster") as env:
        _flwr_run(env, tmp_path / "cluster")

    seen = ray_cluster.query()
    node_ips = seen["nodes"]
    assert sorted(node_ips.values()) == [HEAD_IP, WORKER_IP]
    clientapp_actors = [a for a in seen["actors"] if a["class"] == "ClientAppActor"]
    # One actor per node (1 CPU each, 1 CPU per ClientApp), on the two raylets started here.
    assert sorted(node_ips[a["node"]] for a in clientapp_actors) == [HEAD_IP, WORKER_IP]
    assert {a["state"] for a in clientapp_actors} == {"DEAD"}  # Flower ends its actors after the run
    # Every message to a ClientApp is one ClientAppActor.run call: 4 queries and 4 x 2 trainings (12 in
    # every run seen). Workers report task events asynchronously, so the count is bounded, not matched.
    deadline = time.monotonic() + 60
    while set(seen["runs"]) != {HEAD_IP, WORKER_IP} and time.monotonic() < deadline:
        time.sleep(2)  # a worker's task events may reach the GCS after the run has ended
        seen = ray_cluster.query()
    assert set(seen["runs"]) == {HEAD_IP, WORKER_IP}
    assert len(seen["runs"]) <= AGENTS * 3

    # The same configuration on a plain local Ray instance (no RAY_ADDRESS: Ray starts one).
    local_env = {k: v for k, v in flwr_env.items() if k != "RAY_ADDRESS"}
    with _flwr_home(local_env, tmp_path / "home-local") as env:
        _flwr_run(env, tmp_path / "local")
    assert ray_cluster.query()["actors"] == seen["actors"]  # that run did not use the cluster

    cluster_w = np.load(tmp_path / "cluster" / "weights.npz")
    local_w = np.load(tmp_path / "local" / "weights.npz")
    assert cluster_w.files == local_w.files == ["round-1", "round-2"]
    for key in cluster_w.files:
        np.testing.assert_array_equal(cluster_w[key], local_w[key])  # bit for bit
    assert abs(cluster_w["round-2"]).max() > 0


def test_reproduce_grids_run_on_every_node_of_an_existing_ray_cluster(
        ray_cluster: RayCluster, tmp_path: Path, mnist_dir: Path, binary_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``dpadmm reproduce --ray-address``: each family's tiny grid runs its cells on both nodes (1 CPU each,
    so two cells at once, one per node) and writes, bit for bit but for the clocks, what a sequential run
    writes.

    ADMM sharing's and 004's sequential runs use 2 threads, the workers 1: their numbers must not depend on
    the thread count. Sharing's mnist-4v9 under paper noise is the case that tells: its noise is built from
    the parties' Gram eigenvectors, which LAPACK computes differently on 1 and 2 threads (rank-deficient
    blocks, near-equal eigenvalues) unless pinned to one (:func:`dpadmm.sharing.updates.geometry`); 004's
    grid holds a cell of each kind (private with random and fixed weights, Algorithm 2*, noisy DGD, the exact
    x-step, Algorithm 2, plain DGD). (002's tall products may end a last digit apart on other thread counts,
    and 003's are run as its cells run: both with 1 thread, :class:`dpadmm.runs.grid.GridOptions`.)"""
    from dpadmm.decentral import reproduce as r004
    from dpadmm.iadmm import reproduce as r003
    from dpadmm.linadmm import reproduce as r002
    from dpadmm.runs.grid import GridOptions, numbers
    from dpadmm.sharing import reproduce as r001

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    grids = {
        "003": (r003, r003.GridConfig(datasets=("mnist",), algorithms=("iadmm", "objpm"), eps=(0.5, 1.0),
                                      seeds=2, rounds=4, eval_every=2, mnist_dir=str(mnist_dir),
                                      iadmm_steps=(1,))),
        "002": (r002, r002.Grid(data_dir=str(binary_dir), datasets=("ijcnn1",), eps=(0.05,), rounds=(3,),
                                seeds=2, optimum_rounds=20)),
        "001": (r001, r001.Grid(data_dir=str(binary_dir), datasets=("a9a",), epochs=2, sigmas=(1.0,),
                                eps=(1.0,), seeds=2, rates=(1.0,), rhos=(2.0,))),
        "001 mnist-4v9": (r001, r001.Grid(data_dir=str(mnist_dir.parent), datasets=("mnist-4v9",), epochs=2,
                                          sigmas=(1.0,), eps=(1.0,), seeds=2, rates=(1.0,), rhos=(1.0, 2.0))),
        "004": (r004, r004.Grid(data_dir=str(binary_dir / "adult"), figures=("2", "C", "D-1"), seeds=2,
                                rounds=4)),
    }
    for paper, (module, grid) in grids.items():
        logged: list[str] = []
        here, there = tmp_path / paper / "sequential", tmp_path / paper / "cluster"
        threads = 2 if paper.startswith(("001", "004")) else 1
        module.run_grid(dataclasses.replace(grid, out=str(here)),
                        GridOptions(threads=threads, progress=False), log=lambda _: None)
        module.run_grid(dataclasses.replace(grid, out=str(there)),
                        GridOptions(ray_address=ray_cluster.address, progress=False), log=logged.append)
        started = (re.search(r"started on .*\(Ray node ([\d.]+)\)", line) for line in logged)
        nodes = {m.group(1) for m in started if m}
        assert nodes == {HEAD_IP, WORKER_IP}, (paper, logged)
        assert numbers(there) == numbers(here), paper
