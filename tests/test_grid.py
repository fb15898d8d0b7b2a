"""The grid runner (dpadmm.runs.grid): order, resuming, failures, checkpoints, and a lost Ray worker."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from dpadmm.files import write_atomic
from dpadmm.iadmm.reproduce import GridConfig, run_grid
from dpadmm.runs.grid import (
    SCRATCH,
    SUPERSEDED,
    Cell,
    CellsFailed,
    GridOptions,
    GridRunner,
    Workspace,
    incomplete,
    mark_report,
    mirror,
    numbers,
    pending_cells,
    snapshot,
)
from dpadmm.runs.memory import WORKER_ENV

ROOT = Path(__file__).resolve().parents[1]

QUIET = GridOptions(progress=False)


def _square(x: int, workspace: Workspace) -> dict[str, int]:
    (workspace.path / "note.txt").write_text(f"{x}\n")
    return {"x": x, "square": x * x}


def _square_after(x: int, marker: Path, workspace: Workspace) -> dict[str, int]:
    """Square x once ``marker`` exists (the driver writes it when another cell's result has reached it): an
    arrival order no machine's load can change."""
    deadline = time.monotonic() + 300
    while not marker.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{marker} never appeared")
        time.sleep(0.05)
    return _square(x, workspace)


def _malloc_settings(workspace: Workspace) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in WORKER_ENV}


def _broken(workspace: Workspace) -> None:
    (workspace.path / "failed.json").write_text('{"reason": "no data"}\n')
    raise RuntimeError("no data for this cell")


def _cells(xs: list[int], **kw: Any) -> list[Cell]:
    return [Cell(key=f"x={x}", run=functools.partial(_square, x), folder=f"cells/{x}", **kw) for x in xs]


@pytest.mark.slow  # starts Ray
def test_cells_run_in_scratch_folders_and_commit_in_order(tmp_path: Path) -> None:
    committed: list[tuple[str, Any]] = []
    logged: list[str] = []
    # the second cell waits until the third's result has reached the driver: on 2 workers the third arrives
    # first, and still commits last (a marker the third cell wrote itself, just before it returned, let the
    # second's result overtake the third's on a loaded machine)
    marker = tmp_path / "x=3 arrived"

    def log(line: str) -> None:
        logged.append(line)
        if line.startswith("x=3:") and line.endswith("complete"):
            marker.write_text("done\n")

    cells = _cells([1])
    cells.append(Cell(key="x=2", run=functools.partial(_square_after, 2, marker), folder="cells/2"))
    cells.append(Cell(key="x=3", run=functools.partial(_square, 3), folder="cells/3"))
    cells.append(Cell(key="malloc", run=_malloc_settings))
    with GridRunner(tmp_path, GridOptions(workers=2, progress=False), log=log) as runner:
        runner.run(cells, lambda cell, result: committed.append((cell.key, result)))
    runner.raise_failures()
    assert committed[:3] == [(f"x={x}", {"x": x, "square": x * x}) for x in (1, 2, 3)]
    assert committed[3] == ("malloc", WORKER_ENV)  # Ray started the workers with malloc keeping freed memory
    assert (tmp_path / "cells" / "2" / "note.txt").read_text() == "2\n"  # the scratch files came back
    assert not (tmp_path / ".grid").exists()  # nothing left waiting
    # x=3 arrived before x=2, waited for it, and was committed after it (x=1 may arrive at any point)
    arrivals = [line.split(":")[0] for line in logged if line.endswith("complete")]
    assert sorted(arrivals) == ["malloc", "x=1", "x=2", "x=3"]
    assert arrivals.index("x=3") < arrivals.index("x=2")

    # done cells are skipped; a result received but not committed (interrupted) is committed without a run
    (tmp_path / ".grid").mkdir()
    (tmp_path / ".grid" / "x=5.json").write_text(json.dumps({"key": "x=5", "identity": None,
                                                             "result": {"x": 5, "square": 25}}))
    committed.clear()
    logged.clear()
    with GridRunner(tmp_path, QUIET, log=logged.append) as runner:
        runner.run(_cells([1, 2, 3], done=True) + _cells([4, 5]),
                   lambda cell, result: committed.append((cell.key, result)))
    assert committed == [("x=4", {"x": 4, "square": 16}), ("x=5", {"x": 5, "square": 25})]
    assert sum("complete, skipped" in line for line in logged) == 3
    assert not any(line.startswith("x=5: running") for line in logged)

    # ... unless it was run with other settings
    (tmp_path / ".grid").mkdir()
    (tmp_path / ".grid" / "x=6.json").write_text(json.dumps({"key": "x=6", "identity": {"seeds": 3},
                                                             "result": {}}))
    with (pytest.raises(ValueError, match="x=6 run with other settings"),
          GridRunner(tmp_path, QUIET) as runner):
        runner.run(_cells([6]), lambda cell, result: None)
    with pytest.raises(ValueError, match="distinct keys"), GridRunner(tmp_path, QUIET) as runner:
        runner.run(_cells([7, 7]), lambda cell, result: None)


def test_a_failing_cell_is_reported_and_the_grid_goes_on(tmp_path: Path) -> None:
    committed: list[str] = []
    cells = [*_cells([1]), Cell(key="broken", run=_broken, folder="cells/broken"), *_cells([2])]
    with GridRunner(tmp_path, QUIET, log=lambda _: None) as runner:
        runner.run(cells, lambda cell, result: committed.append(cell.key))
    assert committed == ["x=1", "x=2"]
    assert [(f.key, f.error) for f in runner.failures] == [("broken", "RuntimeError: no data for this cell")]
    # its folder came back: it says what failed
    assert json.loads((tmp_path / "cells" / "broken" / "failed.json").read_text()) == {"reason": "no data"}
    with pytest.raises(CellsFailed, match=r"1 cell failed \(run the same command again to retry them; any "
                                          "others completed .*broken: RuntimeError: no data for this cell"):
        runner.raise_failures()


def test_a_call_that_stops_before_the_grids_end_leaves_its_report_marked_incomplete(tmp_path: Path) -> None:
    """Ctrl-C (here: in the commit of the second of three cells) leaves pending-cells.json naming the cells
    not committed; the report's first line says the grid is incomplete and how to resume (an interrupted
    grid's report once read as a finished one). The call that then reaches the grid's end removes the
    mark."""
    (tmp_path / "summary.md").write_text("# The report\n")

    def stop_at_2(cell: Cell, result: Any) -> None:
        if cell.key == "x=2":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), GridRunner(tmp_path, QUIET, log=lambda _: None) as runner:
        runner.run(_cells([1, 2, 3]), stop_at_2)
    assert pending_cells(tmp_path) == ["x=2", "x=3"]
    why = mark_report(tmp_path)
    assert why is not None and "2 cells of it not run: x=2, x=3; run the same command again" in why
    first = (tmp_path / "summary.md").read_text().splitlines()[0]
    assert first.startswith("> **Incomplete**: the last call stopped before the grid's end")

    with GridRunner(tmp_path, QUIET, log=lambda _: None) as runner:
        runner.run(_cells([1], done=True) + _cells([2, 3]), lambda cell, result: None)
    assert pending_cells(tmp_path) == []  # the grid's stages may go on: still marked until its end
    runner.raise_failures()
    assert pending_cells(tmp_path) is None and incomplete(tmp_path) is None


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="workers=0 is not allowed"):
        GridOptions(workers=0)
    with pytest.raises(ValueError, match="give one or the other"):
        GridOptions(workers=2, ray_address="auto")
    with pytest.raises(ValueError, match="threads=0 must be >= 1"):
        GridOptions(threads=0)
    assert GridOptions(workers=8).threads == 1  # the threads, and so the numbers, do not follow the workers


def test_a_snapshot_keeps_complete_log_lines_and_a_mirror_is_exact(tmp_path: Path) -> None:
    source = tmp_path / "a"
    (source / "seed-0").mkdir(parents=True)
    (source / "seed-0" / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"rou')  # mid-write
    (source / "checkpoint.pt").write_bytes(b"\x00\x01")
    (source / "checkpoint.pt.4242.tmp").write_bytes(b"half")  # an atomic write under way is not a file yet
    files = snapshot(source)
    assert files == {"checkpoint.pt": b"\x00\x01", "seed-0/metrics.jsonl": b'{"round": 1}\n{"round": 2}\n'}
    target = tmp_path / "b"
    (target / "old").mkdir(parents=True)
    (target / "old" / "stale.txt").write_text("from an earlier state")
    mirror(files, target)
    assert snapshot(target) == files and not (target / "old").exists()


def _mnist_grid(out: Path, mnist_dir: Path) -> GridConfig:
    """Two MNIST cells of 100 rounds, the first checkpoint at round 10: the kill below lands while the cell
    still runs (about 6 s of rounds on 2 idle cores; at 6 rounds the cell ended 0.3 s after its first
    checkpoint reached the driver, and on a loaded machine the driver saw the checkpoint after the end)."""
    return GridConfig(out=str(out), datasets=("mnist",), algorithms=("objt",), trust_radii=("paper",),
                      eps=(0.5, 1.0), seeds=1, rounds=100, eval_every=10, mnist_dir=str(mnist_dir))


@pytest.mark.slow  # starts Ray
def test_a_cell_whose_ray_worker_is_killed_resumes_from_its_checkpoint_to_the_same_numbers(
        tmp_path: Path, mnist_dir: Path) -> None:
    """Two cells on two local Ray workers, each checkpointing at every evaluation. The worker of the first
    is killed (SIGKILL, as a lost node) once its first checkpoint has reached the driver: the cell runs
    again on a new worker from that checkpoint, and the grid writes what a sequential run writes."""
    run_grid(_mnist_grid(tmp_path / "sequential", mnist_dir), QUIET, log=lambda _: None)

    logged: list[str] = []
    pids: dict[str, int] = {}

    def watch(line: str) -> None:
        logged.append(line)
        key = line.split(":")[0]
        started = re.search(r": started on \S+ pid (\d+)", line)
        if started:
            pids[key] = int(started.group(1))
        if key == "mnist-objt-eps0.5" and "checkpoint at" in line and not any("lost" in s for s in logged):
            os.kill(pids[key], signal.SIGKILL)

    options = GridOptions(workers=2, progress=False, checkpoint_seconds=0.001)
    run_grid(_mnist_grid(tmp_path / "ray", mnist_dir), options, log=watch)
    assert any(line.startswith("mnist-objt-eps0.5: its worker was lost") for line in logged), logged
    assert any(line.startswith("mnist-objt-eps0.5: resuming (attempt 2") for line in logged), logged
    # the killed worker's scratch folder was removed by the next cell to start on this machine
    assert not list(Path(tempfile.gettempdir()).glob(f"{SCRATCH}{pids['mnist-objt-eps0.5']}-*"))
    assert numbers(tmp_path / "ray") == numbers(tmp_path / "sequential")


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _count(steps: int, stalled: Path, workspace: Workspace) -> dict[str, Any]:
    """Count to ``steps``, a step every 0.1 s, each one checkpointed. An attempt that resumed from a
    checkpoint watches the stalled process (its pid in ``stalled``, the time it went on in
    ``stalled.continued``) and says how many seconds after it went on it had ended (None: not within three
    minutes)."""
    checkpoint = workspace.path / "count.txt"
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    continued = stalled.with_suffix(".continued")
    pid, went_on = (int(stalled.read_text()), float(continued.read_text())) if start else (0, 0.0)
    ended = None
    step = start
    while step < steps or (start and ended is None and time.time() - went_on < 180):
        time.sleep(0.1)
        if step < steps:
            step += 1
            write_atomic(checkpoint, f"{step}")
        if start and ended is None and _ended(pid):
            ended = round(time.time() - went_on, 1)
    return {"count": step, "resumed from": start, "stalled attempt ended after": ended}


def _grid_with_a_stalled_worker(out: str) -> None:
    """Run one counting cell on 2 local Ray workers and stall its worker (SIGSTOP) at its first
    checkpoint until the driver has counted it lost and run the cell again; prints the log and, last,
    the cell's result as JSON. Run in a fresh interpreter: Ray reads the keepalive settings that make a
    stalled worker count as lost within seconds (not minutes) when it first starts in a process."""
    os.environ.update({"RAY_grpc_client_keepalive_time_ms": "2000",  # Ray's names, lower case
                       "RAY_grpc_client_keepalive_timeout_ms": "2000"})
    stalled = Path(out) / "stalled.txt"
    cell = Cell(key="count", run=functools.partial(_count, 100, stalled), folder="count",
                checkpoint="count.txt")
    pids: list[int] = []

    def watch(line: str) -> None:
        print(line, flush=True)
        started = re.search(r"^count: started on \S+ pid (\d+)", line)
        if started:
            pids.append(int(started.group(1)))
        if line.startswith("count: checkpoint") and not stalled.exists():
            stalled.write_text(f"{pids[0]}")
            os.kill(pids[0], signal.SIGSTOP)
        if line.startswith("count: resuming (attempt 2"):
            os.kill(pids[0], signal.SIGCONT)
            stalled.with_suffix(".continued").write_text(f"{time.time()}")

    results: list[Any] = []
    with GridRunner(out, GridOptions(workers=2, progress=False), log=watch) as runner:
        runner.run([cell], lambda _, result: results.append(result))
    print(json.dumps(results[0]))


def _superseded_while_writing(scratch: str) -> None:
    """Fill ``scratch`` with files and end as a superseded attempt does while a thread keeps writing
    into the folder, a file every few microseconds (a cell's thread goes on until the process ends)."""
    import threading

    from dpadmm.runs import grid

    folder = Path(scratch)
    for k in range(200):
        (folder / f"metrics-{k}.json").write_text("{}")

    def write() -> None:
        k = 0
        while True:
            k += 1
            with contextlib.suppress(OSError):  # the folder is gone
                write_atomic(folder / f"checkpoint-{k % 7}.txt", f"{k}")

    threading.Thread(target=write, daemon=True).start()
    time.sleep(0.05)
    grid._end_superseded(folder)


def test_a_superseded_attempt_removes_its_folder_while_its_cell_still_writes_into_it(tmp_path: Path) -> None:
    """The folder goes whole though the cell's thread makes files in it to the last moment: removed
    in place, a file made during the walk would leave it behind."""
    for k in range(3):
        scratch = tmp_path / f"scratch-{k}"
        scratch.mkdir()
        code = f"import tests.test_grid as t; t._superseded_while_writing({str(scratch)!r})"
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == SUPERSEDED, done.stdout + done.stderr
        assert not list(tmp_path.glob(f"{scratch.name}*"))


@pytest.mark.slow  # starts Ray
def test_a_stalled_worker_counted_lost_ends_its_attempt_when_it_goes_on(tmp_path: Path) -> None:
    """A worker that Ray counts lost while it is alive (stalled here; a node cut off does the same) runs
    again elsewhere from its checkpoint; when the stalled process goes on, its cell learns that its
    attempt was superseded and ends the process, rather than count on to the end beside the new one."""
    code = f"import tests.test_grid as t; t._grid_with_a_stalled_worker({str(tmp_path)!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    logged = done.stdout.splitlines()
    assert any(line.startswith("count: its worker was lost") for line in logged), logged
    result = json.loads(logged[-1])
    assert result["count"] == 100 and result["resumed from"] > 0, result
    # it ended at its next question to the driver (one every ATTEMPT_SECONDS: 8 and 9 s after it went on,
    # 2 cores with one busy; 82 to 88 s with four such grids and three busy loops on 2 cores, its Ray
    # worker slow to learn where the actor that answers is); without the question it lives on
    assert result["stalled attempt ended after"] is not None, result
    stalled = int((tmp_path / "stalled.txt").read_text())
    assert not list(Path(tempfile.gettempdir()).glob(f"{SCRATCH}{stalled}-*"))  # it removed its folder
