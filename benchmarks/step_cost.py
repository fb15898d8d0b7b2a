"""The CPU of one private local step: DP-IADMM's against Opacus's DP-SGD step, same model and batch.

A private federated method pays for each local step with the per-sample gradients of its minibatch, their
clipping, the noise and the update. DP-IADMM's step (eq. (8) of Ryu and Kim, with the Poisson-sampled
clipped gradient and Gaussian noise of the main job, ``dpadmm.iadmm.local.objective_perturbation_round``)
and Opacus's (``GradSampleModule`` + ``DPOptimizer``, the recipe of Flower's Opacus example,
``dpfedavg_bench.baselines.dpsgd_local``) are timed on one agent holding the embedded sample's 4,000
training images, at a Poisson rate of 0.3: 1,200 images a step, as an agent of full MNIST's 6,000 at the
main job's rate 0.2 (``--sample-rate 0.00675``: about 27 images, as a FEMNIST writer's 133 at 0.2).
Each method runs E local steps from the model's initialisation (a round, without the server), in float32
on the same number of torch threads; the figure is the CPU time of the round over E (process CPU, so that
a busy machine's waiting is not counted), the minimum over ``--repeats`` rounds of each method, taken in
turn. DP-IADMM runs its defaults (``per-sample=auto``: factorized for the built-in
networks); ``--per-sample vmap`` times the per-sample gradients that torch.func materialises, as Opacus's
are.

Usage, from the project root (Opacus: ``pip install -e ".[compare]"``):

    python -m benchmarks.step_cost [--models small-cnn,scatter-cnn,mlp] [--steps 10] [--repeats 3]
        [--threads 1] [--per-sample auto|vmap|factorized] [--sample-rate 0.3] [--json FILE]

Prints a Markdown table; ``--json`` also writes the rows. Reads only the embedded sample (no data folder).
A benchmark script, not a test.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import ArgumentParser, check_file, positive_int
from dpadmm.iadmm.config import PER_SAMPLE, RunConfig
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.iadmm.local import objective_perturbation_round, oracle
from dpadmm.models.modules import build_model, initial_parameters, prepared

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "dpfedavg_app"))
from dpfedavg_bench.baselines import DpSgdConfig, dpsgd_local  # noqa: E402  (the app's own module)

# not the LEAF CNN: Opacus would hold 1,200 x 6.5 M per-sample gradients (31 GB)
MODELS = ("small-cnn", "scatter-cnn", "mlp")
IMAGES = 4000  # the embedded sample's training images, all one agent's
RATE = 0.3  # 1,200 of them a step
NOISE = 1.0  # noise multiplier of both (the cost does not depend on it)


def cpu_seconds(work: Callable[[], Any]) -> float:
    """The process CPU time that ``work()`` takes."""
    started = time.process_time()
    work()
    return time.process_time() - started


def ours(model: str, steps: int, per_sample: str, rate: float = RATE) -> tuple[Callable[[], Any], str]:
    """DP-IADMM's round of ``steps`` local steps for one agent of the embedded sample, as a callable, and the
    per-sample gradients it computes."""
    config = RunConfig(model=model, per_sample=per_sample, num_agents=1, sampling_rate=rate,
                       local_steps=steps, rounds=1, epsilon=1.0 / NOISE, target_epsilon=0.0, dtype="float32")
    dataset = load_for(config)
    data = agent_data(dataset, config, [0])
    module = build_model(model, dataset.num_features, dataset.num_classes).to(torch.float32)
    w = initial_parameters(module, config.seed, dtype=torch.float32)
    lam = {k: torch.zeros_like(v).unsqueeze(0) for k, v in w.items()}
    chain = {k: v.unsqueeze(0).clone() for k, v in w.items()}
    agent = oracle(config, data, module)
    return (lambda: objective_perturbation_round(config, agent, w, lam, chain, 1)), agent.per_sample


def theirs(model: str, steps: int, rate: float = RATE) -> Callable[[], Any]:
    """Opacus's DP-SGD round of ``steps`` steps on the same agent, as a callable."""
    from opacus import GradSampleModule

    dataset = load_for(RunConfig(model=model, num_agents=1))
    module = build_model(model, dataset.num_features, dataset.num_classes).to(torch.float32)
    # a fixed front end once, as both methods' runs compute it (not at each step: not a step's cost)
    x, y = prepared(module, dataset.x_train.to(torch.float32)), dataset.y_train
    private = GradSampleModule(module, loss_reduction="sum")
    params = initial_parameters(module, 0, dtype=torch.float32)
    config = DpSgdConfig(rounds=1, local_steps=steps, sample_rate=rate, clip_norm=1.0, lr=1.0,
                         noise_multiplier=NOISE)
    return lambda: dpsgd_local(private, module, params, x, y, config, 0, 1)


def measure(model: str, steps: int, repeats: int, per_sample: str, rate: float = RATE) -> dict[str, Any]:
    """One table row: the minimum CPU ms per step of each method over ``repeats`` rounds, taken in turn."""
    step, path = ours(model, steps, per_sample, rate)
    runs = {"ours": step, "opacus": theirs(model, steps, rate)}
    for run in runs.values():  # warm-up: first-call costs (allocations, Opacus's hooks) are not a step's
        run()
    best = {name: cpu_seconds(run) for name, run in runs.items()}
    for _ in range(repeats - 1):
        for name, run in runs.items():
            best[name] = min(best[name], cpu_seconds(run))
    module = build_model(model, 784, 10)
    return {"model": model, "parameters": sum(p.numel() for p in module.parameters()),
            "per-sample": path, "steps": steps, "sample-rate": rate,
            "ours-ms": 1000 * best["ours"] / steps, "opacus-ms": 1000 * best["opacus"] / steps,
            "ratio": best["ours"] / best["opacus"]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | parameters | DP-IADMM's per-sample gradients | DP-IADMM ms/step | Opacus ms/step | "
             "ratio |", "| --- | ---: | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['parameters']:,} | {r['per-sample']} | {r['ours-ms']:.1f} | "
              f"{r['opacus-ms']:.1f} | {r['ratio']:.2f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m benchmarks.step_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"models, of {', '.join(MODELS)}")
    parser.add_argument("--steps", type=positive_int, default=10, help="local steps per timed round")
    parser.add_argument("--repeats", type=positive_int, default=3, help="rounds of each method")
    parser.add_argument("--per-sample", default="auto", choices=PER_SAMPLE,
                        help="DP-IADMM's per-sample gradients (default: auto, the defaults')")
    parser.add_argument("--sample-rate", type=float, default=RATE,
                        help="Poisson rate on the agent's 4,000 images (default 0.3: 1,200 a step)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for model in models:
        if model not in MODELS:
            parser.error(f"model {model!r} is not allowed; choose from {', '.join(MODELS)}")
    if not 0.0 < args.sample_rate <= 1.0:
        parser.error(f"--sample-rate {args.sample_rate} is not allowed; it is a probability in (0, 1]")
    if args.json:
        check_file(parser, "--json", args.json)
    if importlib.util.find_spec("opacus") is None:
        parser.error("Opacus is not installed: pip install -e \".[compare]\"")
    torch.set_num_threads(args.threads)
    rows = [measure(model, args.steps, args.repeats, args.per_sample, args.sample_rate) for model in models]
    print(f"{platform.machine()}, {args.threads} torch thread(s), torch {torch.__version__}; CPU ms per "
          f"local step, minimum of {args.repeats} rounds of {args.steps} steps; Poisson batches of "
          f"{IMAGES * args.sample_rate:,.0f} images on average, float32")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
