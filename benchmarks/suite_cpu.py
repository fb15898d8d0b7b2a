"""Where the test suite's CPU goes: every test's CPU, its own and that of every process it started.

On a machine with few cores the suite is bound by CPU, not by its timers: a parallel run keeps every core
busy, so its time is its total CPU over the cores, and a test costs what it and the processes it starts
(Flower's CLI, SuperLink, SuperExec, ``flwr-simulation``, Ray's services and actors, SuperNodes, our
device runtimes) compute, wherever they run. pytest's ``--durations`` gives wall time, which a test that
waits on a timer inflates and a test whose processes compute while the worker waits hides.

How it counts:

- a test's own CPU: the pytest worker's CPU time (all its threads) from the start of the test's setup to
  the end of its teardown (a pytest plugin in each worker, this module);
- the CPU of the processes it started: pytest sets ``PYTEST_CURRENT_TEST`` in the worker's environment
  while a test runs, so every process started under it (and every process those start, Ray's workers
  included) inherits it. A thread of this script reads /proc every ``--every`` seconds and charges each
  process's user and system time to the test in its environment, or, where its environment cannot be read
  (Ray overwrites some of its processes' environment with their titles), to its parent's test. The last
  moments of a process (less than ``--every`` seconds) are not seen; the coverage line says how much of
  the machine's busy time was charged to a test.

A process started under a module or session fixture is charged to the test that started the fixture.

Usage, from the project root (the arguments after ``--`` go to pytest; without any, the whole suite as the
README runs it):

    python -m benchmarks.suite_cpu [--top 40] [--json suite-cpu.json] [--every 0.25] [-- PYTEST ARGS]

It prints the machine's busy CPU over the run, the CPU charged to tests, the tests that cost most and
the kinds of process that cost most; ``--json`` writes every test's numbers. It reads no data of its own:
the tests it runs find theirs (``tests/conftest.py``), and skip where a fresh clone lacks them. A benchmark
script, not a test: the numbers hold for the machine and the load it ran on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks import ArgumentParser, check_file
from benchmarks.deployed_round import TICK, stat_fields
from benchmarks.flower_overhead import machine, read_file

ROOT = Path(__file__).resolve().parents[1]
RECORDS = "DPADMM_SUITE_CPU_RECORDS"  # the folder the workers write their tests' own CPU to (JSON lines)
CURRENT = b"PYTEST_CURRENT_TEST="


# ----- the plugin in each pytest process -----

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Record the test's own CPU (this process, setup to teardown) and wall time."""
    folder = os.environ.get(RECORDS)
    cpu, wall = time.process_time(), time.monotonic()
    yield
    if folder:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        record = {"test": item.nodeid, "own": time.process_time() - cpu, "wall": time.monotonic() - wall}
        with open(Path(folder) / f"{worker}.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")


# ----- the processes, from /proc -----

def kind_of(cmdline: bytes) -> str:
    """A short name for what a process runs: the executable, or for Python the script or ``-m`` module
    and its first argument, a path by its last part (``flwr run``, ``dpadmm.cli deploy``,
    ``setup_worker.py default_worker.py``)."""
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    if not argv:
        return "?"
    name = Path(argv[0].split()[0]).name
    if not name.startswith("python") or len(argv) < 2:
        return name
    rest = [a for a in argv[1:] if a not in ("-u", "-B", "-E", "-s")]
    if not rest:
        return name
    if rest[0] == "-m" and len(rest) > 1:
        return " ".join([rest[1], *rest[2:3]])
    if rest[0] == "-c":
        return "python -c"
    script = Path(rest[0]).name
    first = Path(rest[1]).name if len(rest) > 1 and not rest[1].startswith("-") else ""
    return f"{script} {first}".strip()


def _test_in(pid: int, token: bytes) -> str | None:
    """The test in a process's environment (without pytest's phase) if that environment holds ``token``
    (this run's, not another pytest's); "" where it cannot be read or is no environment (Ray writes its
    processes' titles over it): the caller charges the parent's test."""
    entries = (read_file(f"/proc/{pid}/environ") or b"").split(b"\0")
    if token not in entries:
        return "" if not any(b"=" in e for e in entries) else None
    for entry in entries:
        if entry.startswith(CURRENT):
            return entry[len(CURRENT):].decode(errors="replace").rsplit(" (", 1)[0]
    return None


@dataclass
class Process:
    test: str
    kind: str
    cpu: float = 0.0


@dataclass
class Sampler:
    """Reads /proc every ``every`` seconds in a thread and charges each process's CPU to its test."""

    token: bytes
    every: float = 0.25
    seen: dict[tuple[int, bytes], Process] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def look(self) -> None:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                fields = stat_fields(int(entry))
                if fields is not None:
                    stats[int(entry)] = fields
        by_pid = {pid: p for (pid, _), p in self.seen.items()}
        for pid, fields in sorted(stats.items()):  # parents (lower pids, mostly) before their children
            key = (pid, fields[19])  # the start time tells a reused pid from the process that had it
            process = self.seen.get(key)
            if process is None:
                test = _test_in(pid, self.token)
                parent = by_pid.get(int(fields[1]))
                if test == "" and parent is not None:
                    test = parent.test
                if not test:
                    continue
                process = self.seen[key] = Process(test, kind_of(read_file(f"/proc/{pid}/cmdline") or b""))
                by_pid[pid] = process
            process.cpu = (int(fields[11]) + int(fields[12])) / TICK

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(self.every)
        self.look()

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def busy_seconds() -> float:
    """The machine's busy CPU time since boot (all cores: user, nice, system, irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK  # less idle and iowait


# ----- the report -----

def per_test(records: Path, processes: list[Process]) -> dict[str, dict[str, Any]]:
    """Every test's own CPU, wall time, and its processes' CPU by kind."""
    tests: dict[str, dict[str, Any]] = defaultdict(lambda: {"own": 0.0, "wall": 0.0,
                                                            "processes": defaultdict(float)})
    for path in sorted(records.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            tests[record["test"]]["own"] += record["own"]
            tests[record["test"]]["wall"] += record["wall"]
    for process in processes:
        tests[process.test]["processes"][process.kind] += process.cpu
    for numbers in tests.values():
        numbers["total"] = numbers["own"] + sum(numbers["processes"].values())
    return tests


def described(host: dict[str, Any]) -> str:
    """The machine in one line: cores, memory, versions and the load when the run started."""
    memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return (f"{host['cpus_usable']} cores ({host['processor'] or host['machine']}), {memory:.1f} GiB, Python "
            f"{host['python']}, flwr {host['flwr']}, ray {host['ray']}, torch {host['torch']}; load "
            f"{host['loadavg'][0]:.2f} at the start")


def report(tests: dict[str, dict[str, Any]], busy: float, wall: float, top: int, host: dict[str, Any]) -> str:
    charged = sum(t["total"] for t in tests.values())
    own = sum(t["own"] for t in tests.values())
    kinds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for numbers in tests.values():
        for kind, cpu in numbers["processes"].items():
            kinds[kind] += cpu
            counts[kind] += 1
    lines = [f"{described(host)}; pytest ran {wall:.0f} s",
             f"machine busy {busy:.0f} CPU-s ({busy / wall:.2f} cores on average); charged to {len(tests)} "
             f"tests {charged:.0f} CPU-s ({charged / busy:.0%}): their own {own:.0f}, the processes they "
             f"started {charged - own:.0f}", "",
             f"the {top} tests that cost most (CPU-s; wall s; own; the processes' largest kinds):"]
    for name, numbers in sorted(tests.items(), key=lambda t: -t[1]["total"])[:top]:
        biggest = sorted(numbers["processes"].items(), key=lambda k: -k[1])[:4]
        lines.append(f"{numbers['total']:8.1f} {numbers['wall']:7.1f} {numbers['own']:6.1f}  {name}  "
                     + ", ".join(f"{k} {v:.1f}" for k, v in biggest))
    lines += ["", "processes by kind (CPU-s; tests that started one):"]
    by_cost = sorted(kinds.items(), key=lambda k: -k[1])
    lines += [f"{cpu:8.1f} {counts[kind]:5d}  {kind}" for kind, cpu in by_cost if cpu >= 0.5]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.suite_cpu", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--top", type=int, default=40, help="tests to list (default 40)")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between looks at /proc")
    parser.add_argument("--json", type=Path, help="write every test's numbers here")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: none)")
    args = parser.parse_args(argv)
    if args.every <= 0 or args.top < 0:
        parser.error(f"--every must be > 0 (got {args.every}) and --top >= 0 (got {args.top})")
    if args.json:
        check_file(parser, "--json", args.json)
    records = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    # a pytest started from a test (as in this module's own test) would charge itself to that test
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} | {RECORDS: str(records)}
    command = [sys.executable, "-m", "pytest", "-p", "benchmarks.suite_cpu", *args.pytest_args]
    host = machine()
    busy, started = busy_seconds(), time.monotonic()
    with Sampler(f"{RECORDS}={records}".encode(), args.every) as sampler:
        code = subprocess.call(command, cwd=ROOT, env=env)
    busy, wall = busy_seconds() - busy, time.monotonic() - started
    tests = per_test(records, list(sampler.seen.values()))
    print(report(tests, busy, wall, args.top, host))
    if args.json:
        args.json.write_text(json.dumps({"machine": host, "pytest": command[3:], "exit": code,
                                         "wall": wall, "busy": busy, "tests": tests}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
