"""What DP-IADMM's strategy and protocol cost on top of Flower: three `flwr run` simulations side by side.

At the same number of agents P, the same payload (arrays of FEMNIST's shape 784 x 62) and dtype, on
Flower's Ray simulation backend with one CPU per client:

- ``ours``: this app (``flwr run .``) on the FEMNIST federation, ObjPM (E = 10) by default. The
  server sends each agent w, lambda_p and its last iterate z_p (3 arrays, different for every
  agent) and receives z_p and the last iterate (2 arrays).
- ``fedavg-same-work``: Flower's own ``FedAvg`` (``benchmarks/fedavg_app``) whose ClientApp does our
  agent's work: the same data loading (``clients.client_app.agent_data_for``) and one
  ``dpadmm.iadmm.local.agent_round`` on the 3 arrays it receives, replying 2 arrays. FedAvg broadcasts one
  ArrayRecord to every node and averages the replies; it has no per-agent state (so its driver
  holds one copy of the 3 arrays where ours holds 3 per agent, and no data set: ours evaluates w
  centrally).
- ``fedavg-echo``: the same FedAvg with a ClientApp that replies 2 of the received arrays without
  computing: Flower's own floor for this payload.

``ours`` minus ``fedavg-same-work`` is what our strategy and protocol cost; ``fedavg-same-work`` minus
``fedavg-echo`` is the local work under Flower.

Two times per round, both over rounds 2..R (round 1 carries the warm-up: Ray actors start, load
the data and, for ours, answer the partition query):

- ``s/round``: from the strategy's ``configure_train`` to the end of its ``aggregate_train``: the
  ``seconds`` that our server writes to rounds.jsonl, and the same interval in the FedAvg app;
- ``cycle``: from the end of one round to the end of the next, everything the server loop does.
  For ours this adds the central evaluation and the checkpoint; it is taken from when each line
  of rounds.jsonl appears (polled every 0.1 s), for FedAvg from timestamps in ``evaluate_fn``.

Peak memory: every ``--poll`` seconds the script reads /proc for the run's processes, i.e. those whose
environment has FLWR_HOME=<the run's own home> (``flwr run``, SuperLink, SuperExec, the
``flwr-simulation`` process and its Ray processes all inherit it), and their descendants: Ray's
dashboard and runtime-env agents often show only NUL bytes in /proc/<pid>/environ (presumably their
process title, "ray::DashboardAgent", is written over the memory that file reads), so FLWR_HOME alone
misses them. They are stopped by pid (with their start time) after ``stop_flwr_processes``.

- ``driver``: the ``flwr-simulation`` process, which runs the ServerApp (in a thread), the
  in-memory link state and the Ray driver: its VmHWM (the kernel's own peak);
- ``workers``: the Ray worker processes (the ClientApp actors): the peak of their summed VmRSS;
- ``all``: the peak of the summed VmRSS, and of the summed PSS (shared pages, such as Ray's
  object store in /dev/shm, split among the processes that map them), over all the run's
  processes. The JSON file also has the peak per role (SuperLink, SuperExec, Ray services, ...).

Usage, from the project root (each run gets a fresh FLWR_HOME and SuperLink ports of its own, and its
processes are stopped at the end, also on errors, Ctrl-C and SIGTERM):

    python -m benchmarks.flower_overhead [--agents 195] [--rounds 6] [--dtype float64|float32]
        [--variants ours,fedavg-same-work,fedavg-echo] [--femnist-dir DIR] [--json PATH]

FEMNIST is read from ``--femnist-dir``: by default ../shared/data/femnist where that folder exists, else
dpadmm's cache (``dpadmm data fetch femnist``: one LEAF sample of 114 writers, so ``--agents`` at most 114
there); the script stops in one line, before any run starts, when the writers are not there
(``fedavg-echo`` alone reads no data). A variant whose rounds did not all get every agent's reply (a
ClientApp that failed, a reply rejected) did less work and would look fast: the script then prints no
table, says which variant failed and why in one line on stderr, and exits with status 1.

A benchmark script, not a test. On a shared machine the times are not comparable between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import (
    ArgumentParser,
    check_file,
    check_folder,
    data_dir,
    fail,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    require_data,
    start_local_superlink,
)
from dpadmm.families import DEFAULT, table_of
from tests.conftest import free_ports, stop_flwr_processes, toml_value  # the clean-up of the Flower tests

ROOT = Path(__file__).resolve().parents[1]
FEDAVG_APP = ROOT / "benchmarks" / "fedavg_app"
# The preset of `ours` and of the same-work ClientApp: the papers' (full batches, each agent replying its
# last iterate beside the average of its E iterates; the card's configuration).
PRESET = "papers"
VARIANTS = ("ours", "fedavg-same-work", "fedavg-echo")
LABELS = {"ours": "OURS (DP-IADMM)", "fedavg-same-work": "FEDAVG-SAME-WORK", "fedavg-echo": "FEDAVG-ECHO"}
REFERENCE = "fedavg-same-work"
FLWR_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def flwr_env(home: Path) -> dict[str, str]:
    """The environment of a `flwr run` with its own FLWR_HOME, in this Python's environment, on private ports.

    `flwr run` starts its local SuperLink on a fixed port (39091) and reuses whatever SuperLink answers
    there, with that one's home and settings. Private ports keep this run apart from SuperLinks started
    elsewhere on a shared machine (flwr.cli.constant reads these variables); the runtime dependency
    installation is off so that the app runs here rather than in a new environment.
    """
    superlink_port, control_port = free_ports(2)
    env = dict(os.environ, FLWR_HOME=str(home), **FLWR_ENV,
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(superlink_port),
               FLWR_LOCAL_CONTROL_API_PORT=str(control_port))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env
# Ray's own agents carry a "ray::" process title like the workers; they are services, not clients.
RAY_SERVICE_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


# ----- the run's processes in /proc -----

@dataclass
class Proc:
    """One process of a run, as /proc shows it at one poll."""

    pid: int
    start: int  # start time in clock ticks: with the pid, identifies the process across polls
    role: str
    name: str  # the command (comm)
    rss_kb: int
    hwm_kb: int
    pss_kb: int
    has_env: bool


def read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live, non-zombie process."""
    raw = read_file(f"/proc/{pid}/stat")
    if raw is None:
        return None
    fields = raw.rsplit(b")", 1)[-1].split()
    if fields[0] == b"Z":
        return None
    return int(fields[1]), int(fields[19])


def _status_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in kB; zeros when the process is gone."""
    values = {}
    for line in (read_file(f"/proc/{pid}/status") or b"").splitlines():
        key, _, rest = line.partition(b":")
        if key in (b"VmRSS", b"VmHWM"):
            values[key] = int(rest.split()[0])
    return values.get(b"VmRSS", 0), values.get(b"VmHWM", 0)


def _pss_kb(pid: int) -> int:
    for line in (read_file(f"/proc/{pid}/smaps_rollup") or b"").splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1])
    return 0


def _role(pid: int) -> str:
    """What a process of the run is, from its command line."""
    cmdline = (read_file(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace")
    if "flwr-simulation" in cmdline:
        return "driver"
    if "flower-superlink" in cmdline:
        return "superlink"
    if "flower-superexec" in cmdline:
        return "superexec"
    if cmdline.startswith("ray::") and not cmdline.startswith(RAY_SERVICE_TITLES):
        return "workers"  # ray::IDLE, ray::ClientAppActor
    if "bin/flwr " in cmdline:
        return "flwr-cli"
    return "ray-services"  # gcs_server, raylet, dashboard, monitors, agents


def run_processes(home: Path, root: int) -> list[Proc]:
    """The processes with FLWR_HOME=home in their environment, ``root`` and all their descendants."""
    needle = f"FLWR_HOME={home}".encode()
    parents: dict[int, int] = {}
    starts: dict[int, int] = {}
    with_env: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        stat = _stat(pid)
        if stat is None:
            continue
        parents[pid], starts[pid] = stat
        environ = read_file(f"/proc/{pid}/environ")
        if environ and needle in environ.split(b"\0"):
            with_env.add(pid)
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [*with_env, *([root] if root in parents else [])]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    procs = []
    for pid in sorted(found):
        rss, hwm = _status_kb(pid)
        name = (read_file(f"/proc/{pid}/comm") or b"").decode(errors="replace").strip()
        procs.append(Proc(pid, starts[pid], _role(pid), name, rss, hwm, _pss_kb(pid), pid in with_env))
    return procs


@dataclass
class MemoryPeaks:
    """Peaks over the polls of one run (kB)."""

    driver_hwm_kb: int = 0
    role_rss_kb: dict[str, int] = field(default_factory=dict)  # peak of the summed VmRSS, per role
    all_rss_kb: int = 0
    all_pss_kb: int = 0
    processes: int = 0  # the most processes seen at once
    workers: int = 0  # the most Ray workers seen at once
    without_env: dict[tuple[int, int], str] = field(default_factory=dict)  # found only as descendants
    seen: set[tuple[int, int]] = field(default_factory=set)  # (pid, start) of every process seen
    polls: int = 0

    def add(self, procs: list[Proc]) -> None:
        self.polls += 1
        self.processes = max(self.processes, len(procs))
        self.all_rss_kb = max(self.all_rss_kb, sum(p.rss_kb for p in procs))
        self.all_pss_kb = max(self.all_pss_kb, sum(p.pss_kb for p in procs))
        roles: dict[str, int] = {}
        for p in procs:
            roles[p.role] = roles.get(p.role, 0) + p.rss_kb
            self.seen.add((p.pid, p.start))
            if not p.has_env:
                self.without_env[(p.pid, p.start)] = p.name
            if p.role == "driver":
                self.driver_hwm_kb = max(self.driver_hwm_kb, p.hwm_kb, p.rss_kb)
        for role, kb in roles.items():
            self.role_rss_kb[role] = max(self.role_rss_kb.get(role, 0), kb)
        self.workers = max(self.workers, sum(p.role == "workers" for p in procs))

    def to_dict(self) -> dict[str, Any]:
        mib = 1024.0
        return {
            "driver_peak_mib": self.driver_hwm_kb / mib,
            "workers_peak_mib": self.role_rss_kb.get("workers", 0) / mib,
            "all_rss_peak_mib": self.all_rss_kb / mib,
            "all_pss_peak_mib": self.all_pss_kb / mib,
            "role_rss_peak_mib": {k: v / mib for k, v in sorted(self.role_rss_kb.items())},
            "max_processes": self.processes,
            "max_ray_workers": self.workers,
            "processes_without_flwr_home": sorted(self.without_env.values()),
            "polls": self.polls,
        }


def _kill_leftovers(seen: set[tuple[int, int]]) -> list[int]:
    """SIGKILL the processes of the run still alive (same pid and start time), e.g. ones without FLWR_HOME."""
    killed = []
    for pid, start in seen:
        stat = _stat(pid)
        if stat is not None and stat[1] == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


# ----- one run -----

@dataclass
class RunResult:
    """One variant's run: per-round times (index 0 = round 1), memory peaks, the command."""

    variant: str
    command: str
    seconds: list[float] = field(default_factory=list)
    cycle: list[float] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)  # the numbers of each round's line
    memory: dict[str, Any] = field(default_factory=dict)
    wall: float = 0.0
    returncode: int | None = None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "command": self.command, "seconds": self.seconds,
                "cycle": self.cycle, "records": self.records, "seconds_stats": round_stats(self.seconds),
                "cycle_stats": round_stats(self.cycle), "round1_seconds": self.seconds[:1] or None,
                "memory": self.memory, "wall": self.wall, "returncode": self.returncode, "error": self.error}


def round_stats(values: list[float]) -> dict[str, float] | None:
    """Mean and min over rounds 2..R: round 1 is the warm-up (actors start and load the data)."""
    timed = values[1:]
    if not timed:
        return None
    return {"mean": statistics.fmean(timed), "min": min(timed), "rounds": len(timed)}


class LineWatcher:
    """Notes when each complete line of a JSONL file appears (the end of a round)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.times: list[float] = []

    def poll(self) -> None:
        raw = read_file(str(self.path))
        if raw is None:
            return
        now = time.perf_counter()
        lines = raw.split(b"\n")[:-1]  # complete lines only
        for line in lines[len(self.records):]:
            self.records.append(json.loads(line))
            self.times.append(now)


def follow(command: list[str], env: dict[str, str], log_path: Path, watcher: LineWatcher, timeout: float,
           every: float, sample: Callable[[int], None], progress: str) -> int:
    """Run ``command`` from the project's folder, its output to ``log_path``, until it exits; returns its exit
    code. ``watcher`` is polled every 0.1 s, ``sample(pid)`` called every ``every`` s, and ``progress`` (a
    format of the rounds done and the seconds) printed at each new round. A run past ``timeout`` seconds, or
    interrupted, is killed (``TimeoutError``, ``KeyboardInterrupt``); in a session of its own, a Ctrl-C
    reaches this script only, which then stops the run."""
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
        next_sample, reported = 0.0, 0
        try:
            while run.poll() is None:
                now = time.perf_counter()
                if now - started > timeout:
                    raise TimeoutError(f"the run did not end within --timeout {timeout:g} s")
                watcher.poll()
                if now >= next_sample:
                    sample(run.pid)
                    next_sample = now + every
                if len(watcher.records) > reported:
                    reported = len(watcher.records)
                    print(progress.format(reported, now - started), file=sys.stderr, flush=True)
                time.sleep(0.1)
        finally:
            if run.poll() is None:
                run.kill()
    watcher.poll()
    return run.returncode


def variant_command(variant: str, args: argparse.Namespace, work: Path) -> tuple[list[str], Path, Path]:
    """(the `flwr run` command, the file of per-round lines to watch, the run's FLWR_HOME)."""
    flwr = Path(sys.executable).parent / "flwr"
    common = {"num-agents": args.agents, "rounds": args.rounds, "dtype": args.dtype, "dataset": "femnist",
              "data-dir": str(Path(args.femnist_dir).resolve()), "algorithm": args.algorithm,
              "local-steps": args.local_steps, "epsilon": args.epsilon, "device": args.device}
    if variant == "ours":  # the papers preset's table (the FedAvg app's own run config is flat)
        app, watched = ROOT, work / "run" / "rounds.jsonl"
        own = {**common, "eval-every": args.eval_every, "out": str(work / "run")}
        config = {"algorithm": own.pop("algorithm"), "preset": PRESET,
                  **{f"{table_of(DEFAULT, PRESET)}.{k}": v for k, v in own.items()}}
    else:  # the same keys and preset, read by the same function (fedavg_bench.client_app._run_config)
        app, watched = FEDAVG_APP, work / "timings.jsonl"
        config = {**common, "preset": PRESET, "bench-mode": variant.removeprefix("fedavg-"),
                  "bench-timings": str(watched)}
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in config.items())
    federation = f"num-supernodes={args.agents} client-resources-num-cpus=1"
    if args.gpus_per_clientapp:
        federation += f" client-resources-num-gpus={args.gpus_per_clientapp:g}"
    command = [str(flwr) if flwr.exists() else "flwr", "run", str(app), "--stream",
               "--run-config", run_config, "--federation-config", federation]
    return command, watched, work / "flwr-home"


def incomplete_rounds(records: list[dict[str, Any]], agents: int) -> str:
    """Why the run's rounds are not comparable ("" if every agent's reply counted in every round).

    A round where ClientApps failed, or replies were rejected, did less work and would look fast.
    """
    bad = {}
    for record in records:
        replied = record.get("replied")
        if replied is None:
            return f"round {record.get('round')} does not say who replied (no 'replied' field)"
        count = len(replied) if isinstance(replied, list) else int(replied)
        if count != agents:
            bad[record["round"]] = count
    return "" if not bad else f"rounds with fewer than {agents} accepted replies (round: replies): {bad}"


def _quote(arg: str) -> str:
    """A shell word, double-quoted where that is safe: run configs are full of TOML's single quotes."""
    if shlex.quote(arg) == arg or any(c in arg for c in '"$`\\!'):
        return shlex.quote(arg)
    return f'"{arg}"'


def run_variant(variant: str, args: argparse.Namespace, work: Path) -> RunResult:
    """One `flwr run`, watched until it exits; every process it started is stopped before returning."""
    work.mkdir(parents=True)
    command, watched, home = variant_command(variant, args, work)
    env = flwr_env(home)
    shown = " ".join(f"{k}={shlex.quote(env[k])}" for k in (
        "FLWR_HOME", *FLWR_ENV, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT"))
    result = RunResult(variant, f"cd {shlex.quote(str(ROOT))} && {shown} {' '.join(map(_quote, command))}")
    print(f"\n[{variant}] {result.command}", file=sys.stderr, flush=True)
    peaks = MemoryPeaks()
    watcher = LineWatcher(watched)
    log_path = work / "flwr-run.log"
    started = time.perf_counter()
    try:
        start_local_superlink(env)
        started = time.perf_counter()
        result.returncode = follow(command, env, log_path, watcher, args.timeout, args.poll,
                                   lambda pid: peaks.add(run_processes(home, pid)),
                                   f"[{variant}] round {{}}/{args.rounds} done after {{:.1f}} s")
        result.wall = time.perf_counter() - started
        watcher.poll()
        if result.returncode != 0:
            result.error = f"flwr run exited with {result.returncode}"
        elif len(watcher.records) != args.rounds:
            result.error = f"{len(watcher.records)} of {args.rounds} rounds recorded in {watched}"
        else:
            result.error = incomplete_rounds(watcher.records, args.agents)
    except Exception as err:
        result.error = f"{type(err).__name__}: {err}"
    finally:
        alive = stop_flwr_processes(home)
        killed = _kill_leftovers(peaks.seen)
        if alive or killed:
            print(f"[{variant}] still alive after stopping: {alive}; killed by pid: {killed}",
                  file=sys.stderr)
    result.memory = peaks.to_dict()
    result.seconds = [float(r["seconds"]) for r in watcher.records]
    result.records = [{k: v for k, v in r.items() if isinstance(v, int | float)} for r in watcher.records]
    if variant == "ours":  # the whole loop: from one round's line in rounds.jsonl to the next
        result.cycle = [b - a for a, b in itertools.pairwise([started, *watcher.times])]
    else:
        result.cycle = [float(r["cycle"]) for r in watcher.records]
    if result.error:
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        print(f"[{variant}] FAILED: {result.error}\n{tail}", file=sys.stderr, flush=True)
    return result


# ----- report -----

def machine() -> dict[str, Any]:
    """What the numbers were measured on, with the load at the start (the machine may be shared)."""
    import flwr
    import ray
    import torch

    return {"platform": platform.platform(), "machine": platform.machine(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "flwr": flwr.__version__, "ray": ray.__version__,
            "torch": torch.__version__, "loadavg": os.getloadavg()}


def table(results: list[RunResult], args: argparse.Namespace) -> str:
    reference = next((r for r in results if r.variant == REFERENCE and not r.error), None)

    def cell(values: list[float], key: str) -> str:
        stats = round_stats(values)
        return "" if stats is None else f"{stats[key]:.3f}"

    def ratio(run: RunResult, which: str) -> str:
        """This run's mean over the reference's (FEDAVG-SAME-WORK), for ``seconds`` or ``cycle``."""
        if reference is None:
            return ""
        mine, ref = round_stats(getattr(run, which)), round_stats(getattr(reference, which))
        return "" if mine is None or ref is None or not ref["mean"] else f"{mine['mean'] / ref['mean']:.2f}"

    lines = [
        f"| variant | P | dtype | s/round mean | s/round min | ratio to {LABELS[REFERENCE]} | cycle mean | "
        "cycle min | cycle ratio | round 1 s | driver peak MiB | workers peak MiB | all peak RSS MiB | "
        "all peak PSS MiB |",
        "| --- | " + " | ".join(["---:"] * 13) + " |",
    ]
    for r in results:
        m = r.memory
        label = LABELS[r.variant] + (f" (FAILED: {r.error})" if r.error else "")
        first = f"{r.seconds[0]:.3f}" if r.seconds else ""
        memory = [f"{m.get(k, 0):.0f}" for k in ("driver_peak_mib", "workers_peak_mib", "all_rss_peak_mib",
                                                 "all_pss_peak_mib")]
        lines.append(" | ".join([
            f"| {label}", str(args.agents), args.dtype, cell(r.seconds, "mean"), cell(r.seconds, "min"),
            ratio(r, "seconds"), cell(r.cycle, "mean"), cell(r.cycle, "min"), ratio(r, "cycle"), first,
            *memory]) + " |")
    return "\n".join(lines)


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


PROG = "python -m benchmarks.flower_overhead"


def build_parser() -> ArgumentParser:
    """The script's arguments (the tests build the variants' commands from them)."""
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=positive_int, default=195,
                        help="P: agents = SuperNodes (FEMNIST's first P writers)")
    parser.add_argument("--rounds", type=positive_int, default=6,
                        help="rounds R per run; rounds 2..R are timed")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the ClientApps compute (ours and same-work)")
    parser.add_argument("--gpus-per-clientapp", type=nonnegative_float, default=0.0,
                        help="client-resources-num-gpus: each ClientApp's GPU fraction (with --device cuda)")
    parser.add_argument("--algorithm", default="objpm", help="dpadmm algorithm (ours and same-work)")
    parser.add_argument("--local-steps", type=nonnegative_int, default=0,
                        help="E; 0 = the algorithm's default (10 for objpm)")
    parser.add_argument("--epsilon", type=positive_float, default=1.0, help="eps-bar per local step")
    parser.add_argument("--eval-every", type=positive_int, default=1,
                        help="ours: central evaluation every this many rounds (in 'cycle', not in 's/round')")
    parser.add_argument("--femnist-dir", default=str(data_dir("femnist")),
                        help="LEAF FEMNIST sample folder(s) (default: ../shared/data/femnist where that "
                             "exists, else dpadmm's cache)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {', '.join(VARIANTS)}")
    parser.add_argument("--json", help="also write the results (every round, memory by role) to this file")
    parser.add_argument("--poll", type=positive_float, default=0.5, help="seconds between memory polls")
    parser.add_argument("--timeout", type=positive_float, default=3600, help="seconds allowed per run")
    parser.add_argument("--keep", help="keep each run's folder (logs, FLWR_HOME, outputs) under this folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: round 1 is the warm-up and is not timed")
    if args.json:
        check_file(parser, "--json", args.json, make_parent=True)
    if args.keep:
        check_folder(parser, "--keep", args.keep)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device cuda: torch {torch.__version__} sees no GPU here; use --device cpu")
    if set(variants) - {"fedavg-echo"}:  # the echo reads no data
        require_data(parser, [("femnist", args.femnist_dir, "--femnist-dir")], {"femnist": args.agents})

    # A plain `kill` of this script must also stop the runs: make SIGTERM unwind like Ctrl-C.
    signal.signal(signal.SIGTERM, interrupt)
    info = machine()
    results: list[RunResult] = []
    interrupted = False
    with contextlib.ExitStack() as stack:
        if args.keep:
            base = Path(args.keep).resolve()
            base.mkdir(parents=True, exist_ok=True)
            base = Path(tempfile.mkdtemp(prefix="flower-overhead-", dir=base))
        else:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flower-overhead-")))
        try:
            for variant in variants:
                results.append(run_variant(variant, args, base / variant))
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: the runs so far follow", file=sys.stderr)

    lines = [
        f"Machine: {info['platform']}, {info['cpu_count']} CPUs ({info['cpus_usable']} usable), "
        f"load average at start {', '.join(f'{x:.2f}' for x in info['loadavg'])}; python {info['python']}, "
        f"flwr {info['flwr']}, ray {info['ray']}, torch {info['torch']}.",
        f"P = {args.agents}, R = {args.rounds} rounds (rounds 2..{args.rounds} timed), {args.dtype}, "
        f"algorithm {args.algorithm} (local-steps {args.local_steps or 'default'}), FEMNIST from "
        f"{Path(args.femnist_dir).resolve()}; times in seconds, memory in MiB.",
        "",
        table(results, args),
        "",
        "Commands:",
        "",
        *[f"- {LABELS[r.variant]}: `{r.command}`" for r in results],
    ]
    # A failed variant's numbers measure less work than the others': no table that could be read as a result.
    failed = "; ".join(f"{r.variant}: {r.error.splitlines()[0]}" for r in results if r.error)
    if not failed or interrupted:
        print("\n".join(lines))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "error": failed,
                                               "runs": [r.to_dict() for r in results]}, indent=2) + "\n")
    if interrupted:
        return 130
    if failed:
        fail(PROG, f"the comparison is void, no table printed: {failed} (each failed run's log tail is above"
             + (f", its folder under {args.keep})" if args.keep else ")"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
