"""benchmarks.suite_cpu: a test is charged its own CPU and that of the processes it starts, and nothing of
another pytest's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import suite_cpu

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"


@pytest.mark.parametrize(("argv", "kind"), [
    ([sys.executable, "-m", "dpadmm.cli", "deploy", "superlink"], "dpadmm.cli deploy"),
    (["/venv/bin/python3.11", "/venv/bin/flwr", "run", "app", "--stream"], "flwr run"),
    (["/venv/bin/python3.11", "-u", "/ray/_private/log_monitor.py", "--session-dir=x"], "log_monitor.py"),
    (["python", "-c", "print(1)"], "python -c"),
    (["/venv/bin/python3.11", "/ray/workers/setup_worker.py", "/ray/workers/default_worker.py", "--x=1"],
     "setup_worker.py default_worker.py"),
    (["/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=x"], "raylet"),
    (["ray::ClientAppActor.run"], "ray::ClientAppActor.run"),
])
def test_a_process_is_named_by_what_it_runs(argv: list[str], kind: str) -> None:
    assert suite_cpu.kind_of("\0".join(argv).encode() + b"\0") == kind


@pytest.mark.slow  # 5 s
def test_a_test_is_charged_the_processes_it_starts(tmp_path: Path) -> None:
    """An inner pytest run whose one test waits on a child that computes 1.5 s: the child's CPU is the test's,
    the worker's own is small; a process of this (outer) pytest computing meanwhile is charged to no test."""
    spin = SPIN.format(seconds=1.5)
    inner = tmp_path / "test_inner.py"
    inner.write_text(f"import subprocess, sys\n\ndef test_spins():\n"
                     f"    subprocess.run([sys.executable, '-c', {spin!r}], check=True)\n")
    outsider = subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=3)])
    try:
        out = tmp_path / "cpu.json"
        assert suite_cpu.main(["--json", str(out), "--top", "5", "--",
                               "-q", "-n", "0", "-p", "no:cacheprovider", str(inner)]) == 0
    finally:
        outsider.wait(timeout=60)
    tests = json.loads(out.read_text())["tests"]
    (name,) = tests
    assert name.endswith("test_inner.py::test_spins")
    assert 1.1 < tests[name]["processes"]["python -c"] < 1.8, tests  # its last look: at most 0.25 s old
    assert tests[name]["own"] < 1.0 and tests[name]["wall"] >= 1.4, tests
