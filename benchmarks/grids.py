"""Wall time of a ``dpadmm reproduce`` grid run one cell after another against ``--workers N``.

Each mode runs the same ``dpadmm reproduce`` command (the arguments after ``--``) into a folder of its own,
from nothing, as a separate process, and is timed from start to exit; the modes that give each cell the
same threads are then checked to have written the same numbers (:func:`dpadmm.runs.grid.numbers`). Modes:

- ``seq``: one cell after another, one thread per cell (``dpadmm reproduce``'s default);
- ``seq-tN``: one cell after another, N threads per cell (one process using N cores, numbers that may
  differ in their last digits from one thread's);
- ``wN``: N cells at once on local Ray workers, one thread each (Ray's start included).

Usage: ``python -m benchmarks.grids --modes seq,seq-t2,w2 --json out.json -- --paper 002 --data-dir
../shared/data``; prints a Markdown table. A benchmark script, not a test; on a shared machine the times
are not comparable between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpadmm.runs.grid import numbers


def flags(mode: str) -> list[str]:
    """The ``dpadmm reproduce`` flags of a mode."""
    if mode == "seq":
        return []
    if (found := re.fullmatch(r"seq-t(\d+)", mode)):
        return ["--threads", found.group(1)]
    if (found := re.fullmatch(r"w(\d+)", mode)):
        return ["--workers", found.group(1)]
    raise SystemExit(f"mode {mode!r} is not allowed; give seq, seq-tN or wN")


def threads(mode: str) -> int:
    found = re.fullmatch(r"seq-t(\d+)", mode)
    return int(found.group(1)) if found else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="seq,w2",
                        help="comma-separated: seq, seq-tN, wN (default: seq,w2)")
    parser.add_argument("--work", default="", help="folder for the modes' outputs (default: a temporary one)")
    parser.add_argument("--json", default="", help="also write the timings here")
    parser.add_argument("reproduce", nargs=argparse.REMAINDER, help="-- then the dpadmm reproduce arguments")
    args = parser.parse_args()
    command = [a for a in args.reproduce if a != "--"]
    work = Path(args.work or tempfile.mkdtemp(prefix="dpadmm-grids-"))
    dpadmm = str(Path(sys.executable).with_name("dpadmm"))
    rows = []
    for mode in args.modes.split(","):
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
