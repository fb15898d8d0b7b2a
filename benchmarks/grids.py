"""Wall time of a ``dpadmm reproduce`` grid run one cell after another against ``--workers N``.

Each mode runs the same ``dpadmm reproduce`` command (the arguments after ``--``) into a folder of its own,
from nothing, as a separate process, and is timed from start to exit; the modes that give each cell the
same threads are then checked to have written the same numbers (:func:`dpadmm.runs.grid.numbers`). Modes:

- ``seq``: one cell after another, one thread per cell (``dpadmm reproduce``'s default);
- ``seq-tN``: one cell after another, N threads per cell (one process using N cores, numbers that may
  differ in their last digits from one thread's);
- ``wN``: N cells at once on local Ray workers, one thread each (Ray's start included).

Usage: ``python -m benchmarks.grids --modes seq,seq-t2,w2 --json out.json -- --paper 002 --data-dir
../shared/data``; prints a Markdown table. The data are ``dpadmm reproduce``'s: the data flags after ``--``
are passed on as given, and without them it reads dpadmm's cache (``dpadmm data fetch NAME`` fills it). The
modes, the output paths and the ``dpadmm reproduce`` arguments are checked, and the data sets they read
looked for, before the first mode runs: each refusal is one line and exit status 2. A benchmark script, not
a test; on a shared machine the times are not comparable between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ArgumentParser, check_file, check_folder, require_data
from dpadmm.runs.grid import numbers

PROG = "python -m benchmarks.grids"


def flags(mode: str) -> list[str]:
    """The ``dpadmm reproduce`` flags of a mode; ValueError for a mode that is none of seq, seq-tN, wN."""
    if mode == "seq":
        return []
    if (found := re.fullmatch(r"seq-t([1-9]\d*)", mode)):
        return ["--threads", found.group(1)]
    if (found := re.fullmatch(r"w([1-9]\d*)", mode)):
        return ["--workers", found.group(1)]
    raise ValueError(f"mode {mode!r} is not allowed; give seq, seq-tN or wN (N >= 1)")


def reproduce_data(command: list[str]) -> list[tuple[str, str, str]]:
    """(data set, folder, flag) of every data set ``dpadmm reproduce <command>`` reads, the arguments parsed
    by dpadmm's own parser: its folder flags as given, else dpadmm's cache (reproduce's default). ValueError
    (one line) when dpadmm refuses the arguments."""
    from dpadmm import cli
    from dpadmm.data.download import dataset_cache_dir
    from dpadmm.sharing.reproduce import FOLDERS

    argv = ["reproduce", *command]
    parser = cli.build_parser(paper=cli._paper_in(argv))  # the --paper peek `dpadmm` itself makes
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parser.parse_args(argv)
    except SystemExit as stop:
        if stop.code == 0:  # -h given after --: reproduce's help was printed
            raise
        lines = captured.getvalue().strip().splitlines()
        raise ValueError(f"dpadmm reproduce refuses {shlex.join(command)!r}: "
                         f"{lines[-1] if lines else stop.code}") from None

    def under(root: str, name: str) -> tuple[str, str, str]:
        return name, str(Path(root) / name) if root else str(dataset_cache_dir(name)), "--data-dir"

    names = [d.strip() for d in getattr(args, "datasets", "").split(",") if d.strip()]
    if args.paper == "003":
        if "femnist" in names and not args.femnist_dir:
            raise ValueError("dpadmm reproduce's femnist cells need --femnist-dir after --: LEAF sample "
                             "folders with 195 writers, e.g. ../shared/data/femnist")
        return [(n, (args.mnist_dir if n == "mnist" else args.femnist_dir) or str(dataset_cache_dir(n)),
                 f"--{n}-dir") for n in names if n in ("mnist", "femnist")]
    if args.paper == "002":
        return [under(args.data_dir, n) for n in names]
    if args.paper == "001":  # mnist-4v9 reads mnist/
        return [under(args.data_dir, FOLDERS.get(n, n)) for n in names]
    return [("adult", args.data_dir or str(dataset_cache_dir("adult")), "--data-dir")]  # 004


def threads(mode: str) -> int:
    found = re.fullmatch(r"seq-t(\d+)", mode)
    return int(found.group(1)) if found else 1


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="seq,w2",
                        help="comma-separated: seq, seq-tN, wN (default: seq,w2)")
    parser.add_argument("--work", default="", help="folder for the modes' outputs (default: a temporary one)")
    parser.add_argument("--json", default="", help="also write the timings here")
    parser.add_argument("reproduce", nargs=argparse.REMAINDER, help="-- then the dpadmm reproduce arguments")
    args = parser.parse_args(argv)
    command = [a for a in args.reproduce if a != "--"]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        if not modes:
            raise ValueError("give one or more of seq, seq-tN, wN")
        for mode in modes:
            flags(mode)
    except ValueError as error:
        parser.error(f"--modes {args.modes!r}: {error}")
    if len(set(modes)) != len(modes):
        parser.error(f"--modes {args.modes!r}: a mode given twice would run into its own folder")
    if args.work:
        check_folder(parser, "--work", args.work)
    if args.json:
        check_file(parser, "--json", args.json)
    try:
        needed = reproduce_data(command)
    except ValueError as error:
        parser.error(str(error))
    require_data(parser, needed, {"femnist": 195})  # reproduce's FEMNIST cells: the papers' P = 195
    work = Path(args.work or tempfile.mkdtemp(prefix="dpadmm-grids-"))
    dpadmm = str(Path(sys.executable).with_name("dpadmm"))
    rows = []
    for mode in modes:
        out = work / mode
        run = [dpadmm, "reproduce", *command, "--out", str(out), "--no-estimate", "--no-progress",
               *flags(mode)]
        print(f"$ {shlex.join(run)}", flush=True)
        started = time.perf_counter()
        done = subprocess.run(run, capture_output=True, text=True, env=dict(os.environ))
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{mode} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        cells = sum(line.endswith(": complete") for line in done.stdout.splitlines())
        rows.append({"mode": mode, "flags": " ".join(flags(mode)), "seconds": round(seconds, 1),
                     "cells": cells, "threads": threads(mode)})
        print(f"{mode}: {seconds:.1f} s, {cells} cells", flush=True)
    base = rows[0]
    reference: dict[int, dict] = {}  # the numbers of the first mode at each thread count
    for row in rows:
        reference.setdefault(row["threads"], numbers(work / row["mode"]))
    print(f"\n`dpadmm reproduce {shlex.join(command)}`, {os.cpu_count()} cores\n")
    print(f"| mode | flags | cells | wall (s) | speed-up over {base['mode']} | numbers |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        same = numbers(work / row["mode"]) == reference[row["threads"]]
        first = next(r["mode"] for r in rows if r["threads"] == row["threads"])
        row["same_numbers_as"] = first if same else ""
        row["speedup"] = round(base["seconds"] / row["seconds"], 2)
        verdict = ("-" if first == row["mode"] else f"equal to {first}'s" if same
                   else f"DIFFER from {first}'s")
        print(f"| {row['mode']} | {row['flags'] or '(none)'} | {row['cells']} | {row['seconds']:.1f} | "
              f"{row['speedup']:.2f}x | {verdict} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "cores": os.cpu_count(), "modes": rows},
                                              indent=2) + "\n")


if __name__ == "__main__":
    main()
