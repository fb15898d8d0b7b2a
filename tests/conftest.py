"""Shared fixtures: real data from ../shared/data, and Flower homes that clean up after themselves."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real MNIST IDX files of ../shared/data/mnist (skip when absent)."""
    path = SHARED_DATA / "mnist"
    if not (path / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"real MNIST files not found in {path}")
    return path


@pytest.fixture(scope="session")
def femnist_dir() -> Path:
    """The real LEAF FEMNIST samples of ../shared/data/femnist (skip when absent)."""
    path = SHARED_DATA / "femnist"
    if not (path / "leaf-sample-a" / "train").is_dir():
        pytest.skip(f"real FEMNIST LEAF samples not found in {path}")
    return path


@pytest.fixture(scope="session")
def binary_dir() -> Path:
    """../shared/data, which holds paper 002's binary data sets one per folder (skip when absent)."""
    if not (SHARED_DATA / "a9a" / "a9a.gz").exists():
        pytest.skip(f"the LIBSVM data sets were not found in {SHARED_DATA}")
    return SHARED_DATA


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


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that nothing listens on now, on any interface (the sockets are
    held together while the kernel picks, so the ports differ)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def flwr_run(env: dict[str, str], run_config: str, supernodes: int | None = None, app: Path = ROOT,
             superlink: str | None = None, timeout: float = 600, federation: tuple[str, ...] = ()) -> str:
    """``flwr run <app> [<superlink>] --stream``; asserts exit code 0 and returns stdout + stderr.

    ``supernodes`` and ``federation`` (more ``key=value`` items) form ``--federation-config``.
    """
    command = ["flwr", "run", str(app), *([superlink] if superlink else []), "--stream", "--run-config",
               run_config]
    items = ([f"num-supernodes={supernodes}"] if supernodes is not None else []) + list(federation)
    if items:
        command += ["--federation-config", " ".join(items)]
    bin_dir = Path(env.get("VIRTUAL_ENV", "")) / "bin"
    env = dict(env, PATH=f"{bin_dir}:{env['PATH']}") if bin_dir.exists() else env
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def toml_value(value: object) -> str:
    """A Python value as a TOML value (for --run-config and generated pyproject files)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def flower_app(tmp_path: Path, client_module: str) -> Path:
    """A Flower app folder whose ServerApp is ours and whose ClientApp is ``tests/<client_module>.py`` (a real
    client with some replies spoiled), with this project's whole run config (every family's keys)."""
    app = tmp_path / "test-app"
    app.mkdir()
    shutil.copy(ROOT / "tests" / f"{client_module}.py", app / f"{client_module}.py")
    text = (ROOT / "pyproject.toml").read_text()
    config = text[text.index("[tool.flwr.app.config]"):text.index("\n####")]
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

{config}""")
    return app
