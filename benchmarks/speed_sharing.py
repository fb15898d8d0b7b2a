"""Time per round of ADMM sharing (paper 001): the engine against this machine's floors, and Flower's round.

One round of S runs and M parties (blocks stored zero-padded as [M, N, d]) reads every block twice: the
x-step's D_m^T (rho r_m - y) and the message D_m x_m, 4 N d M S dense flops in all. The rest is
small: the x-step's rotations by the eigenvectors (d^2 M S), the noise, and the z-step's Newton on
N S scalars. Its floors here:

- **read D twice**: two reductions over the padded blocks (``torch.sum``), the memory floor of any
  method that forms both products from the stored data;
- **dense FLOPs**: 4 N d M S flops at the rate of a 2048^3 float64 matrix product on this machine.

``--flower`` also runs the same configuration as a real `flwr run` simulation (one SuperNode per
party, a fresh FLWR_HOME and private SuperLink ports, every process stopped at the end) and reports
the strategy's ``seconds`` per round (from sending s - z and y to the new z and y; evaluations
excluded), rounds 2..R, next to the engine's round for S = 1.

Usage: ``python -m benchmarks.speed_sharing [--data-root ../shared/data] [--runs 1,3] [--threads 2]
[--flower]``; prints Markdown tables (medians of ``--repeats`` timings of ``--rounds`` rounds). Without
``--data-root`` each data set (a9a; MNIST for mnist-4v9) is read from ../shared/data/<name> where that folder
exists, else from dpadmm's cache (``dpadmm data fetch a9a``, ``dpadmm data fetch mnist``); the script stops in
one line, before any timing, when one is in neither.
A benchmark script, not a test; on a shared machine the times are not comparable between runs.
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import (
    ArgumentParser,
    data_dir,
    number_list,
    positive_float,
    positive_int,
    require_data,
    start_local_superlink,
)
from benchmarks.flower_overhead import ROOT, flwr_env
from benchmarks.speed_linadmm import _median_seconds, gemm_rate
from dpadmm.runs.results import read_metrics
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig
from dpadmm.sharing.reproduce import FOLDERS, PAPER_PARTIES
from tests.conftest import stop_flwr_processes, toml_value  # the clean-up of the Flower tests


def config_for(dataset: str, data_root: str, rounds: int, noise: str) -> SharingConfig:
    """A private run (eps = 1 per round) of 001's split of ``dataset``, its data under ``data_root`` (empty:
    :func:`benchmarks.data_dir`'s default)."""
    return SharingConfig(epsilon=1.0, noise=noise, rounds=rounds, dataset=dataset,
                         data_dir=str(data_dir(FOLDERS[dataset], data_root).resolve()),
                         parties=PAPER_PARTIES[dataset])


def measure(config: SharingConfig, problem: engine.Problem, runs: int, repeats: int, rate: float
            ) -> dict[str, float]:
    """Milliseconds per round of S = ``runs`` runs (no evaluation), and the floors."""
    seeds = list(range(runs))
    std = privacy.noise_std(config, problem.num_samples)

    def rounds() -> None:
        state = engine.initial_state(problem, runs)
        for t in range(1, config.rounds + 1):
            state = engine.iterate(problem, state, config, seeds, t, std)

    rounds()  # warm-up
    m, n, d = problem.parties.blocks.shape
    read = _median_seconds(lambda: problem.parties.blocks.sum(), max(repeats, 5))
    return {"ms": 1e3 * _median_seconds(rounds, repeats) / config.rounds, "read": 1e3 * 2 * read,
            "flops": 1e3 * 4 * n * d * m * runs / rate, "n": n, "d": d, "m": m}


def flower_seconds(config: SharingConfig, work: Path, timeout: float) -> list[float]:
    """The strategy's seconds of each round of a real `flwr run` simulation of ``config`` (every round
    evaluated, so that each has its line in metrics.jsonl)."""
    out = work / "run"
    keys = {k: v for k, v in config.to_mapping().items() if k != "algorithm"}
    keys.update({"eval-every": 1, "out": str(out)})
    run_config = "algorithm='admm-sharing' " + " ".join(f"sharing.{k}={toml_value(v)}"
                                                       for k, v in keys.items())
    home = work / "flwr-home"
    env = flwr_env(home)
    command = ["flwr", "run", str(ROOT), "--stream", "--run-config", run_config, "--federation-config",
               f"num-supernodes={len(config.widths)} client-resources-num-cpus=1"]
    print(f"[flower] {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        start_local_superlink(env)
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        stop_flwr_processes(home)
    if done.returncode != 0:
        raise RuntimeError(f"flwr run exited with {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return [float(r["seconds"]) for r in read_metrics(out)]


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m benchmarks.speed_sharing", description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="",
                        help="folder with a9a/ and mnist/ (default: ../shared/data/<name> where it exists, "
                             "else dpadmm's cache)")
    parser.add_argument("--datasets", default="a9a,mnist-4v9")
    parser.add_argument("--runs", default="1,3", help="comma-separated batch sizes S (seeds)")
    parser.add_argument("--noise", default="message", choices=("message", "paper"))
    parser.add_argument("--rounds", type=positive_int, default=20)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    parser.add_argument("--flower", action="store_true", help="also time a real `flwr run` of each data set")
    parser.add_argument("--timeout", type=positive_float, default=900,
                        help="seconds allowed to each `flwr run`")
    args = parser.parse_args(argv)
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not datasets or set(datasets) - set(FOLDERS):
        parser.error(f"--datasets {args.datasets!r}: choose from {', '.join(FOLDERS)}")
    batches = number_list(parser, "--runs", args.runs, int, lambda s: s >= 1, "batch sizes (integers >= 1)")
    if args.flower and args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: --flower times rounds 2..R, so at least 2")
    require_data(parser, [(FOLDERS[d], str(data_dir(FOLDERS[d], args.data_root)), "--data-root")
                          for d in datasets])
    torch.set_num_threads(args.threads)
    rate = gemm_rate()
    print(f"float64 GEMM: {rate / 1e9:.1f} GFLOP/s on {args.threads} thread(s); {args.noise} noise; load "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| data | M x N x d | S | ms/round | floor: read D twice | floor: dense FLOPs | "
          "round / read floor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    engine_ms = {}
    for dataset in datasets:
        config = config_for(dataset, args.data_root, args.rounds, args.noise)
        problem = engine.load(config)
        for runs in batches:
            row = measure(config, problem, runs, args.repeats, rate)
            engine_ms[(dataset, runs)] = row["ms"]
            print(f"| {dataset} | {row['m']} x {row['n']} x {row['d']} | {runs} | {row['ms']:.2f} | "
                  f"{row['read']:.2f} | {row['flops']:.2f} | {row['ms'] / row['read']:.1f} |", flush=True)
    if not args.flower:
        return
    print("\n| data | parties | Flower s/round (median, rounds 2..R) | min | engine s/round (S = 1) | "
          "Flower / engine |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for dataset in datasets:
        config = config_for(dataset, args.data_root, args.rounds, args.noise)
        with tempfile.TemporaryDirectory(prefix="speed-sharing-") as work:
            seconds = flower_seconds(config, Path(work), args.timeout)[1:]
        ours = engine_ms.get((dataset, 1), math.nan) / 1e3
        median = statistics.median(seconds)
        print(f"| {dataset} | {len(config.widths)} | {median:.3f} | {min(seconds):.3f} | {ours:.4f} | "
              f"{median / ours:.0f} |", flush=True)


if __name__ == "__main__":
    main()
