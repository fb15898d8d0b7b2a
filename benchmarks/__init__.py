"""Benchmark and comparison scripts (``python -m benchmarks.<name>``); never part of the test run.

A regular package, not a namespace one: Opacus 1.6.0's wheel installs a top-level ``benchmarks``
package of its own, which would otherwise shadow this folder.

What every script shares, here so that each reads its data and refuses its arguments the same way:

- Where the data sets are. The development machine keeps them in ``../shared/data`` beside the checkout
  (``$DPADMM_SHARED_DATA`` moves that folder, e.g. to an empty one to act as a fresh clone); a fresh clone
  has no such folder and reads dpadmm's cache instead (``$DPADMM_CACHE``, else ``~/.cache/dpadmm``), which
  ``dpadmm data fetch NAME`` fills. Both are laid out alike, ``<root>/<name>/...``, so a script's default is
  :func:`data_dir`: the shared folder's where it exists, so the runs on the development machine stay as
  they were, else the cache's.
- When a data set is in neither, the script stops before any work, output folder or process is made, with
  one line that names the ``dpadmm data fetch`` command and the flag that give it (:func:`require_data`).
  The scripts never download themselves: a benchmark that starts a download (minutes, or a traceback
  offline) in the middle of its set-up measures nothing.
- :class:`ArgumentParser` stops every refused argument in one line and exit status 2, without argparse's
  usage block, and :func:`check_folder` / :func:`check_file` refuse an output path that cannot be written
  before anything is: a benchmark that fails after an hour because ``--out`` was mistyped wastes the hour.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA_ENV = "DPADMM_SHARED_DATA"


# ----- where the data are -----

def shared_data() -> Path:
    """The development machine's data folder: ``$DPADMM_SHARED_DATA`` when set (and not empty), else
    ``../shared/data`` beside the checkout. It may not exist (a fresh clone)."""
    configured = os.environ.get(SHARED_DATA_ENV, "")
    return Path(configured).expanduser() if configured else ROOT.parent / "shared" / "data"


def data_dir(name: str, root: str | os.PathLike[str] = "") -> Path:
    """Data set ``name``'s folder: ``<root>/<name>`` when a root is given (a ``--data-root`` flag), else
    ``<shared data>/<name>`` where it exists, else its folder in dpadmm's cache
    (:func:`dpadmm.data.download.dataset_cache_dir`, which ``dpadmm data fetch NAME`` fills).

    Chosen per data set, not per root: a shared folder that lacks one data set leaves that one to the cache,
    where the ``dpadmm data fetch`` that :func:`missing_data` names puts it."""
    from dpadmm.data.download import dataset_cache_dir

    if os.fspath(root):
        return Path(root).expanduser() / name
    shared = shared_data() / name
    return shared if shared.is_dir() else dataset_cache_dir(name)


def missing_data(name: str, folder: str | os.PathLike[str], writers: int = 0) -> tuple[str, bool] | None:
    """What ``folder`` lacks of data set ``name``, or None when it holds the data set: a phrase ("not found
    in X", "incomplete in X: F missing", "in X: 114 writers, 195 needed") and whether ``dpadmm data fetch``
    supplies what is missing (not FEMNIST's writers: the cache's one LEAF sample has 114).

    FEMNIST's folder may be one LEAF sample, a folder of samples or several folders, comma-separated (its
    loader's forms); with ``writers`` > 0 they must hold that many writers, so that too few (the papers'
    P = 195 on the cache's sample) stop the script before its run rather than in it.
    """
    from dpadmm.data.download import dataset_cache_dir, missing_files

    shown = os.fspath(folder)
    parts = [p.strip() for p in shown.split(",") if p.strip()]
    if not parts or not all(Path(p).expanduser().exists() for p in parts):
        return f"not found in {shown or dataset_cache_dir(name)}", True
    if name != "femnist" or Path(shown) == dataset_cache_dir(name):  # the cache's own layout: every file
        lacking = [f.path for f in missing_files(name, shown)]
        if lacking:
            return (f"incomplete in {shown}: {', '.join(lacking[:2])}"
                    + (f" and {len(lacking) - 2} more" if len(lacking) > 2 else "") + " missing"), True
    if name == "femnist":
        from dpadmm.data.femnist import sample_folders, writer_sizes

        try:
            sample_folders(shown)
            found = len(writer_sizes(shown)) if writers else writers
        except (OSError, ValueError) as error:
            return f"unreadable in {shown}: {str(error).splitlines()[0]}", False
        if found < writers:
            return f"in {shown}: {found} writers, {writers} needed", False
    return None


def require_data(parser: argparse.ArgumentParser, needed: Iterable[tuple[str, str | os.PathLike[str], str]],
                 writers: dict[str, int] | None = None) -> None:
    """Stop (:meth:`ArgumentParser.error`: one line, exit 2) unless every (data set, folder, flag) of
    ``needed`` is there; ``writers``: FEMNIST's writers needed, per data set name (:func:`missing_data`).

    The line says, per flag, which data sets are missing where, the ``dpadmm data fetch`` commands that put
    them in the cache (the scripts' default where ../shared/data lacks them) and the flag that points
    elsewhere."""
    from dpadmm.data.download import cache_dir

    by_flag: dict[str, dict[tuple[str, str], bool]] = {}
    for name, folder, flag in needed:
        found = missing_data(name, folder, (writers or {}).get(name, 0))
        if found is not None:
            by_flag.setdefault(flag, {})[(name, found[0])] = found[1]
    reasons = []
    for flag, problems in by_flag.items():
        fetchable = list(dict.fromkeys(name for (name, _), fetch in problems.items() if fetch))
        what = "; ".join(f"{name} {problem}" for name, problem in problems)
        if fetchable:
            some = "them" if len(dict.fromkeys(name for name, _ in problems)) > 1 else "it"
            fetch = ", ".join(f"`dpadmm data fetch {name}`" for name in fetchable)
            reasons.append(f"{flag}: data set {what}: run {fetch} (into dpadmm's cache, {cache_dir()}), or "
                           f"give {flag} a folder that holds {some}")
        else:
            reasons.append(f"{flag}: data set {what}: give {flag} LEAF sample folders that hold enough "
                           "writers together (comma-separated; `dpadmm data fetch femnist` gets one sample, "
                           "114 writers), or run fewer agents")
    if reasons:
        parser.error("; ".join(reasons))


# ----- arguments -----

class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line on stderr (``<prog>: error: <message>``), exit status 2.

    argparse prints its usage block before the error; a benchmark's usage spans a screen, and the one line
    that says what is wrong is what a user (and a test) looks for.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(convert: Callable[[str], float], test: Callable[[float], bool], wanted: str
            ) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give {wanted}")
        return value

    return parse


positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
nonnegative_float = _number(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def number_list(parser: argparse.ArgumentParser, flag: str, text: str, convert: Callable[[str], float],
                test: Callable[[float], bool], wanted: str) -> list[Any]:
    """The comma-separated values of ``flag``, each converted and tested; one line and exit 2 otherwise."""
    try:
        values = [convert(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag} {text!r} is not a comma-separated list of {wanted}")
    if not values or not all(test(v) for v in values):
        parser.error(f"{flag} {text!r}: give one or more {wanted}")
    return values


def _unwritable(path: Path) -> str | None:
    """Why folder ``path`` cannot be made or written (None when it can), without making anything."""
    path = Path(os.path.abspath(path))
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def check_folder(parser: argparse.ArgumentParser, flag: str, path: str | os.PathLike[str]) -> None:
    """Stop in one line unless output folder ``path`` exists and is writable, or can be made."""
    why = _unwritable(Path(path))
    if why:
        parser.error(f"{flag} {os.fspath(path)}: cannot write there ({why})")


def check_file(parser: argparse.ArgumentParser, flag: str, path: str | os.PathLike[str],
               make_parent: bool = False) -> None:
    """Stop in one line unless output file ``path`` can be written: not a folder, in an existing writable
    folder (or, with ``make_parent``, one the script makes)."""
    path = Path(path)
    if path.is_dir():
        parser.error(f"{flag} {path}: is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        parser.error(f"{flag} {path}: cannot write there ({path} is not writable)")
    parent = Path(os.path.abspath(path)).parent
    if not make_parent and not parent.is_dir():
        parser.error(f"{flag} {path}: cannot write there ({parent} is not an existing folder)")
    why = _unwritable(parent)
    if why:
        parser.error(f"{flag} {path}: cannot write there ({why})")


def fail(prog: str, message: str, status: int = 1) -> NoReturn:
    """End the script with one line on stderr, ``<prog>: error: <message>``, and ``status``."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


# ----- the local SuperLink of a `flwr run` -----

LOCAL_SUPERLINK_WAIT = 180.0


def start_local_superlink(env: Mapping[str, str], timeout: float = LOCAL_SUPERLINK_WAIT) -> None:
    """Start the local SuperLink that ``flwr run`` would start for ``env`` and wait until it answers.

    ``flwr run`` against its local SuperLink starts one when nothing answers on
    ``$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, and gives it a fixed 15 s (``LOCAL_SUPERLINK_STARTUP_TIMEOUT``,
    not configurable) to answer; a machine busy with other runs misses that, and the run fails before any of
    it started. Started here first, as Flower starts it (its public flags, the same ``FLWR_HOME`` files and
    ports, no update check: Flower's CLI makes that one) and with a patient wait, the run finds it answering
    and uses it. The SuperLink runs in a session of its own with ``FLWR_HOME`` in its environment, so
    whatever stops the run's other processes (found by that variable) stops it too. A SuperLink that exits
    before it answers is started once more; a second exit, or no answer within ``timeout`` seconds, raises
    with the tail of its log.
    """
    home, port = Path(env["FLWR_HOME"]), env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    folder = home / "local-superlink"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "superlink.log"
    command = ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
               "--control-api-address", f"127.0.0.1:{env['FLWR_LOCAL_CONTROL_API_PORT']}",
               "--host", "127.0.0.1", "--port", port, "--database", str(folder / "state.db"),
               "--log-file", str(log)]
    deadline, state = time.monotonic() + timeout, "exited twice before it answered"
    for _ in range(2):
        process = subprocess.Popen(command, env={**env, "FLWR_DISABLE_UPDATE_CHECK": "1"},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        while process.poll() is None and time.monotonic() < deadline:
            if _answers(f"http://127.0.0.1:{port}/health"):
                return
            time.sleep(0.2)
        if process.poll() is None:
            process.kill()
            process.wait()
            state = f"did not answer within {timeout:g} s"
            break
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise RuntimeError(f"the local SuperLink on 127.0.0.1:{port} {state}; its log {log}:\n{tail}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.4) as response:
            return 200 <= response.status < 300
    except OSError:
        return False
