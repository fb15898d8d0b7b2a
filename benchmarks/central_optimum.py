"""The floor of the papers' problem: its centralised minimiser, and the test error it reaches.

DP-IADMM and its baselines solve eq. (2c) of 003, min_w -(1/I) sum_i ln h_{y_i}(w; x_i) + beta ||w||^2 over
the multinomial logistic regression w [J, K] (no bias), with the agents' samples pooled. This script
minimises that objective directly, on all the training samples at once, with PyTorch's L-BFGS (strong Wolfe
line search, float64, from w = 0), and prints the objective, the gradient's norm and the train and test
errors of the minimiser: what a run of any of the algorithms converges to at best, on the same data the
engine loads (``dpadmm.iadmm.federation.load_for``: FEMNIST's first P writers, MNIST's standard split).

Usage: ``python -m benchmarks.central_optimum --dataset femnist --data-dir ../shared/data/femnist``
(five minutes on one core); ``--json FILE`` also writes the numbers; ``--max-iterations`` stops earlier.
``--data-dir`` defaults to ../shared/data/<dataset> where that folder exists, else dpadmm's cache (``dpadmm
data fetch femnist|mnist``); the script stops in one line when the data are in neither. The cache's FEMNIST
is one LEAF sample of 114 writers, fewer than the papers' P = 195: give ``--num-agents``. A benchmark
script, not a test.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks import ArgumentParser, check_file, data_dir, nonnegative_int, positive_int, require_data
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import load_for
from dpadmm.models.logistic import error_rate, training_loss


def minimise(x: torch.Tensor, y: torch.Tensor, num_classes: int, beta: float, *, tolerance: float = 1e-6,
             max_iterations: int = 3000, every: int = 100,
             report: Callable[[int, torch.Tensor], None] | None = None) -> tuple[torch.Tensor, int]:
    """The minimiser of eq. (2c) on (x, y) by L-BFGS, and the iterations it took: it stops when the
    gradient's largest entry is below ``tolerance``, when ``every`` iterations no longer change the
    objective, or after ``max_iterations``; ``report(iterations, w)`` is called every ``every`` iterations.
    With the papers' beta = 1e-6 the problem is barely regularised, so the last digits of the objective take
    thousands of iterations while the test error has long settled: the reports show it settle."""
    w = torch.zeros(x.shape[1], num_classes, dtype=x.dtype, requires_grad=True)
    optimizer = torch.optim.LBFGS([w], lr=1.0, max_iter=every, tolerance_grad=tolerance, tolerance_change=0.0,
                                  history_size=20, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = training_loss(x, y, w, beta, differentiable=True)
        loss.backward()
        return loss

    done, last = 0, math.inf
    while done < max_iterations:
        value = float(optimizer.step(objective).detach())
        done += every
        if report is not None:
            report(done, w.detach())
        if float(w.grad.abs().max()) < tolerance or value >= last:
            break
        last = value
    return w.detach(), done


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m benchmarks.central_optimum", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="femnist", choices=("default", "mnist", "femnist"),
                        help="default (the embedded sample), mnist or femnist")
    parser.add_argument("--data-dir", default=None,
                        help="the data set's folder (default: ../shared/data/<dataset> where it exists, else "
                             "dpadmm's cache; none for default)")
    parser.add_argument("--num-agents", type=nonnegative_int, default=0,
                        help="P (FEMNIST: its first P writers; 0: the data set's default)")
    parser.add_argument("--max-iterations", type=positive_int, default=3000,
                        help="L-BFGS iterations at most (default 3000)")
    parser.add_argument("--json", default="", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.json:
        check_file(parser, "--json", args.json)
    if args.dataset == "default":
        if args.data_dir:
            parser.error(f"--data-dir {args.data_dir}: dataset default (the embedded sample) reads no folder")
        folder = ""
    else:
        folder = str(data_dir(args.dataset) if args.data_dir is None else args.data_dir)
        agents = args.num_agents or RunConfig(dataset=args.dataset).num_agents
        require_data(parser, [(args.dataset, folder, "--data-dir")], writers={"femnist": agents})
    try:
        config = RunConfig(dataset=args.dataset, data_dir=folder, num_agents=args.num_agents)
        data = load_for(config)
    except ValueError as error:  # e.g. more agents than the data set's writers
        parser.error(str(error).splitlines()[0])
    x, y = data.x_train.double(), data.y_train
    started = time.perf_counter()
    def report(iterations: int, w: torch.Tensor) -> None:
        print(f"  {iterations} iterations: objective {training_loss(x, y, w, config.beta):.6f}, test error "
              f"{100 * error_rate(data.x_test.double(), data.y_test, w):.2f}%", flush=True)

    w, iterations = minimise(x, y, data.num_classes, config.beta, max_iterations=args.max_iterations,
                             every=min(100, args.max_iterations), report=report)
    seconds = time.perf_counter() - started
    w_grad = w.clone().requires_grad_(True)
    training_loss(x, y, w_grad, config.beta, differentiable=True).backward()
    result = {
        "dataset": args.dataset, "num-agents": config.num_agents, "training-samples": data.num_train,
        "test-samples": data.num_test, "beta": config.beta, "objective": training_loss(x, y, w, config.beta),
        "gradient-max": float(w_grad.grad.abs().max()), "iterations": iterations,
        "train-error": error_rate(x, y, w), "test-error": error_rate(data.x_test.double(), data.y_test, w),
        "seconds": round(seconds, 1),
    }
    print(f"{args.dataset} (P = {config.num_agents}, I = {data.num_train}, {data.num_test} test samples): "
          f"objective {result['objective']:.6f} (largest gradient entry {result['gradient-max']:.1e}, "
          f"{iterations} L-BFGS iterations, {seconds:.0f} s); "
          f"train error {100 * result['train-error']:.2f}%, test error {100 * result['test-error']:.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
