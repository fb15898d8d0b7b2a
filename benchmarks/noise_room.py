"""The noise room of the main job's step, measured: DP-IADMM's defaults under several rooms, on the validation
half.

The main job's local steps take the learning rate min(R, room / r) (``dpadmm.iadmm.schedules.noise_damping``):
r is one step's noise over its largest clean gradient, fixed by the budget before training, and the room
(``noise-room``; 0, the default, is the model's: ``RunConfig.noise_room_for``) is how large the rate may
be against it. This script trains the defaults (what ``dpadmm train --target-epsilon E`` runs on the model
study's settings of ``benchmarks.compare_dp``: its data, agents and model, in float32) under each room given,
at each eps, and scores every run on the *validation* half of the test set, the half the model study tunes
on: the rooms are chosen from this table, and the test half, which the study reports, plays no part.
Use seeds the study does not report (10 and up).

Every run is appended to ``runs.jsonl`` in ``--out`` and skipped by a later call (a call may add rooms,
seeds or settings); ``table.md`` is written from all of them: the mean validation error per setting, room
and eps, and each room's paired difference from the setting's default room over the seeds both ran, with
its standard error.

Usage, from the project root::

    python -m benchmarks.noise_room [--settings main/logistic,main/mlp,main/small-cnn] [--rooms 0,10,15,20]
        [--eps 1,2,4,8] [--seeds 10,11,...,21] [--out docs/results/noise-room]

The main job's settings read the embedded sample (no data folder); the MNIST ones read ``--mnist-dir``, the
FEMNIST ones ``--femnist-dir``.
A benchmark script, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import ArgumentParser, check_folder, number_list
from benchmarks.compare_dp import (
    STUDY,
    Context,
    add_data_arguments,
    defaults_fingerprint,
    errors,
    iadmm_config,
    load_context,
    require_settings_data,
)
from dpadmm.iadmm import engine
from dpadmm.runs import references as bibliography

SETTINGS = ("main/logistic", "main/mlp", "main/small-cnn")  # the defaults' study on the main job's data
REFERENCES = ("003", "abadi2016")


def default_room(setting: str) -> float:
    """The room DP-IADMM's defaults take on a setting today (its model's, for its agents and classes)."""
    return defaults_fingerprint(setting)["noise-room"]


def measure(ctx: Context, room: float, epsilon: float, seeds: list[int]) -> list[dict[str, Any]]:
    """The defaults at ``epsilon`` under ``room`` (> 0) for each seed (batched: one engine call)."""
    config = dataclasses.replace(iadmm_config(ctx, {"defaults": 1}, epsilon), noise_room=room)
    started = time.perf_counter()
    results = engine.run_seeds(config, seeds, dataset=ctx.data, write=False, progress=False)
    seconds = (time.perf_counter() - started) / len(seeds)
    records = []
    for seed, result in zip(seeds, results, strict=True):
        w = result.model if isinstance(result.model, dict) else {"weight": result.model}
        records.append({"setting": ctx.dataset, "room": room, "epsilon": epsilon, "seed": seed,
                        "val-error": errors(ctx, w)["val-error"], "default-room": default_room(ctx.dataset),
                        "seconds": seconds})
    return records


def _cell(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ({len(values)})" if values else "-"


def table(runs: list[dict[str, Any]]) -> str:
    """Mean validation error (%) per setting, room and eps, and each room's paired difference from the
    setting's default room (the current default: a room recorded as the default by an earlier version is
    compared as any other)."""
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    eps = sorted({r["epsilon"] for r in runs})
    head = "| setting | room | " + " | ".join(f"eps = {e:g}" for e in eps) + " |"
    rule = "| --- | --- | " + " | ".join("---" for _ in eps) + " |"
    means, diffs = [head, rule], [head, rule]
    for setting in settings:
        group = [r for r in runs if r["setting"] == setting]
        default = default_room(setting)  # today's, whatever a run recorded
        for room in sorted({r["room"] for r in group}):
            label = f"{room:.4g}" + (" (default)" if room == default else "")
            cells, paired = [], []
            for e in eps:
                here, base = ({r["seed"]: 100 * r["val-error"] for r in group
                               if r["room"] == x and r["epsilon"] == e} for x in (room, default))
                cells.append(_cell(list(here.values())))
                both = sorted(set(here) & set(base))
                if room == default or len(both) < 2:
                    paired.append("-")
                    continue
                d = [here[s] - base[s] for s in both]
                paired.append(f"{statistics.mean(d):+.2f} +- {statistics.stdev(d) / math.sqrt(len(d)):.2f}")
            means.append(f"| {setting} | {label} | " + " | ".join(cells) + " |")
            if room != default:
                diffs.append(f"| {setting} | {label} | " + " | ".join(paired) + " |")
    return ("Validation error (%), mean over the seeds run (their number in brackets):\n\n" + "\n".join(means)
            + "\n\nEach room minus the setting's default room, paired by seed (mean +- its standard error; "
              "negative: fewer errors than the default):\n\n" + "\n".join(diffs) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m benchmarks.noise_room", description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"the model study's settings (of {', '.join(STUDY)})")
    parser.add_argument("--rooms", default="0,10,15,20", help="noise rooms (0: each setting's default)")
    parser.add_argument("--eps", default="1,2,4,8", help="whole-run epsilons per agent, at delta 1e-5")
    parser.add_argument("--seeds", default=",".join(str(s) for s in range(10, 22)),
                        help="seeds (the model study reports 1-10 and tunes on 0)")
    parser.add_argument("--out", default="docs/results/noise-room")
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in STUDY]
    if unknown or not settings:
        parser.error(f"--settings {','.join(unknown)!r} is not allowed; choose from {', '.join(STUDY)}")
    given = number_list(parser, "--rooms", args.rooms, float, lambda v: 0 <= v < math.inf,
                        "finite rooms >= 0 (0: each setting's default)")
    eps = number_list(parser, "--eps", args.eps, float, lambda v: 0 < v < math.inf, "finite epsilons > 0")
    seeds = number_list(parser, "--seeds", args.seeds, int, lambda v: 0 <= v < 2**32, "seeds (integers >= 0)")
    out = Path(args.out)
    check_folder(parser, "--out", out)
    log = out / "runs.jsonl"
    try:
        runs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        done = {(r["setting"], r["room"], r["epsilon"], r["seed"]) for r in runs}
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"--out {out}: {log} is not this script's runs.jsonl ({error})")
    require_settings_data(parser, settings, args)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # one thread per process: fastest on a shared 2-core machine
    for setting in settings:
        ctx = load_context(setting, argparse.Namespace(**vars(args)), out)
        for room in dict.fromkeys(room or default_room(setting) for room in given):
            for e in eps:
                todo = [s for s in seeds if (setting, room, e, s) not in done]
                if not todo:
                    continue
                records = measure(ctx, room, e, todo)
                with log.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in records)
                runs.extend(records)
                mean = statistics.mean(100 * r["val-error"] for r in records)
                print(f"{setting} room {room:g} eps {e:g}: validation error {mean:.2f}% over "
                      f"{len(records)} seeds, {records[0]['seconds']:.0f} s a run", flush=True)
    (out / "table.md").write_text(
        "# The step rule's noise room, measured\n\nGenerated by `python -m benchmarks.noise_room` on "
        f"{platform.machine()}, torch {torch.__version__}, one thread: DP-IADMM's defaults (`dpadmm train "
        "--target-epsilon E`: T = 10 rounds of E = 10 local steps, q = 0.2, C = 1, float32) on the model "
        "study's settings, whole-run (eps, 1e-5) per agent, each under a given `noise-room`; test error on "
        "the validation half of the test set, the half the model study tunes on.\n\n"
        + table(runs) + "\n" + "\n".join(bibliography.section(REFERENCES)) + "\n")
    print(f"wrote {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
