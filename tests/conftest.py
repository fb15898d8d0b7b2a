"""Shared fixtures: real data from ../shared/data, Flower homes that clean up after themselves, and a
loopback deployment (a TLS SuperLink and SuperNodes started with `dpadmm deploy`) for the deployment tests."""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest
from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from benchmarks import start_local_superlink
from dpadmm.data.mnist import MNIST_FILES
from dpadmm.families import DEFAULT, family_of
from dpadmm.privacy.device import POLICY_FILE, Policy

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# Set by .ci/run where ../shared/data is beside the project: there a test that skips for want of data would
# hide a regression, so it fails instead.
REQUIRE_DATA = os.environ.get("DPADMM_REQUIRE_DATA") == "1"


def words(text: str) -> str:
    """``text`` with its line breaks and runs of spaces made single spaces: a page's sentence, wrapped
    anywhere, is searched as one line."""
    return " ".join(text.split())


def missing_data(reason: str) -> NoReturn:
    """Skip a test whose data this machine does not have (fail it under ``DPADMM_REQUIRE_DATA=1``)."""
    if REQUIRE_DATA:
        pytest.fail(f"{reason} (DPADMM_REQUIRE_DATA=1: the data must be here)")
    pytest.skip(reason)


@functools.cache
def _fetched(name: str) -> bool:
    """Whether every file of data set ``name`` is in this machine's cache, after fetching the missing ones
    from its public sources (once per test process; False offline, or for a set that a person must fetch)."""
    from dpadmm.data.download import DownloadError, dataset_cache_dir, fetch, missing_files

    if not missing_files(name, dataset_cache_dir(name)):
        return True
    try:
        fetch(name, progress=False, timeout=30)
    except DownloadError:
        return False
    return True


def data_root(*wanted: tuple[str, str]) -> Path:
    """A folder laid out as ../shared/data that holds, for each (data set, path) of ``wanted``, that path:
    ../shared/data itself when it does, else dpadmm's cache (``dpadmm data fetch``'s folder, filled from
    the public sources when this machine reaches them). Otherwise the test skips, naming the command that
    gets the data: a new user's clone has no ../shared."""
    if all((SHARED_DATA / path).exists() for _, path in wanted):
        return SHARED_DATA
    from dpadmm.data.download import cache_dir

    missing = list(dict.fromkeys(name for name, _ in wanted if not _fetched(name)))
    if missing:
        missing_data(f"needs the data set(s) {', '.join(missing)}, in neither ../shared/data nor the cache "
                     f"{cache_dir()}, and not downloadable here: `dpadmm data fetch {' '.join(missing)}` "
                     "gets them")
    return cache_dir()


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel run, OpenMP threads that sleep while they wait for work (``OMP_WAIT_POLICY=PASSIVE``).

    The pytest-xdist workers can outnumber the cores (two per core in the whole suite), and beside them run
    the Flower and Ray processes they start. torch's OpenMP threads spin while they wait by default, taking
    the cores from the threads that have work: a CPU-bound test took three times longer, and the fast tests
    together three times the CPU time. The workers and every process they start inherit the setting (set
    here, in the process that starts the workers); the thread count, and so every number, stays as in a
    serial run.
    """
    if getattr(config.option, "numprocesses", None):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml's addopts): one pytest-xdist worker per core for ``-m "not slow"``, two
    per core (at most 8) for a selection with the slow tests.

    The slow tests mostly wait on Flower's and Ray's timers, so more workers than cores keep the cores busy;
    the quick ones compute, and each extra worker only adds its own start (importing and collecting the
    suite, about 9 s of CPU). On 2 cores: the whole suite on 4 workers, "not slow" on 2 (149 s; 169 s on 3).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quick = "not slow" in (config.option.markexpr or "")
    return min(cores if quick else 2 * cores, 8)


# Modules whose tests share one costly module fixture (a loopback deployment: a SuperLink and its SuperNodes;
# a two-node Ray cluster): in a parallel run all their tests go to one worker, which starts it once.
ONE_WORKER_MODULES = frozenset({"tests/test_deployment.py", "tests/test_sharing_deployment.py",
                                "tests/test_cluster.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the slow tests first, each followed by a quick one.

    The workers are handed tests in this order (:func:`pytest_xdist_make_scheduler`), each worker holding
    the test it runs and the next one or two. The slow tests mostly wait on Flower's and Ray's timers
    (SuperNodes poll every 3 s, a killed one is let back in after a minute) and take no shorter when they
    start last, so they start first, and a quick test, not another slow one, waits behind each. Every worker
    sorts the same collection the same way, as pytest-xdist requires; a serial run keeps pytest's order.
    """
    if not hasattr(config, "workerinput"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    quick = [item for item in items if not item.get_closest_marker("slow")]
    items[:] = [item for pair in itertools.zip_longest(slow, quick) for item in pair if item is not None]


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist load`` (pyproject.toml's addopts), but each of :data:`ONE_WORKER_MODULES` on one worker.

    A module fixture is set up once per worker that runs one of the module's tests: spread over the workers,
    a deployment's tests started a SuperLink and SuperNodes three times. pytest-xdist 3.8's own
    ``--dist loadgroup`` does nothing under pytest 9.2 (it marks a group by rewriting ``item._nodeid``, which
    pytest 9.2 no longer reads), so the scheduler is pytest-xdist's scope scheduler with one scope per listed
    module and one per test elsewhere. It hands out the larger scopes first (the listed modules, all slow),
    then the tests in the workers' order (:func:`pytest_collection_modifyitems`).
    """
    if config.getvalue("dist") != "load":
        return None
    missing = sorted(m for m in ONE_WORKER_MODULES if not (ROOT / m).is_file())
    assert not missing, f"ONE_WORKER_MODULES names no such test module: {missing}"
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return OneWorkerModules(config, log)


# The other papers' data sets one per folder, as the tests read them (bio_train has no public download).
BINARY_SETS = (("a9a", "a9a/a9a.t.gz"), ("a8a", "a8a/a8a.t.gz"), ("ijcnn1", "ijcnn1/ijcnn1.t.gz"),
               ("bio_train", "bio_train/bio_train.dat.gz"), ("adult", "adult/adult.test.gz"))


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The folder of the four real MNIST IDX files (.gz): ../shared/data/mnist, or the cache's."""
    return data_root(*(("mnist", f"mnist/{name}.gz") for name in MNIST_FILES)) / "mnist"


@pytest.fixture(scope="session")
def femnist_dir() -> Path:
    """A folder with the real LEAF sample ``leaf-sample-a``: ../shared/data/femnist, or the cache's."""
    return data_root(("femnist", "femnist/leaf-sample-a/train")) / "femnist"


@pytest.fixture(scope="session")
def binary_dir() -> Path:
    """A folder holding the other papers' data sets one per folder (a9a, a8a, ijcnn1, bio_train, adult):
    ../shared/data, or the cache."""
    return data_root(*BINARY_SETS)


def flat_app_config() -> dict[str, object]:
    """pyproject.toml's run config as Flower flattens it (nested tables become dotted keys)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat: dict[str, object] = {}
    for name, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    return flat


def _pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has name=value (Linux /proc)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class NoNodes(Grid):
    """A Flower grid with no node and no run, for a strategy's unit tests: a subclass says how its nodes
    answer (``send_and_receive``, ``get_node_ids``)."""

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        return []

    def create_message(self, *args: object, **kwargs: object) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return []

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return []

    @property
    def run(self) -> None:
        return None

    def set_run(self, run_id: int) -> None:
        return None


@pytest.fixture
def server_process() -> Iterator[None]:
    """The process identity a ServerApp's runtime sets before it creates messages (as flwr's own), for tests
    that build Flower messages in this process."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = None  # type: ignore[assignment]


@pytest.fixture
def flwr_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for `flwr` commands with a private FLWR_HOME; stops every process it started.

    `flwr run` leaves a SuperLink and a SuperExec running in sessions of their own; they
    are found by the FLWR_HOME in their environment and terminated (then killed).
    """
    home = tmp_path / "flwr-home"
    # Runtime dependency installation would `uv sync` the app's requirements into a new
    # environment (a multi-GB CUDA torch build); the app runs in this environment instead.
    # Private ports for the local SuperLink `flwr run` starts: on Flower's fixed ports (39091,
    # 39093) a run would reuse a SuperLink that another test or session left running, with
    # that one's FLWR_HOME and environment.
    superlink_port, control_port = free_ports(2)
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(superlink_port),
               FLWR_LOCAL_CONTROL_API_PORT=str(control_port))
    yield env
    assert stop_flwr_processes(home) == []


def stop_flwr_processes(home: Path) -> list[int]:
    """Terminate, then kill, every process run with FLWR_HOME=home; return those still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids_with_env("FLWR_HOME", str(home))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _is_zombie(p)]
            time.sleep(0.2)
    return [p for p in _pids_with_env("FLWR_HOME", str(home)) if not _is_zombie(p)]


# Above the fixed ports of Flower (8000, 909x) and Ray (6379, 8265, 10001), and above Ray's worker ports
# (10002-19999 by default: Ray's workers take them, and `ray start` refuses them for its other components).
_PORTS_FROM = 20000
_random = random.Random()  # its own generator: a test that seeds the module's is not disturbed


def _ephemeral_ports() -> range:
    """The ports the kernel hands out for bind(0) and outgoing connections."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that nothing listens on now, on any interface.

    The server that takes a port binds it seconds later, in another process. A port of the kernel's
    ephemeral range could be handed meanwhile to any process's outgoing connection or bind(0) (the Ray
    instances and Flower processes of parallel test workers make many), so the ports come from outside that
    range, from a random start, and each pytest-xdist worker draws from its own residue class modulo the
    number of workers, so that two workers never pick the same port.
    """
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    ephemeral = _ephemeral_ports()
    candidates = [p for p in range(_PORTS_FROM + worker, 65536, workers) if p not in ephemeral]
    start = _random.randrange(len(candidates))
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for port in candidates[start:] + candidates[:start]:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"fewer than {count} free TCP ports from {_PORTS_FROM} outside {ephemeral}")


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@functools.cache
def shipped_app() -> Path:
    """The project's Flower app as Flower ships it: the FAB that ``flwr run .`` builds here, unpacked.

    ``flwr run <folder>`` walks the whole folder before it picks the FAB's files, the virtual environment
    inside the project included (50,000 files: 3 s of CPU per run). The tests run the unpacked FAB instead,
    which holds the same files and builds the same FAB byte for byte (``tests/test_server_app.py`` checks
    it), and so the same app, from a folder of a few hundred files. One per test process, removed at its exit.
    """
    from flwr.cli.build import build_fab_from_disk

    folder = Path(tempfile.mkdtemp(prefix="dpadmm-app-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))) as fab:
        fab.extractall(folder)
    shutil.rmtree(folder / ".info")  # the FAB's manifest: Flower writes it, it is not an app file
    return folder


def flwr_run(env: dict[str, str], run_config: str, supernodes: int | None = None, app: Path | None = None,
             superlink: str | None = None, timeout: float = 600, federation: tuple[str, ...] = ()) -> str:
    """``flwr run <app> [<superlink>] --stream``; asserts exit code 0 and returns stdout + stderr.

    ``app`` defaults to the project's app (:func:`shipped_app`); the command runs in the project's folder.

    ``supernodes`` and ``federation`` (more ``key=value`` items) form ``--federation-config``. Without
    ``superlink`` the run's local SuperLink is started first (:func:`benchmarks.start_local_superlink`): the
    fixed 15 s Flower gives the one it starts is missed on a machine busy with other tests.
    """
    command = ["flwr", "run", str(app or shipped_app()), *([superlink] if superlink else []), "--stream",
               "--run-config", run_config]
    items = ([f"num-supernodes={supernodes}"] if supernodes is not None else []) + list(federation)
    if items:
        command += ["--federation-config", " ".join(items)]
    bin_dir = Path(env.get("VIRTUAL_ENV", "")) / "bin"
    env = dict(env, PATH=f"{bin_dir}:{env['PATH']}") if bin_dir.exists() else env
    if superlink is None:
        start_local_superlink(env)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


def unexplained_warnings(output: str) -> list[str]:
    """The warning and error lines of a Flower run's ``output`` that are neither dpadmm's own nor among the
    messages the README lists as harmless (each bullet of that list opens with the message in backticks)."""
    readme = (ROOT / "README.md").read_text()
    listed = readme.split("are harmless:", 1)[1].split("\n\n", 2)[1]
    known = [re.sub(r"\s+", " ", m).removeprefix("WARNING : ").removesuffix(" ...")
             for m in re.findall(r"^- `([^`]+)`", listed, re.MULTILINE)]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    flagged = [re.sub(r"\s+", " ", line) for line in plain.splitlines()
               if re.search(r"WARNING|ERROR|Warning\b|Error\b", line)]
    return [line for line in flagged if "dpadmm" not in line and not any(k in line for k in known)]


def last_run_status(env: dict[str, str], *connection: str) -> tuple[str, str]:
    """(status, status details) of the newest run that ``flwr ls`` lists, on the local SuperLink of ``env``
    or on ``connection``: `flwr run --stream` exits 0 whatever the run's outcome, the status says it."""
    flwr = Path(sys.executable).parent / "flwr"
    listed = subprocess.run([str(flwr), "ls", *connection, "--format", "json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    run = max(json.loads(listed.stdout)["runs"], key=lambda r: r["pending-at"])
    return run["status"], run["status-details"]


def toml_value(value: object) -> str:
    """A Python value as a TOML value (for --run-config and generated pyproject files)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def run_config_of(config: Any) -> str:
    """--run-config that gives every key of any family's ``config``: `algorithm` and the family's table,
    <table>.<key> (DP-IADMM's: ``preset='papers'`` and its table, iadmm-papers.<key>, as the papers' commands
    do; for the main preset's table, give the keys that differ from the main job as iadmm.<key>)."""
    family = family_of(config.algorithm)
    table, preset = (("iadmm-papers", "preset='papers' ") if family is DEFAULT else (family.name, ""))
    keys = {k: v for k, v in config.to_mapping().items() if k != "algorithm"}
    return f"algorithm='{config.algorithm}' {preset}" + " ".join(f"{table}.{k}={toml_value(v)}"
                                                              for k, v in keys.items())


def flower_app(tmp_path: Path, client_module: str) -> Path:
    """A Flower app folder whose ServerApp is ours and whose ClientApp is ``tests/<client_module>.py`` (a real
    client with some replies spoiled), with this project's whole run config (every family's keys)."""
    app = tmp_path / "test-app"
    app.mkdir()
    shutil.copy(ROOT / "tests" / f"{client_module}.py", app / f"{client_module}.py")
    # every family's keys, as dotted keys of the one table (TOML nests them as pyproject.toml does)
    keys = "\n".join(f"{k} = {toml_value(v)}" for k, v in flat_app_config().items())
    (app / "pyproject.toml").write_text(f"""[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "testapp"
version = "0.1.0"
dependencies = []

[tool.flwr.app]
publisher = "dpadmm-tests"

[tool.flwr.app.components]
serverapp = "server.server_app:app"
clientapp = "{client_module}:app"

[tool.flwr.app.config]
{keys}
""")
    return app


# A test deployment's devices accept runs of the papers' settings (more than the defaults' (8, 1e-5) per run,
# one sample replaced, as 001's and 004's guarantees are stated) and many runs on one state folder; the
# defaults are attacked in test_runtime.py and test_device.py
TEST_POLICY = Policy(max_run_epsilon=1e3, max_run_delta=1e-2, lifetime_epsilon=1e6, lifetime_delta=1.0,
                     neighbouring="replace-one")


def replace_one_device(folder: Path) -> Path:
    """``folder``, made the state folder of a device whose operator holds every run to one sample replaced
    (the policy's ``neighbouring``; its defaults otherwise): the relation of 001's and 004's guarantees."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / POLICY_FILE).write_text(Policy(neighbouring="replace-one").to_toml())
    return folder


class Deployment:
    """The processes of one loopback deployment, all with FLWR_HOME=<root>/flwr-home: a SuperLink with TLS and
    SuperNode authentication on, and up to ``nodes`` SuperNodes, every one started with the documented
    `dpadmm deploy` commands (``tests/test_deployment.py``, ``tests/test_sharing_deployment.py``)."""

    connection = "dpadmm-test"

    def __init__(self, root: Path, nodes: int, policy: Policy | None = None) -> None:
        self.root = root
        self.home = root / "flwr-home"
        bin_dir = str(Path(sys.executable).parent)
        # Each node's secret and record of answered rounds (dpadmm.privacy.randomness) in this deployment's
        # folder, as a device keeps them in its own state folder; the server's likewise.
        self.env = dict(os.environ, FLWR_HOME=str(self.home), FLWR_TELEMETRY_ENABLED="0",
                        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        DPADMM_NODE_STATE=str(root / "node-state"),
                        DPADMM_SERVER_STATE=str(root / "server-state"),
                        PATH=f"{bin_dir}:{os.environ['PATH']}")
        self.port, *self.node_ports = free_ports(nodes + 1)
        # The devices' policy, their operator's (dpadmm.privacy.device): by default TEST_POLICY
        (root / "node-state").mkdir(parents=True, exist_ok=True)
        (root / "node-state" / POLICY_FILE).write_text((policy or TEST_POLICY).to_toml())
        self.node_configs: dict[int, str] = {}  # SuperNode i's node config, kept for its restarts
        self.total = 0  # I, the agents' sample count (mnist_agents)
        self.processes: dict[str, subprocess.Popen] = {}

    def dpadmm(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "dpadmm.cli", *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    def prepare(self, names: Sequence[str]) -> None:
        """A fresh CA and the SuperLink's certificate, one key pair per name, and the flwr connection."""
        self.dpadmm("deploy", "certs", "--out", str(self.root / "certs"), "--hosts", "127.0.0.1,localhost")
        self.dpadmm("deploy", "keys", "--out", str(self.root / "keys"), "--names", ",".join(names))
        self.dpadmm("deploy", "connection", "--name", self.connection, "--address", f"127.0.0.1:{self.port}",
                    "--ca-cert", str(self.root / "certs" / "ca.crt"), "--flwr-home", str(self.home))

    def register(self, name: str) -> None:
        """Register the public key ``name``.pub with the SuperLink (the operator's step)."""
        key = str(self.root / "keys" / f"{name}.pub")
        registered = self.flwr("supernode", "register", key, self.connection)
        assert "registered successfully" in registered.stdout, registered.stdout + registered.stderr

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

    def stop(self, name: str) -> None:
        """SIGTERM a process (a shutdown: a SuperNode tells the SuperLink it leaves), then its session."""
        process = self.processes.pop(name)
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def start_superlink(self, database: bool = True) -> None:
        """The SuperLink; with ``database``, its state in <root>/superlink.db (a restarted one resumes), else
        in its memory (`dpadmm deploy superlink`'s default)."""
        where = ["--database", str(self.root / "superlink.db")] if database else []
        self.start("superlink", "superlink", "--certs", str(self.root / "certs"), "--host", "127.0.0.1",
                   "--port", str(self.port), *where)
        self.wait_for(lambda: self.flwr("supernode", "list", self.connection).returncode == 0,
                      "the SuperLink", every=3)

    def start_supernode(self, i: int, node_config: str | None = None,
                        key: str | None = None) -> subprocess.Popen:
        """SuperNode i with ``node_config`` (default: the one it last had) and the key ``key`` (node-<i>)."""
        if node_config is not None:
            self.node_configs[i] = node_config
        return self.start(f"supernode-{i}", "supernode", "--superlink", f"127.0.0.1:{self.port}",
                          "--node-config", self.node_configs[i],
                          "--ca-cert", str(self.root / "certs" / "ca.crt"),
                          "--key", str(self.root / "keys" / (key or f"node-{i}")),
                          "--port", str(self.node_ports[i]))

    def restart_supernode(self, i: int, timeout: float = 240) -> threading.Thread:
        """Start SuperNode i again until the SuperLink accepts it, as systemd's Restart=on-failure would.

        The SuperLink refuses a node id it still believes online: a killed SuperNode's
        successor is refused (exit code 305) until two missed heartbeats (up to a minute). A try ends
        when the SuperNode says its node id, which it logs once the SuperLink has activated it, or when
        it exits: under load a refused SuperNode may take longer than any fixed wait to exit.
        """
        log = self.root / f"supernode-{i}.log"

        def keep_trying() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                seen = log.stat().st_size
                process = self.start_supernode(i)
                while process.poll() is None:
                    with log.open("rb") as text:
                        text.seek(seen)
                        if b"SuperNode ID:" in text.read() or time.monotonic() > deadline:
                            return  # accepted: it is running (past the deadline, stop_all ends it)
                    time.sleep(0.5)
                self.processes.pop(f"supernode-{i}", None)
                time.sleep(5)

        thread = threading.Thread(target=keep_trying, daemon=True)
        thread.start()
        return thread

    @contextlib.contextmanager
    def running(self, node_configs: Sequence[str]) -> Iterator[Deployment]:
        """The SuperLink, and SuperNode i with ``node_configs[i]`` and the key node-<i>, registered; yields
        once all are online, and stops every process at the end."""
        try:
            self.start_superlink()
            for i, node_config in enumerate(node_configs):
                self.register(f"node-{i}")
                self.start_supernode(i, node_config)
            self.wait_online(len(node_configs), f"{len(node_configs)} SuperNodes online")
            yield self
        finally:
            assert self.stop_all() == []

    def mnist_agents(self, agents: int) -> list[str]:
        """``agent-<i>.npz`` in the deployment's folder for each of ``agents`` blocks of the MNIST sample
        (uint8 pixels and labels, as a device holds them); sets :attr:`total` (I) and returns the agents'
        node configs."""
        from dpadmm.iadmm.config import papers
        from dpadmm.iadmm.federation import load_for

        dataset = load_for(papers(num_agents=agents))
        self.total = dataset.num_train
        for i, block in enumerate(dataset.partition(agents)):
            pixels = np.rint(dataset.x_train[block].numpy() * 255).astype(np.uint8)
            np.savez(self.root / f"agent-{i}.npz", x=pixels, y=dataset.y_train[block].numpy())
        return [f"partition-id={i} data-path='{self.root / f'agent-{i}.npz'}' num-samples-total={self.total}"
                for i in range(agents)]

    def online(self) -> int:
        listing = self.flwr("supernode", "list", self.connection)
        return listing.stdout.count("online")

    def submit(self, run_config: str, log_name: str = "flwr-run.log", app: Path | None = None
               ) -> subprocess.Popen:
        """`flwr run <app> <connection> --stream` (``app``, by default the project's, :func:`shipped_app`)
        with ``run_config``; its output goes to <root>/<log_name>."""
        log = open(self.root / log_name, "a")  # noqa: SIM115
        command = ["flwr", "run", str(app or shipped_app()), self.connection, "--stream", "--run-config",
                   run_config]
        return subprocess.Popen(command,
                                env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    @staticmethod
    def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120, every: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}")
            time.sleep(every)

    def wait_online(self, count: int, what: str, timeout: float = 120) -> None:
        """Wait until ``count`` SuperNodes are online. Each look is a `flwr supernode list` process (about
        a second of CPU, taken from the tests running beside this one), so it looks every 3 s."""
        self.wait_for(lambda: self.online() == count, what, timeout, every=3)

    def stop_all(self) -> list[int]:
        for name in list(self.processes):
            self.kill(name)
        return stop_flwr_processes(self.home)

