"""A deployed round against Flower's own floor: the main job and an echo app on the same loopback deployment.

One loopback deployment per node count N: a SuperLink with TLS and SuperNode authentication, N registered
SuperNodes, each with its own block of the MNIST sample (an ``.npz`` file, as a device holds its data) and
its own key. On it, one after the other:

- ``ours``: the main job (``flwr run <app> <connection>``: DP-IADMM ObjPM, budget-first, (8, 1e-5)-DP per
  agent for the whole run, float64 logistic regression) on SuperNodes started with ``dpadmm deploy
  supernode``: ``flower-supernode --isolation process`` and the device's own runtime (``dpadmm node
  serve``), one warm process per device that answers every message in a thread;
- ``echo``: Flower's ``FedAvg`` (``benchmarks/fedavg_app`` in ``bench-mode = "echo"``) sending the same
  three arrays per node (784 x 10, float64) and receiving two back, on the same SuperNodes (the same keys,
  node configs and SuperLink) started as Flower starts them by default (``--isolation subprocess``: a
  ``flwr-clientapp`` process per message, whose app imports neither torch nor dpadmm). Flower's floor for
  these messages: its polling (a SuperNode without a message sleeps 3 s) and its process per message.

With ``--load 1`` a process that only spins (``python -c 'while True: pass'``) holds one core for the whole
of both runs: another job on the machine.

Per run (rounds 2..R; round 1 carries the start: the query, the data read, the calibration):

- ``s/round``: from one round's end to the next (ours: when rounds.jsonl gets the round's line, polled
  every 0.1 s; echo: FedAvg's ``evaluate_fn`` at each round's end), the whole loop of the server;
- ``node CPU/round``: the CPU seconds of every process of every node (the SuperNode, its runtime or its
  SuperExec and ``flwr-clientapp`` processes), from the moment the nodes are online to the run's end,
  divided by N and by R: per message, idle polling included;
- ``node RSS``: the peak of a node's processes' summed RSS, the largest over the nodes, and their PSS
  (shared pages, such as torch's libraries mapped by every node's runtime, split among the processes that
  map them): PSS is what one more node costs the host;
- ``per-message process``: the peak RSS of a process started for one message (``flwr-clientapp``; ours
  starts none).

Usage, from the project root (every process is stopped at the end, also on errors and Ctrl-C):

    python -m benchmarks.deployed_round [--nodes 2,10] [--rounds 8] [--load 0,1] [--variants ours,echo]
        [--json PATH] [--keep DIR]

``--nodes 50 --variants ours --rounds 3`` is the many-devices case: 50 SuperNodes on one host, with the
memory per node and rounds per second. The devices' data are blocks of the MNIST sample embedded in dpadmm,
so no data folder is needed. A benchmark script, not a test; on a shared machine the times are not
comparable between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import ArgumentParser, check_file, check_folder, positive_float
from benchmarks.flower_overhead import LineWatcher, follow, interrupt, machine, read_file
from dpadmm.iadmm.config import main_job
from tests.conftest import TEST_POLICY, Deployment, toml_value

ROOT = Path(__file__).resolve().parents[1]
ECHO_APP = ROOT / "benchmarks" / "fedavg_app"
VARIANTS = ("ours", "echo")
TICK = os.sysconf("SC_CLK_TCK")
MEMORY_FLOOR_MIB = 2048  # no further SuperNode is started on a host with less available: the limit is found


# ----- the nodes' processes in /proc -----

def stat_fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat after the command's name (field 3 onwards), zombies included."""
    raw = read_file(f"/proc/{pid}/stat")
    return None if raw is None else raw.rsplit(b")", 1)[-1].split()


def children_of() -> dict[int, list[int]]:
    """Every process's children, from one look at /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(roots: list[int], children: dict[int, list[int]] | None = None) -> list[int]:
    """``roots`` and every process below them (in ``children``, by default /proc now)."""
    children = children_of() if children is None else children
    found: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.append(pid)
            todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU of ``pids`` and of the children they have reaped (a finished ``flwr-clientapp``
    is counted in its parent's), in seconds."""
    total = 0
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None:
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
    return total / TICK


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB; zeros when it is gone."""
    rss = pss = 0
    for line in (read_file(f"/proc/{pid}/smaps_rollup") or b"").splitlines():
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1])
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1])
    return rss, pss


def _per_message(pid: int) -> bool:
    return b"flwr-clientapp" in (read_file(f"/proc/{pid}/cmdline") or b"")


@dataclass
class NodeWatch:
    """Peaks over the polls of one run, over the nodes' process trees (kB)."""

    roots: list[int]
    node_rss_kb: int = 0  # the largest node's summed RSS, at its peak
    node_pss_kb: int = 0
    all_rss_kb: int = 0  # every node together
    all_pss_kb: int = 0
    message_rss_kb: int = 0  # the largest flwr-clientapp process
    message_processes: set[int] = field(default_factory=set)

    def poll(self) -> None:
        all_rss = all_pss = 0
        children = children_of()
        for root in self.roots:
            rss = pss = 0
            for pid in descendants([root], children):
                one_rss, one_pss = memory_kb(pid)
                rss, pss = rss + one_rss, pss + one_pss
                if _per_message(pid):
                    self.message_processes.add(pid)
                    self.message_rss_kb = max(self.message_rss_kb, one_rss)
            self.node_rss_kb, self.node_pss_kb = max(self.node_rss_kb, rss), max(self.node_pss_kb, pss)
            all_rss, all_pss = all_rss + rss, all_pss + pss
        self.all_rss_kb, self.all_pss_kb = max(self.all_rss_kb, all_rss), max(self.all_pss_kb, all_pss)


# ----- one run -----

@dataclass
class Result:
    """One variant's run on N nodes under one load."""

    variant: str
    nodes: int
    load: int
    rounds: int
    cycle: list[float] = field(default_factory=list)
    cpu_per_round: float = 0.0  # per node
    node_rss_mib: float = 0.0
    node_pss_mib: float = 0.0
    all_pss_mib: float = 0.0
    message_rss_mib: float = 0.0
    message_processes: int = 0
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)  # at the run's end
    mem_available_mib: float = 0.0  # the host's, at the run's end
    wall: float = 0.0
    error: str = ""

    def seconds_per_round(self) -> float | None:
        timed = self.cycle[1:]
        return statistics.fmean(timed) if timed else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds_per_round": self.seconds_per_round()}


def mem_available_mib() -> float:
    for line in (read_file("/proc/meminfo") or b"").splitlines():
        if line.startswith(b"MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Bench:
    """The loopback deployment of N nodes, and the runs on it."""

    def __init__(self, root: Path, nodes: int, rounds: int, timeout: float, node_timeout: float) -> None:
        # The devices' policy: the tests' generous budgets, and the main job's neighbouring relation (the
        # tests' own policy holds runs to replace-one, which refuses the main job's add-remove statement)
        policy = dataclasses.replace(TEST_POLICY, neighbouring=main_job().neighbouring)
        self.d = Deployment(root, nodes=nodes, policy=policy)
        self.nodes, self.rounds, self.timeout, self.node_timeout = nodes, rounds, timeout, node_timeout
        self.node_configs = self.d.mnist_agents(nodes)
        self.d.prepare([f"node-{i}" for i in range(nodes)])
        # its state in memory, as `dpadmm deploy superlink` keeps it by default: with a database file, 50
        # SuperNodes on 2 cores met "database is locked", and a SuperNode whose reply met it dropped the reply
        self.d.start_superlink(database=False)
        for i in range(nodes):
            self.d.register(f"node-{i}")

    def _start_nodes(self, variant: str) -> list[int]:
        """The N SuperNodes as ``variant`` runs them; returns their root pids once all are online."""
        from dpadmm import deploy

        for i, node_config in enumerate(self.node_configs):
            if mem_available_mib() < MEMORY_FLOOR_MIB:
                raise MemoryError(f"the host has {mem_available_mib():.0f} MiB available with {i} SuperNodes "
                                  f"started ({variant}); {self.nodes} do not fit beside what else runs")
            if variant == "ours":  # the documented command: flower-supernode and the device's runtime
                self.d.start_supernode(i, node_config)
                continue
            command = deploy.supernode_command(  # the same SuperNode, as Flower runs it by default
                f"127.0.0.1:{self.d.port}", node_config, ca_cert=self.d.root / "certs" / "ca.crt",
                private_key=self.d.root / "keys" / f"node-{i}", port=self.d.node_ports[i])
            command[command.index("--isolation") + 1] = "subprocess"
            log = open(self.d.root / f"supernode-{i}.log", "a")  # noqa: SIM115 (kept open for the process)
            self.d.processes[f"supernode-{i}"] = subprocess.Popen(
                command, env=self.d.env, cwd=self.d.root, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        # each SuperNode's start (imports, TLS, activation) takes its share of the cores
        self.d.wait_online(self.nodes, f"{self.nodes} SuperNodes online", timeout=120 + 10 * self.nodes)
        return [self.d.processes[f"supernode-{i}"].pid for i in range(self.nodes)]

    def _stop_nodes(self) -> None:
        """SIGTERM every SuperNode: each tells the SuperLink it leaves, so the next variant's may join."""
        names = [name for name in self.d.processes if name.startswith("supernode-")]
        for name in names:  # all at once, then each waited for
            self.d.processes[name].terminate()
        for name in names:
            self.d.stop(name)
        self.d.wait_for(lambda: self.d.online() == 0, "the SuperNodes to leave", timeout=120, every=3)

    def _command(self, variant: str, out: Path) -> tuple[list[str], Path]:
        """The `flwr run` command and the file with one line per round."""
        if variant == "ours":
            config = {"iadmm.num-agents": self.nodes, "iadmm.rounds": self.rounds, "iadmm.out": str(out),
                      "iadmm.node-timeout": self.node_timeout}
            app, lines = str(_shipped_app()), out / "rounds.jsonl"
        else:
            lines = out / "timings.jsonl"
            config = {"bench-mode": "echo", "bench-timings": str(lines), "num-agents": self.nodes,
                      "rounds": self.rounds, "bench-features": 784, "bench-classes": 10, "dtype": "float64"}
            app = str(ECHO_APP)
        run_config = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
        return ["flwr", "run", app, self.d.connection, "--stream", "--run-config", run_config], lines

    def run(self, variant: str, load: int) -> Result:
        """One run of ``variant`` on fresh SuperNodes, with ``load`` busy processes beside it."""
        result = Result(variant, self.nodes, load, self.rounds)
        out = self.d.root / f"{variant}-load{load}"
        out.mkdir()
        with busy(load):
            try:
                roots = self._start_nodes(variant)
                self._watch(result, roots, *self._command(variant, out), out / "flwr-run.log")
            except Exception as error:  # noqa: BLE001 (reported in the table; the next run goes on)
                result.error = f"{type(error).__name__}: {error}"
            self._stop_nodes()  # an interruption skips this: close() kills every process at once
        return result

    def _watch(self, result: Result, roots: list[int], command: list[str], lines: Path,
               log_path: Path) -> None:
        watch, watcher = NodeWatch(roots), LineWatcher(lines)
        cpu_before = cpu_seconds(descendants(roots))
        started = time.perf_counter()
        print(f"[N={self.nodes} load={result.load} {result.variant}] {' '.join(command)}", file=sys.stderr,
              flush=True)
        cpu_after = cpu_before

        def sample(_: int) -> None:
            nonlocal cpu_after
            cpu_after = cpu_seconds(descendants(roots))  # before a node's process is gone
            watch.poll()

        returncode = follow(command, self.d.env, log_path, watcher, self.timeout, 0.5, sample,
                            f"  round {{}}/{self.rounds} after {{:.1f}} s")
        result.wall = time.perf_counter() - started
        result.cpu_per_round = (max(cpu_after, cpu_seconds(descendants(roots))) - cpu_before) / (
            self.nodes * self.rounds)
        result.cycle = [b - a for a, b in itertools.pairwise([started, *watcher.times])]
        mib = 1024.0
        result.node_rss_mib, result.node_pss_mib = watch.node_rss_kb / mib, watch.node_pss_kb / mib
        result.all_pss_mib, result.message_rss_mib = watch.all_pss_kb / mib, watch.message_rss_kb / mib
        result.message_processes = len(watch.message_processes)
        result.loadavg, result.mem_available_mib = os.getloadavg(), mem_available_mib()
        replied = [int(len(r["replied"]) if isinstance(r["replied"], list) else r["replied"])
                   for r in watcher.records]
        if returncode != 0:
            result.error = f"flwr run exited with {returncode}"
        elif len(watcher.records) != self.rounds or any(count != self.nodes for count in replied):
            result.error = f"{len(watcher.records)} of {self.rounds} rounds, replies per round {replied}"
        if result.error:
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)

    def close(self) -> None:
        assert self.d.stop_all() == [], "processes of the deployment outlived it"


def _shipped_app() -> Path:
    from tests.conftest import shipped_app

    return shipped_app()


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes that spin on a core each: another job on the machine."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# ----- report -----

def table(results: list[Result]) -> str:
    """The Markdown table: one row per run, ours' ratio to the echo of the same N and load."""
    echo = {(r.nodes, r.load): r.seconds_per_round() for r in results if r.variant == "echo" and not r.error}
    lines = ["| N | busy cores | app | s/round | ratio to echo | node CPU s/round | node RSS MiB | "
             "node PSS MiB | per-message process MiB | all nodes PSS GiB | host available GiB | "
             "load average | error |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        mine, floor = r.seconds_per_round(), echo.get((r.nodes, r.load))
        ratio = f"{mine / floor:.2f}x" if mine and floor and r.variant != "echo" else ""
        message = f"{r.message_rss_mib:.0f} ({r.message_processes})" if r.message_processes else "none"
        lines.append(
            f"| {r.nodes} | {r.load} | {r.variant} | {'' if mine is None else f'{mine:.2f}'} | {ratio} | "
            f"{r.cpu_per_round:.3f} | {r.node_rss_mib:.0f} | {r.node_pss_mib:.0f} | {message} | "
            f"{r.all_pss_mib / 1024:.1f} | {r.mem_available_mib / 1024:.1f} | {r.loadavg[0]:.2f} | "
            f"{r.error} |")
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more integers >= 0")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.deployed_round", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=_int_list, default=[2, 10], help="node counts N, e.g. 2,10")
    parser.add_argument("--rounds", type=int, default=8, help="rounds R per run; rounds 2..R are timed")
    parser.add_argument("--load", type=_int_list, default=[0, 1],
                        help="busy processes beside the runs (each spins on a core), e.g. 0,1")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="ours, echo or both")
    parser.add_argument("--timeout", type=positive_float, default=1800, help="seconds allowed per run")
    parser.add_argument("--node-timeout", type=positive_float, default=300.0,
                        help="ours: iadmm.node-timeout, the seconds the server waits for every node's answer "
                             "to its query (each node calibrates its run there, about a second of CPU: 50 "
                             "nodes on 2 cores answer within a minute or two, beyond the main job's 60 s)")
    parser.add_argument("--json", help="also write every run's numbers (each round's time) to this file")
    parser.add_argument("--keep", help="keep each deployment's folder (logs, outputs) under this folder")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants {args.variants!r}: choose from {', '.join(VARIANTS)}")
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: at least 2 (round 1 carries the start and is not timed)")
    if min(args.nodes) < 1:
        parser.error(f"--nodes {args.nodes}: every node count must be at least 1")
    if args.json:
        check_file(parser, "--json", args.json)
    if args.keep:
        check_folder(parser, "--keep", args.keep)

    signal.signal(signal.SIGTERM, interrupt)  # a plain `kill` stops every process too, as Ctrl-C does
    info = machine()
    results: list[Result] = []
    base = Path(args.keep).resolve() if args.keep else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    for nodes in args.nodes:
        with contextlib.ExitStack() as stack:
            prefix = f"deployed-round-{nodes}-"
            folder = (tempfile.mkdtemp(prefix=prefix, dir=base) if base is not None
                      else stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
            bench = Bench(Path(folder), nodes, args.rounds, args.timeout, args.node_timeout)
            try:
                for load, variant in itertools.product(args.load, variants):
                    results.append(bench.run(variant, load))
                    print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
            finally:
                bench.close()
    report = "\n".join([
        f"Machine: {info['platform']}, {info['cpus_usable']} usable CPUs, "
        f"{mem_available_mib() / 1024:.1f} GiB available; load average at start "
        f"{', '.join(f'{x:.2f}' for x in info['loadavg'])}; python {info['python']}, flwr {info['flwr']}, "
        f"torch {info['torch']}. R = {args.rounds} rounds per run, rounds 2..{args.rounds} timed.", "",
        table(results)])
    print(report)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "args": {**vars(args)},
                                               "runs": [r.to_dict() for r in results]}, indent=2) + "\n")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
