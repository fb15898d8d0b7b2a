"""Time per iteration of the DP-ADMM / DP-AccADMM engine (paper 002) against this machine's floors.

One iteration of a batch of S runs reads the data matrix X [n, d] twice (the margins X x and
the gradient X^T c), does 4 n d S dense flops there, and touches A ([E + d, d], small) a few
times. Its floors here:

- **read X twice**: two reductions over X (``torch.sum``), the memory floor of any method that
  forms the full-batch gradient from the dense data;
- **dense FLOPs**: 4 n d S flops at the rate of a 2048^3 matrix product on this machine.

Usage: ``python -m benchmarks.speed_linadmm [--data-root ../shared/data] [--runs 1,5] [--threads 1]``;
prints a Markdown table (the medians of ``--repeats`` timings of ``--iterations`` iterations). Without
``--data-root`` each data set is read from ../shared/data/<name> where that folder exists, else from dpadmm's
cache (``dpadmm data fetch NAME``; bio_train has no public download, the command says how to get it); the
script stops in one line, before any timing, when one is in neither.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from benchmarks import ArgumentParser, data_dir, number_list, positive_int, require_data
from dpadmm.catalog import BINARY_DATASET_NAMES
from dpadmm.linadmm import engine
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import load
from dpadmm.models import binary


def _median_seconds(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def gemm_rate(repeats: int = 3) -> float:
    """Flops per second of a float64 2048^3 matrix product here."""
    a = torch.randn(2048, 2048, dtype=torch.float64)
    a @ a  # warm-up
    return 2 * 2048**3 / _median_seconds(lambda: a @ a, repeats)


def measure(name: str, folder: str, runs: int, iterations: int, repeats: int,
            rate: float) -> dict[str, float]:
    """Milliseconds per iteration of S = ``runs`` private DP-AccADMM runs on data set ``name`` (in
    ``folder``), and the floors."""
    problem = load(name, folder, 0.3)
    config = LinAdmmConfig(algorithm="dp-accadmm", target_epsilon=0.05, rounds=iterations, dataset=name)
    constants = engine.settings(config, problem.a)
    seeds = list(range(runs))
    n, d = problem.num_samples, problem.num_features
    sigma = 0.01

    def run() -> None:
        state = engine.initial_state(config, problem.a, runs)
        for t in range(1, iterations + 1):
            point = engine.query_point(state, constants.accelerated)
            total = binary.clipped_gradient_sum(problem.features, problem.labels, point, 1.0,
                                                problem.row_norms)
            state, _ = engine.iterate(problem.a, state, engine.release(total, n, seeds, t, sigma), constants)

    run()  # warm-up (the graph is cached, the allocator warm)
    per_iteration = _median_seconds(run, repeats) / iterations
    read = _median_seconds(lambda: problem.features.sum(), max(repeats, 5))
    return {"ms": 1e3 * per_iteration, "read": 1e3 * 2 * read, "flops": 1e3 * 4 * n * d * runs / rate,
            "n": n, "d": d, "edges": len(problem.edges)}


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m benchmarks.speed_linadmm", description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="",
                        help="folder with a9a/, a8a/, ijcnn1/, bio_train/ (default: ../shared/data/<name> "
                             "where it exists, else dpadmm's cache)")
    parser.add_argument("--datasets", default=",".join(BINARY_DATASET_NAMES))
    parser.add_argument("--runs", default="1,5", help="comma-separated batch sizes S (seeds)")
    parser.add_argument("--iterations", type=positive_int, default=50)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    if not names or set(names) - set(BINARY_DATASET_NAMES):
        parser.error(f"--datasets {args.datasets!r}: choose from {', '.join(BINARY_DATASET_NAMES)}")
    batches = number_list(parser, "--runs", args.runs, int, lambda s: s >= 1, "batch sizes (integers >= 1)")
    folders = {name: str(data_dir(name, args.data_root)) for name in names}
    require_data(parser, [(name, folder, "--data-root") for name, folder in folders.items()])
    torch.set_num_threads(args.threads)
    rate = gemm_rate()
    print(f"float64 GEMM: {rate / 1e9:.1f} GFLOP/s on {args.threads} thread(s)\n")
    print("| data | n x d | edges | S | ms/iteration | floor: read X twice | floor: dense FLOPs | "
          "iteration / read floor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        for runs in batches:
            m = measure(name, folders[name], runs, args.iterations, args.repeats, rate)
            floor = max(m["read"], m["flops"])
            print(f"| {name} | {m['n']} x {m['d']} | {m['edges']} | {runs} | {m['ms']:.2f} | "
                  f"{m['read']:.2f} | {m['flops']:.2f} | {m['ms'] / floor:.1f} |")


if __name__ == "__main__":
    main()
