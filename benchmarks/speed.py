"""Seconds per round: the batched engine, its matrix products alone, and the Flower simulation.

Measures, on the machine it runs on:

1. the engine on MNIST, P = 10, ObjP (eps-bar = 0.1), the papers' first setting;
2. the engine on a FEMNIST-shaped problem: P = 195 agents, 188 samples each, 784 x 62,
   ObjPM with E = 10 (eps-bar = 0.05); the data are random (the shape is what costs);
3. for each, the round's matrix products alone (X z and X^T (H - Y) per local step,
   batched over agents): the "roofline" floor of the round, and the ratio round / products;
4. the Flower simulation (`flwr run .`, Ray) with P = 195 SuperNodes on the embedded data.

Usage, from the project root:
    python -m benchmarks.speed [--rounds 5] [--device cpu|cuda] [--mnist-dir DIR] [--skip-flower]
                               [--seeds S] [--femnist-dir DIR]
Prints a Markdown table (and writes it with --markdown FILE). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dpadmm.config import RunConfig
from dpadmm.data import Dataset, load_dataset, load_mnist
from dpadmm.engine import EngineState, step
from dpadmm.federation import agent_data
from dpadmm.models import shared_bmm
from tests.conftest import stop_flwr_processes  # the same clean-up as the Flower tests

ROOT = Path(__file__).resolve().parents[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_seconds(config: RunConfig, dataset: Dataset, rounds: int, seeds: int = 1) -> tuple[float, float]:
    """(seconds per round of engine.step for a batch of ``seeds`` runs, seconds of its matrix products)."""
    data = agent_data(dataset, config, range(config.num_agents))
    device = data.x.device
    zeros = torch.zeros((seeds, config.num_agents, *data.shape), dtype=data.x.dtype, device=device)
    state = EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(), lam=zeros.clone())
    runs = list(range(seeds))
    step(config, data, state, 1, runs)  # warm-up
    _sync(device)
    started = time.perf_counter()
    for t in range(2, rounds + 2):
        step(config, data, state, t, runs)
    _sync(device)
    per_round = (time.perf_counter() - started) / rounds

    z = state.z_chain
    xt = data.x.transpose(1, 2)
    _sync(device)
    started = time.perf_counter()
    for _ in range(rounds):
        for _ in range(config.steps):
            shared_bmm(xt, shared_bmm(data.x, z))
    _sync(device)
    products = (time.perf_counter() - started) / rounds
    return per_round, products


def femnist_shaped(seed: int = 0) -> Dataset:
    """Random data of the papers' FEMNIST shape: 195 x 188 samples, 784 features, 62 classes."""
    gen = torch.Generator().manual_seed(seed)
    n = 195 * 188
    return Dataset(
        name="femnist-shaped",
        x_train=torch.rand(n, 784, generator=gen, dtype=torch.float64),
        y_train=torch.randint(0, 62, (n,), generator=gen),
        x_test=torch.rand(100, 784, generator=gen, dtype=torch.float64),
        y_test=torch.randint(0, 62, (100,), generator=gen),
        num_classes=62,
    )


def flower_seconds(rounds: int, agents: int) -> float:
    """Median seconds per round of `flwr run .` with ``agents`` SuperNodes (embedded data, ObjP)."""
    with tempfile.TemporaryDirectory() as tmp:
        home, out = Path(tmp) / "flwr-home", Path(tmp) / "run"
        env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0",
                   FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
        run_config = f"algorithm='objp' epsilon=0.1 num-agents={agents} rounds={rounds} out='{out}'"
        try:
            subprocess.run(["flwr", "run", ".", "--stream", "--run-config", run_config,
                            "--federation-config", f"num-supernodes={agents}"],
                           cwd=ROOT, env=env, check=True, capture_output=True, timeout=3600)
        finally:
            stop_flwr_processes(home)
        lines = (out / "metrics.jsonl").read_text().splitlines()
        seconds = sorted(json.loads(line)["seconds"] for line in lines)
        return seconds[len(seconds) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per engine measurement")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--mnist-dir", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--skip-flower", action="store_true", help="do not run the Flower simulation")
    parser.add_argument("--flower-rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=1,
                        help="runs batched per engine step (reproduce's seeds)")
    parser.add_argument("--femnist-dir", default="",
                        help="time the real FEMNIST (LEAF samples, 195 writers) instead of random data")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()

    rows = []
    mnist = RunConfig(algorithm="objp", epsilon=0.1, num_agents=10, dataset="mnist", data_dir=args.mnist_dir,
                      device=args.device, dtype=args.dtype)
    femnist = RunConfig(algorithm="objpm", epsilon=0.05, local_steps=10, num_agents=195, rho_preset="femnist",
                        device=args.device, dtype=args.dtype)
    if args.femnist_dir:
        femnist_data, femnist_label = load_dataset("femnist", args.femnist_dir, 195), "FEMNIST (LEAF samples)"
    else:
        femnist_data, femnist_label = femnist_shaped(), "FEMNIST-shaped"
    runs = f", {args.seeds} seeds batched" if args.seeds > 1 else ""
    for label, config, dataset in (
        (f"engine, MNIST P=10 ObjP (E=1){runs}", mnist, load_mnist(args.mnist_dir)),
        (f"engine, {femnist_label} P=195 ObjPM (E=10){runs}", femnist, femnist_data),
    ):
        per_round, products = engine_seconds(config, dataset, args.rounds, args.seeds)
        rows.append((label, per_round, products))
        print(f"{label}: {per_round:.3f} s/round, products {products:.3f} s", file=sys.stderr)
    if not args.skip_flower:
        per_round = flower_seconds(args.flower_rounds, 195)
        rows.append(("Flower simulation, P=195 ObjP (E=1), embedded data 784x10", per_round, None))

    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"device {args.device}, dtype {args.dtype}; {args.rounds} timed engine rounds.",
        "",
        "| what | seconds per round | matrix products alone | ratio |",
        "| --- | --- | --- | --- |",
    ]
    for label, per_round, products in rows:
        if products is None:
            lines.append(f"| {label} | {per_round:.3f} | | |")
        else:
            lines.append(f"| {label} | {per_round:.3f} | {products:.3f} | {per_round / products:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
