"""One runner for every family's ``dpadmm reproduce`` grid: in this process, on N local Ray workers, or
on an existing Ray cluster, with the same results bit for bit.

A grid is a list of :class:`Cell`: a family's run (a configuration and its seeds, a baseline, a
reference solver) given as a function of a scratch folder that returns the cell's small results. The
runner skips completed cells, resumes checkpointed ones, shows one bar over the cells on a terminal (with
the time left and the rounds of the cells running), and hands every result to the family's ``commit`` in the
grid's order, which writes it where the report reads it. Three ways to run the same cells:

- ``workers=1`` (the default): one cell after another in this process;
- ``workers=N``: N cells at once on a Ray instance started here, each with its share of the cores;
- ``ray_address``: on an existing Ray cluster (``auto``: the one ``RAY_ADDRESS`` or ``ray start`` on this
  machine names), each cell declaring its CPUs and, for ``device=cuda``, a GPU.

Every way runs a cell through the same function (:func:`execute`), in a scratch folder of its own: the
cell's files (a checkpoint, its run folders) are sent back to the driver, which alone writes into
``out``, so workers need no shared file system. While a cell runs, its checkpoint (the file named by
``Cell.checkpoint``, written by the engine at most every ``checkpoint_seconds``) goes back to the
driver with the folder's other files each time it changes, so a cell whose worker is lost (a node that
dies, a killed process) runs again from its last checkpoint (up to ``retries`` times) and loses at most
that interval. A worker counted lost may still be alive (a process that stalled, a node cut off for a
while): once it goes on, its cell learns from the driver that another attempt has taken over and ends
its process, rather than compute hours of a cell nobody waits for. A cell that raises is reported with
its error and the grid goes on; the failures are raised together at the end (:class:`CellsFailed`). A
local Ray instance starts its workers with malloc set to keep freed memory
(:data:`dpadmm.runs.memory.WORKER_ENV`), as ``dpadmm reproduce`` sets its own process; on an existing
cluster that is the environment its nodes were started in (``ray start``).

Results are committed in the grid's order whatever order the cells finish in: a result that arrives
before those of earlier cells waits in ``out/.grid/`` (so that an interrupted call keeps it), and the
files a family writes from its results are the same whichever way ran the grid. What differs is the
clocks (seconds, elapsed, wall time), never a number the runs compute, given the same threads per cell
(``GridOptions.threads``, 1 unless asked) and machines with the same CPU and libraries: the tests run
each family's grid here, on 2 local workers and on a 2-node cluster, and compare every number.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from dpadmm.files import write_atomic
from dpadmm.runs.memory import WORKER_ENV

SPOOL = ".grid"  # results that arrived before an earlier cell's, kept until their turn
FAILED_CELLS = "failed-cells.json"  # the cells that failed in the last call, with their errors
# The cells a call set out to run and has not committed: there while a call runs, and after one that stopped
# before the grid's end (an interrupt, a kill), so that its report says it is incomplete.
PENDING_CELLS = "pending-cells.json"
SCRATCH = "dpadmm-cell-"  # a running cell's folder, in the temp dir of its machine: dpadmm-cell-<pid>-...
POLL_SECONDS = 1.0  # how often a running cell's folder is looked at (checkpoint, rounds done)
ATTEMPT_SECONDS = 10.0  # how often a cell on Ray asks the driver whether its attempt is still the current one
SUPERSEDED = 3  # the exit status of a worker whose attempt was superseded (see execute)

Files = dict[str, bytes]  # a folder's files: path relative to the folder -> content


@dataclass(frozen=True)
class Workspace:
    """Where a cell runs: ``path``, a scratch folder holding the cell's files from its last checkpoint
    (empty for a fresh cell), and how often its engine should checkpoint."""

    path: Path
    checkpoint_seconds: float


@dataclass(frozen=True)
class Cell:
    """One unit of a grid.

    ``run`` (picklable: a module-level function, or a ``functools.partial`` of one) runs the cell in a
    :class:`Workspace` and returns its results, small and JSON-serialisable. ``folder`` is the folder of
    ``out`` (relative) that mirrors the workspace's files, "" for a cell that writes no files; a cell
    that checkpoints names its checkpoint file there (``checkpoint``). ``done`` marks a cell completed
    by an earlier call. ``progress`` (picklable) reads the workspace and says how far the cell is, e.g.
    ``1200/20000``. ``gpus``: what the cell needs of a GPU (1 for ``device=cuda``). ``identity``
    (JSON-serialisable) is what a result an earlier call received for this key must have been run with
    to be taken for this cell's."""

    key: str
    run: Callable[[Workspace], Any]
    folder: str = ""
    checkpoint: str = ""
    done: bool = False
    progress: Callable[[Path], str] | None = None
    gpus: float = 0.0
    identity: Any = None


@dataclass(frozen=True)
class GridOptions:
    """How a grid runs: ``workers`` cells at once (1: in this process, more: on a local Ray instance),
    or on the Ray cluster at ``ray_address``; ``threads`` per cell; a running cell's checkpoint every
    ``checkpoint_seconds``; a cell whose worker is lost runs again at most ``retries`` times.

    ``threads`` is a setting of the numbers, not only of the speed: a matrix product's library may split a
    long sum by thread (Intel MKL does for the tall products of the binary tasks' gradients), so a cell
    run on 2 threads can end a last digit away from the same cell on 1. It does not follow ``workers``:
    a grid gives the same numbers with any ``workers``, here or on a cluster, for the same ``threads``."""

    workers: int = 1
    ray_address: str = ""
    threads: int = 1
    checkpoint_seconds: float = 300.0
    retries: int = 3
    progress: bool = True

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} is not allowed; give 1 (one cell at a time, in this "
                             "process) or more (cells at once on Ray)")
        if self.ray_address and self.workers != 1:
            raise ValueError(f"workers={self.workers} with ray-address={self.ray_address!r}: on a cluster "
                             "the cells run as its CPUs allow; give one or the other")
        if self.threads < 1 or self.retries < 0 or not self.checkpoint_seconds > 0:
            raise ValueError(f"threads={self.threads} must be >= 1, retries={self.retries} >= 0 and "
                             f"checkpoint-seconds={self.checkpoint_seconds} > 0")

    def parallel(self) -> int:
        """How many cells run at once, where it is known before the grid starts (``workers``; a cluster's
        CPUs are known once connected, so 1 there)."""
        return self.workers

    @property
    def on_ray(self) -> bool:
        return self.workers > 1 or bool(self.ray_address)


@dataclass
class Failure:
    """A cell that raised: its key and the error."""

    key: str
    error: str


class CellsFailed(RuntimeError):
    """Cells of a grid failed; the others completed and were committed."""

    def __init__(self, failures: Sequence[Failure]) -> None:
        self.failures = list(failures)
        listed = "; ".join(f"{f.key}: {f.error}" for f in self.failures)
        super().__init__(f"{_cells(len(self.failures))} failed (run the same command again to retry "
                         f"them; any others completed and are in the report): {listed}")


def failed_cells(out: str | Path) -> list[dict[str, str]]:
    """The cells that failed in the last call on the grid folder ``out`` (empty when all completed)."""
    path = Path(out) / FAILED_CELLS
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else []


def pending_cells(out: str | Path) -> list[str] | None:
    """The cells the last call on ``out`` set out to run and did not commit, None when it reached the grid's
    end (or no call ran). An empty list: it stopped between two stages of the grid."""
    path = Path(out) / PENDING_CELLS
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _cells(count: int) -> str:
    return f"{count} cell{'s' if count != 1 else ''}"


def incomplete(out: str | Path) -> str | None:
    """Why the grid in ``out`` is not a finished reproduction (its failed cells, or a call that stopped
    before the grid's end), None when it is."""
    failed, pending = failed_cells(out), pending_cells(out)
    if pending is not None:
        listed = f": {', '.join(pending)}" if pending else ""
        return (f"the last call stopped before the grid's end (interrupted or killed), "
                f"{_cells(len(pending))} of it not run{listed}; run the same command again to resume it")
    if failed:
        listed = "; ".join(f"`{f['cell']}`: {f['error']}" for f in failed)
        return f"{_cells(len(failed))} failed (run the same command again to retry them): {listed}"
    return None


def mark_report(out: str | Path, report: str = "summary.md") -> str | None:
    """Put why the grid is incomplete (:func:`incomplete`) at the top of ``out/report``, so that nobody reads
    a grid whose cells failed or did not run as a finished reproduction; returns it."""
    why = incomplete(out)
    path = Path(out) / report
    if why and path.exists():
        banner = f"> **Incomplete**: {why}. The tables below lack those cells' rows.\n\n"
        text = path.read_text(encoding="utf-8")
        if not text.startswith("> **Incomplete"):
            write_atomic(path, banner + text)
    return why


# ----- a cell, wherever it runs -----


def snapshot(folder: Path) -> Files:
    """The files under ``folder``. A JSON-lines log is cut after its last complete line: the engine may be
    writing its next line while the folder is read, and a resumed run keeps complete records only."""
    files: Files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.endswith(".tmp"):
            data = path.read_bytes()
            if path.suffix == ".jsonl":
                data = data[: data.rfind(b"\n") + 1]
            files[path.relative_to(folder).as_posix()] = data
    return files


def mirror(files: Files, folder: Path) -> None:
    """Make ``folder`` hold exactly ``files``: each written to a temporary file and renamed over the old
    one (a crash leaves either version, never half a file), then the files that are no longer there
    removed."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.read_bytes() == data:
            continue
        write_atomic(path, data)
    for path in sorted(folder.rglob("*"), reverse=True):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name not in files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def execute(cell: Cell, files: Files, threads: int, checkpoint_seconds: float,
            poll: float = POLL_SECONDS,
            current: Callable[[], bool] | None = None) -> Iterator[tuple[str, Any]]:
    """Run ``cell`` in a scratch folder that starts with ``files``; yields ``("started", where)`` (the host,
    with the Ray node's address on Ray), ``("progress", text)`` while it runs, ``("files", files)`` each
    time its checkpoint changes, and last ``("done", (results, files))`` or, when the cell raised,
    ``("failed", (error, files))``.

    The same generator runs a cell in this process and, as a Ray task, on a worker: the cell runs in a
    thread of its own while this generator watches its folder. On Ray, ``current`` says whether the driver
    still waits for this attempt (:class:`_Current`); a no ends the process (status
    :data:`SUPERSEDED`, its scratch folder removed first): a thread cannot be stopped from outside, and a
    worker that Ray counted lost while it stalled would otherwise compute the cell to its end beside the
    attempt that replaced it."""
    import tempfile

    import torch

    torch.set_num_threads(threads)
    remove_orphans()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{os.getpid()}-") as scratch:
        path = Path(scratch)
        mirror(files, path)
        workspace = Workspace(path=path, checkpoint_seconds=checkpoint_seconds)
        outcome: queue.Queue[tuple[bool, Any]] = queue.Queue()

        def target() -> None:
            try:
                outcome.put((True, cell.run(workspace)))
            except BaseException as error:  # noqa: BLE001 - the generator reports it: a failed cell
                outcome.put((False, error))

        worker = threading.Thread(target=target, name=f"cell {cell.key}", daemon=True)
        worker.start()
        yield "started", _where()
        checkpoint = path / cell.checkpoint if cell.checkpoint else None
        seen = _stamp(checkpoint)
        shown = ""
        while worker.is_alive():
            worker.join(poll)
            if current is not None and worker.is_alive() and not current():
                _end_superseded(path)
            if cell.progress is not None:
                text = cell.progress(path)
                if text != shown:
                    shown = text
                    yield "progress", text
            stamp = _stamp(checkpoint)
            if stamp != seen and stamp is not None:
                seen = stamp
                yield "files", snapshot(path)
        ok, value = outcome.get()
        if ok:
            yield "done", (value, snapshot(path))
        else:  # its files too (a failed run's folder says what failed and when), and the error as text
            yield "failed", (f"{type(value).__name__}: {value}".strip(), snapshot(path))


def _end_superseded(scratch: Path) -> NoReturn:
    """Remove the cell's scratch folder (its checkpoint may be hundreds of megabytes) and end the process.

    The cell's thread still runs and writes into the folder: a file it makes while ``rmtree`` walks the
    folder would leave it behind ("Directory not empty", seen under load). So the folder is first renamed
    away, atomically: the thread's later writes name a folder that no longer exists and fail, and the
    renamed one, which keeps the owner's pid in its name for :func:`remove_orphans`, is removed whole."""
    import shutil

    gone = scratch.with_name(f"{scratch.name}-superseded")
    try:
        scratch.rename(gone)
    except OSError:
        gone = scratch
    shutil.rmtree(gone, ignore_errors=True)
    os._exit(SUPERSEDED)


class _Attempts:
    """The latest attempt the driver started of each cell: a Ray actor on the driver's node, which the
    cells' workers ask (:class:`_Current`)."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}

    def start(self, key: str, attempt: int) -> None:
        self.attempts[key] = attempt

    def latest(self, key: str) -> int | None:
        return self.attempts.get(key)


class _Current:
    """Whether attempt ``attempt`` of cell ``key`` is still the one the driver waits for, that is whether
    the driver has started no later one: asked of the actor ``attempts`` every :data:`ATTEMPT_SECONDS`,
    without blocking (a task that blocks in ``ray.get`` lends its CPU to Ray, which may start another cell
    on it meanwhile). A call reads the answer that has come, if any, and sends the next question when it
    is time, the first one :data:`ATTEMPT_SECONDS` after the first call (a short cell never asks). It says
    yes until the actor names a later attempt: an answer not yet come, an error, or an attempt not yet
    recorded never end one."""

    def __init__(self, attempts: Any, key: str, attempt: int) -> None:
        self.attempts, self.key, self.attempt = attempts, key, attempt
        self.asked: Any = None  # the answer to come (a concurrent.futures.Future)
        self.last: float | None = None  # when the last question went, or the first call (time.monotonic)

    def __call__(self) -> bool:
        if self.asked is not None and self.asked.done():
            asked, self.asked = self.asked, None
            latest = asked.result() if asked.exception() is None else None
            if latest is not None and latest > self.attempt:
                return False
        now = time.monotonic()
        if self.last is None:
            self.last = now
        if self.asked is None and now - self.last >= ATTEMPT_SECONDS:
            self.last = now
            self.asked = self.attempts.latest.remote(self.key).future()
        return True


def remove_orphans() -> list[Path]:
    """Remove the scratch folders of cells whose process is gone (a worker killed, a node's process ended
    by the OOM killer): a killed process cannot remove its own, and a FEMNIST cell's holds a checkpoint of
    hundreds of megabytes. A folder is named after the process that made it; returns those removed."""
    import shutil
    import tempfile

    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH}*-*"):
        owner = path.name[len(SCRATCH):].split("-", 1)[0]
        if owner.isdigit() and path.is_dir() and not _alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _where() -> str:
    """The host and process a cell runs in, and on Ray the node's address (two nodes may share a host)."""
    where = f"{socket.gethostname()} pid {os.getpid()}"
    try:
        import ray

        if ray.is_initialized():
            where += f" (Ray node {ray.util.get_node_ip_address()})"
    except ImportError:
        pass
    return where


def _stamp(path: Path | None) -> tuple[int, int] | None:
    if path is None or not path.exists():
        return None
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


# ----- the driver -----


class GridRunner:
    """Runs cells and commits their results into ``out`` (use as a context manager: it starts Ray when the
    options ask for it and stops what it started). :meth:`run` may be called once per stage of a grid
    whose later cells depend on earlier results; the bar grows with each stage."""

    def __init__(self, out: str | Path, options: GridOptions = GridOptions(), *,
                 log: Callable[[str], None] = print) -> None:
        self.out = Path(out)
        self.options = options
        self.failures: list[Failure] = []
        self.placements: dict[str, str] = {}  # where each cell ran (its last start)
        self._log = log
        self._bar: Any = None
        self._started_ray = False
        self._running: dict[str, str] = {}
        self._pending: list[str] = []  # PENDING_CELLS: what this call set out to run and has not committed

    def __enter__(self) -> GridRunner:
        if self.options.on_ray:
            self._start_ray()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._started_ray:
            import ray

            ray.shutdown()

    def log(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line)
        else:
            self._log(line)

    def raise_failures(self) -> None:
        """Raise :class:`CellsFailed` if any cell failed, after listing them in ``out/failed-cells.json``
        (which :func:`mark_report` puts at the top of the report); a grid whose cells all completed removes
        it."""
        path = self.out / FAILED_CELLS
        (self.out / PENDING_CELLS).unlink(missing_ok=True)  # the grid's end: every cell was run
        if self.failures:
            listed = [{"cell": f.key, "error": f.error} for f in self.failures]
            write_atomic(path, json.dumps(listed, indent=1) + "\n")
            raise CellsFailed(self.failures)
        path.unlink(missing_ok=True)

    # ----- stages -----

    def run(self, cells: Sequence[Cell], commit: Callable[[Cell, Any], None]) -> None:
        """Run the cells not done and pass each result, in the order of ``cells``, to ``commit`` (after its
        files are in ``out / cell.folder``)."""
        keys = [cell.key for cell in cells]
        if len(set(keys)) != len(keys):
            twice = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"a grid's cells need distinct keys: {twice} come twice")
        todo = [cell for cell in cells if not cell.done]
        for cell in cells:
            if cell.done:
                self.log(f"{cell.key}: complete, skipped")
        arrived: dict[str, Any] = {}
        for cell in todo:  # results an interrupted call received but had not committed
            spool = self._spool(cell)
            if spool.exists():
                saved = json.loads(spool.read_text(encoding="utf-8"))
                if saved.get("identity") != json.loads(json.dumps(cell.identity)):
                    raise ValueError(f"{spool} holds a result of {cell.key} run with other settings "
                                     f"({saved.get('identity')}); use another --out or delete that file")
                arrived[cell.key] = saved["result"]
                self.log(f"{cell.key}: complete (received by an earlier call), committed in the cells' order")
        runnable = [cell for cell in todo if cell.key not in arrived]
        self._pending = [*dict.fromkeys([*(pending_cells(self.out) or []), *(c.key for c in todo)])]
        self._write_pending()
        self._grow_bar(len(cells), len(cells) - len(runnable))
        state = _Commits(todo, arrived, commit, self)
        state.flush()
        if self.options.on_ray:
            self._run_on_ray(runnable, state)
        else:
            for cell in runnable:
                self._run_here(cell, state)
        state.flush()
        spool = self.out / SPOOL
        if spool.is_dir() and not any(spool.iterdir()):
            spool.rmdir()

    def _run_here(self, cell: Cell, state: _Commits) -> None:
        import torch

        self.log(f"{cell.key}: {'resuming' if self._files(cell) else 'running'}")
        self._running[cell.key] = ""
        threads = torch.get_num_threads()  # the cell sets its own; this process gets its own back
        try:
            events = execute(cell, self._files(cell), self.options.threads,
                             self.options.checkpoint_seconds)
            for kind, value in events:  # a cell that raises ends in a "failed" event
                self._event(cell, kind, value, state)
        finally:
            self._running.pop(cell.key, None)
            torch.set_num_threads(threads)

    def _run_on_ray(self, cells: Sequence[Cell], state: _Commits) -> None:
        import ray
        from ray.exceptions import RayError, RayTaskError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        threads = self.options.threads
        # not retried by Ray: a lost worker's cell is resubmitted below, from its last checkpoint
        task = ray.remote(max_retries=0)(execute)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        attempts = ray.remote(num_cpus=0, scheduling_strategy=here)(_Attempts).remote()
        running: dict[Any, tuple[Cell, int]] = {}

        def submit(cell: Cell, attempt: int) -> None:
            files = self._files(cell)
            self.log(f"{cell.key}: " + ("resuming" if files else "queued")
                     + (f" (attempt {attempt + 1}: its worker was lost)" if attempt else ""))
            attempts.start.remote(cell.key, attempt)  # not awaited: only a later attempt ends one
            generator = task.options(num_cpus=threads, num_gpus=cell.gpus).remote(
                cell, files, threads, self.options.checkpoint_seconds, POLL_SECONDS,
                _Current(attempts, cell.key, attempt))
            running[generator] = (cell, attempt)
            self._running[cell.key] = ""

        for cell in cells:  # Ray runs as many at once as the CPUs allow, the rest wait in its queue
            submit(cell, 0)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_SECONDS)
            for generator in ready:
                cell, attempt = running[generator]
                try:
                    kind, value = ray.get(next(generator))
                except StopIteration:
                    del running[generator]
                    continue
                except RayTaskError as error:  # the task raised outside the cell (unpicklable, say)
                    del running[generator]
                    self._fail(cell, error.cause if error.cause is not None else error, state)
                    continue
                except RayError as error:  # the worker or its node was lost: again, from the last checkpoint
                    del running[generator]
                    self._running.pop(cell.key, None)
                    if attempt < self.options.retries:
                        self.log(f"{cell.key}: its worker was lost ({type(error).__name__})")
                        submit(cell, attempt + 1)
                    else:
                        self._fail(cell, error, state)
                    continue
                self._event(cell, kind, value, state)
                if kind in ("done", "failed"):
                    del running[generator]

    # ----- events -----

    def _event(self, cell: Cell, kind: str, value: Any, state: _Commits) -> None:
        if kind == "started":
            self.placements[cell.key] = value
            self.log(f"{cell.key}: started on {value}")
        elif kind == "progress":
            self._running[cell.key] = value
            self._show()
        elif kind == "files":
            if cell.folder:
                mirror(value, self.out / cell.folder)
                at = f" at {self._running[cell.key]}" if self._running.get(cell.key) else ""
                self.log(f"{cell.key}: checkpoint{at} saved in {self.out / cell.folder}")
        elif kind in ("done", "failed"):
            result, files = value
            if cell.folder:
                mirror(files, self.out / cell.folder)
            if kind == "failed":
                self._fail(cell, result, state)
                return
            self._running.pop(cell.key, None)
            self.log(f"{cell.key}: complete")
            state.arrive(cell, result)
            if self._bar is not None:
                self._bar.update(1)
                self._show()

    def committed(self, cell: Cell) -> None:
        """``cell``'s result is in the tables: it is no longer pending."""
        self._pending = [key for key in self._pending if key != cell.key]
        self._write_pending()

    def _write_pending(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / PENDING_CELLS, json.dumps(self._pending, indent=1) + "\n")

    def _fail(self, cell: Cell, error: BaseException | str, state: _Commits) -> None:
        self._running.pop(cell.key, None)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}".strip()
        self.failures.append(Failure(cell.key, text))
        self.log(f"{cell.key}: failed: {text}")
        state.drop(cell)
        if self._bar is not None:
            self._bar.update(1)

    # ----- files, spool, bar, Ray -----

    def _files(self, cell: Cell) -> Files:
        """What a (re)started cell starts from: its folder's files when it holds a checkpoint."""
        folder = self.out / cell.folder if cell.folder else None
        if folder is None or not cell.checkpoint or not (folder / cell.checkpoint).exists():
            return {}
        return snapshot(folder)

    def _spool(self, cell: Cell) -> Path:
        return self.out / SPOOL / (re.sub(r"[^A-Za-z0-9._=-]+", "_", cell.key) + ".json")

    def _grow_bar(self, total: int, done: int) -> None:
        # On a terminal only: in a log file tqdm would redraw the bar around every log line.
        if not self.options.progress or not sys.stderr.isatty():
            return
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, unit="cell", desc="reproduce", dynamic_ncols=True)
        else:
            self._bar.total += total
            self._bar.update(done)

    def _show(self) -> None:
        if self._bar is not None:
            running = ", ".join(f"{k} {v}".strip() for k, v in self._running.items())
            self._bar.set_postfix_str(running[:120], refresh=True)

    def _start_ray(self) -> None:
        # Ray 2.55 warns on every start that a future version stops overriding CUDA_VISIBLE_DEVICES for tasks
        # that ask for no GPU; asking for the future behaviour now is right here (a cell declares its GPU)
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        import ray

        address = self.options.ray_address
        quiet = {"logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}
        if address:
            ray.init(address=address, **quiet)
            resources = ray.cluster_resources()
            self.log(f"grid: on the Ray cluster at {address}: {len(ray.nodes())} nodes, "
                     f"{resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs; "
                     f"{self.options.threads} thread(s) per cell")
        else:
            threads = self.options.threads
            # Ray's processes, and so its workers, inherit this environment: malloc keeps freed memory in them
            # (a runtime_env per task would do it too, but with fresh workers: grids 40% longer in the tests)
            saved = {name: os.environ.get(name) for name in WORKER_ENV}
            os.environ.update(WORKER_ENV)
            try:
                ray.init(num_cpus=self.options.workers * threads, include_dashboard=False, **quiet)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
            self.log(f"grid: {self.options.workers} cells at once on a local Ray instance, {threads} "
                     f"thread(s) each")
        self._started_ray = True


@dataclass
class _Commits:
    """Commits results in the order of the cells: one that arrives early is spooled until its turn."""

    cells: Sequence[Cell]
    arrived: dict[str, Any]
    commit: Callable[[Cell, Any], None]
    runner: GridRunner
    position: int = 0
    dropped: set[str] = field(default_factory=set)

    def arrive(self, cell: Cell, result: Any) -> None:
        spool = self.runner._spool(cell)
        spool.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(spool, json.dumps({"key": cell.key, "identity": cell.identity, "result": result}))
        self.arrived[cell.key] = result
        self.flush()

    def drop(self, cell: Cell) -> None:
        self.dropped.add(cell.key)
        self.flush()

    def flush(self) -> None:
        while self.position < len(self.cells):
            cell = self.cells[self.position]
            if cell.key in self.dropped:
                self.position += 1
                continue
            if cell.key not in self.arrived:
                return
            self.commit(cell, self.arrived.pop(cell.key))
            self.runner._spool(cell).unlink(missing_ok=True)
            self.runner.committed(cell)
            self.position += 1


# What a grid writes that is a clock or a machine, not a number its runs compute: the only fields in which a
# grid run on Ray workers may differ from the same grid run in one process.
CLOCKS = frozenset({"seconds", "elapsed", "wall_seconds_last_call", "finished", "machine"})


def numbers(out: str | Path) -> dict[str, Any]:
    """Every data file a grid wrote under ``out`` (CSV, JSON lines, JSON), parsed, with the clock fields
    (:data:`CLOCKS`) left out: two runs of one grid, however run, give equal values (the tests and
    ``benchmarks/grids.py`` compare them). The figures and summary.md are left out: they show clocks."""
    import csv

    found: dict[str, Any] = {}
    for path in sorted(Path(out).rglob("*")):
        name = path.relative_to(out).as_posix()
        if path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as fh:
                found[name] = [{k: v for k, v in row.items() if k not in CLOCKS}
                               for row in csv.DictReader(fh)]
        elif path.suffix == ".jsonl":
            found[name] = [{k: v for k, v in json.loads(line).items() if k not in CLOCKS}
                           for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        elif path.suffix == ".json":
            value = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in CLOCKS}
            found[name] = value
    return found
