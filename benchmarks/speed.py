"""Seconds per round of the batched engine, against the hardware's floor and a plain NumPy implementation.

Measures, on the machine it runs on, for each engine row:

1. **round**: ``dpadmm.iadmm.engine.step`` (the server's w and lambda updates and every agent's E local steps
   with their noise; no central evaluation), after one warm-up round;
2. **gradient**: the round's E gradient calls alone, as the engine makes them (on a CPU the fused kernel
   of :mod:`dpadmm.native`: both products, the softmax and the clipping in one pass over the nonzero
   pixels; elsewhere torch's batched products);
3. **BLAS**: the round's two dense products per step (X z and X^T R, batched over agents: what a plain
   GEMM of the same shapes costs);
4. **floors**: the time to read X once per step (a reduction over X: the memory floor of any method
   that reads the dense data once per step; on CUDA plus one write of the round's noise), and the
   round's dense FLOPs (4 P I J K per step and run) at the rate of a large square GEMM on this
   machine (the compute floor of the dense products; a sparse method can go below it);
5. **NumPy**: ``benchmarks.numpy_reference``, the same algorithm written plainly with NumPy, on the same
   data, in the same run (on the CPU, whatever the engine's device);
6. on CUDA, the **kernel launches** of one round (torch.profiler);

and the keyed noise's rate, the engine's path against the portable torch one.

With ``--draws``, instead: the two kinds of randomness (``dpadmm.privacy.randomness``) side by side, on
one core: millions of variates per second of the keyed draw (simulation) and of the secret grid release
(deployment: ChaCha20, rounding, discrete Laplace / Gaussian), for one main-job step (d = 7,850) and for
a million coordinates; the Poisson sample's mask; and one agent's local step of the main job on MNIST
with each.

Rows: MNIST, P = 10, ObjP (eps-bar = 0.1), the papers' first setting; FEMNIST P = 195, ObjPM with
E = 10 (eps-bar = 0.05): a FEMNIST-shaped problem of random dense data by default (195 x 188 samples,
784 x 62), or the real LEAF writers with ``--femnist-dir``; and the main job's step on MNIST (P = 10,
ObjPM with E = 10 on Poisson samples of rate q = 0.2, Gaussian), whose gradient and floors are those of
the rows its samples take (``sampled_row``). Optionally the Flower simulation (`flwr run .`, Ray) with
P = 195 SuperNodes on the embedded data.

Usage, from the project root:
    python -m benchmarks.speed [--rounds 5] [--device cpu|cuda] [--dtype float64|float32] [--seeds S]
                               [--mnist-dir DIR] [--femnist-dir DIR] [--flower] [--markdown FILE]
    python -m benchmarks.speed --draws [--rounds 20] [--mnist-dir DIR] [--markdown FILE]
Prints a Markdown table (and writes it with --markdown FILE). Not a test. MNIST is read from
``--mnist-dir``: by default ../shared/data/mnist where that folder exists, else dpadmm's cache (``dpadmm data
fetch mnist`` fills it); the script stops in one line, before any timing, when it is in neither.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks import (
    ArgumentParser,
    check_file,
    data_dir,
    positive_int,
    require_data,
    start_local_superlink,
)
from benchmarks.flower_overhead import flwr_env
from benchmarks.numpy_reference import NumpyDPIADMM, ReferenceConfig
from dpadmm.data import Dataset, load_dataset, load_mnist
from dpadmm.iadmm import local, privacy
from dpadmm.iadmm.config import RunConfig, main_job, papers
from dpadmm.iadmm.engine import EngineState, step
from dpadmm.iadmm.federation import agent_data
from dpadmm.models.logistic import AgentData, gradient, probabilities, shared_bmm
from dpadmm.models.oracles import poisson_taken
from dpadmm.privacy import noise, secure
from dpadmm.privacy.randomness import Secret
from dpadmm.runs.memory import keep_freed_memory
from tests.conftest import stop_flwr_processes  # the same clean-up as the Flower tests

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    label: str
    round: float  # seconds per round
    gradient: float | None = None  # the round's E gradient calls
    blas: float | None = None  # the round's 2 E dense products
    floor: float | None = None  # E reads of X (+ one write of the noise on CUDA)
    flops_floor: float | None = None  # the round's dense FLOPs at the GEMM peak
    numpy: float | None = None  # the NumPy reference's seconds per round
    launches: int | None = None  # CUDA kernels per round


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Mean seconds of fn() over ``repeats`` calls, after one warm-up call."""
    fn()
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - started) / repeats


def _launches(fn: Callable[[], object]) -> int:
    """CUDA kernels launched by fn() (torch.profiler's CUDA events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def gemm_peak(dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of a 2048 x 2048 x 2048 matrix product: what this machine's BLAS reaches at best."""
    a = torch.rand(2048, 2048, dtype=dtype, device=device)
    return 2 * 2048**3 / _seconds(lambda: a @ a, device, 5)


def engine_row(label: str, config: RunConfig, dataset: Dataset, rounds: int, seeds: int) -> Row:
    data = agent_data(dataset, config, range(config.num_agents))
    device = data.x.device
    zeros = torch.zeros((seeds, config.num_agents, *data.shape), dtype=data.x.dtype, device=device)
    state = EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(), lam=zeros.clone())
    runs = list(range(seeds))
    rounds_done = iter(range(1, 10**9))
    per_round = _seconds(lambda: step(config, data, state, next(rounds_done), runs), device, rounds)
    launches = _launches(lambda: step(config, data, state, next(rounds_done), runs)) \
        if device.type == "cuda" else None

    z, steps = state.z_chain, config.steps
    if config.sampling_rate < 1:
        return sampled_row(label, config, data, z, per_round, rounds, runs)
    clip = config.clip_norm if config.clipped else None
    grad = _seconds(lambda: [gradient(data, z, scale=1.0 / data.total, reg=0.0, clip=clip)
                             for _ in range(steps)], device, rounds)
    residual = probabilities(data.x, z) - data.y
    xt = data.x.transpose(1, 2)
    blas = _seconds(lambda: [(shared_bmm(data.x, z), shared_bmm(xt, residual)) for _ in range(steps)],
                    device, rounds)
    floor = _seconds(lambda: [data.x.sum() for _ in range(steps)], device, rounds)
    if device.type == "cuda":
        noise_shape = (steps, *z.shape)
        floor += _seconds(lambda: torch.zeros(noise_shape, dtype=z.dtype, device=device), device, rounds)
    agents, rows, features = data.x.shape
    flops = 4 * steps * seeds * agents * rows * features * data.shape[1]
    flops_floor = flops / gemm_peak(data.x.dtype, device)
    return Row(label, per_round, grad, blas, floor, flops_floor, launches=launches)


def sampled_row(label: str, config: RunConfig, data: AgentData, z: torch.Tensor, per_round: float,
                rounds: int, runs: list[int]) -> Row:
    """A Poisson-sampled configuration's row (``sampling-rate`` q < 1): the gradient is the oracle's (the
    fused kernel that reads only the rows some run took, or the gathered batch where it does not run);
    the floors are those of the rows each step must read: the nonzero entries (values and columns) of the
    rows some run took, once per step, at the rate of one read of all of them, and each run's 4 q nnz K
    FLOPs per step (its own sample's two products) at the GEMM peak. No BLAS column: no dense product of
    the full data is made."""
    device, steps, q = data.x.device, config.steps, config.sampling_rate
    oracle = local.oracle(config, data, seeds=runs)
    calls = iter(range(1, 10**9))
    grad = _seconds(lambda: [oracle.gradient(z, 1, next(calls)) for _ in range(steps)], device, rounds)
    read = sum(float(poisson_taken(runs, data, 1, e, q).any(dim=0).double().mean())
               for e in range(1, steps + 1)) / steps  # the share of rows some run took, per step
    if data.rows is not None:
        _, columns, values = data.rows
        every_entry = _seconds(lambda: (values.sum(), columns.sum()), device, rounds)
        entries = values.numel()
    else:
        every_entry = _seconds(lambda: data.x.sum(), device, rounds)
        entries = data.x.numel()
    flops = 4 * steps * len(runs) * q * entries * data.shape[1]
    return Row(label, per_round, grad, None, steps * read * every_entry,
               flops / gemm_peak(data.x.dtype, device))


def numpy_seconds(config: RunConfig, data: AgentData, rounds: int) -> float:
    """Seconds per round of the NumPy reference on the same agents' data (CPU, float64)."""
    c1, c2, tc = config.rho_constants
    counts = data.counts.long().tolist()
    xs = [data.x[p, :n].cpu().double().numpy() for p, n in enumerate(counts)]
    labels = [data.y[p, :n].argmax(dim=1).cpu().numpy() for p, n in enumerate(counts)]
    reference = NumpyDPIADMM(xs, labels, data.shape[1], ReferenceConfig(
        epsilon=config.epsilon, rho_c1=c1, rho_c2=c2, rho_tc=tc, prox_scale=config.scale,
        beta=config.beta, clip_norm=config.clip_norm, local_steps=config.steps), total=data.total)
    t = iter(range(1, 10**9))
    return _seconds(lambda: reference.round(next(t)), torch.device("cpu"), rounds)


def noise_table(device: torch.device, repeats: int) -> str:
    """Millions of keyed variates per second for one local step of FEMNIST (195 agents x 784 x 62): the
    path the engine takes on this device, and the portable torch path (the definition and fallback)."""
    agents = torch.arange(195, device=device)
    scale = torch.ones(195, dtype=torch.float64, device=device)
    numel = 784 * 62
    lines = ["| keyed noise, 195 x 784 x 62 per draw | engine's path, M variates/s "
             "| portable torch path, M/s | speed-up |", "| --- | ---: | ---: | ---: |"]
    for name, transform in (("laplace", noise._laplace_transform), ("gaussian", noise._gaussian_transform)):
        draw = getattr(noise, name)
        fast = _seconds(lambda d=draw: d(1, agents, 2, 3, (numel,), scale), device, repeats)
        slow = _seconds(lambda t=transform: noise._portable_draw(1, agents, 2, 3, 0, numel, torch.float64, t,
                                                                 scale), device, repeats)
        rate = agents.numel() * numel / 1e6
        lines.append(f"| {name} | {rate / fast:.0f} | {rate / slow:.0f} | {slow / fast:.1f}x |")
    return "\n".join(lines)


def randomness_table(mnist_dir: str, repeats: int) -> str:
    """The two kinds of randomness on one core: keyed draws (simulation) against secret grid releases
    (deployment), in M variates per second; the Poisson mask; one agent's local step of the main job."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    agent, one = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.float64)
    secret = Secret({0: secure.new_key()})
    lines = ["| one core | simulation: keyed (Philox), M/s | deployment: secret grid release, M/s | ratio |",
             "| --- | ---: | ---: | ---: |"]
    for numel in (7850, 10**6):
        value = torch.randn(1, numel, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        for name in ("laplace", "gaussian"):
            draw = getattr(noise, name)
            keyed = _seconds(lambda d=draw, n=numel, v=value: v + d(1, agent, 2, 3, (n,), one), cpu, repeats)
            grid = _seconds(lambda m=name, v=value: secret.release(m, v, one, agent, 2, 3, 0), cpu, repeats)
            lines.append(f"| {name}, {numel:,} coordinates | {numel / keyed / 1e6:.1f} | "
                         f"{numel / grid / 1e6:.1f} | {grid / keyed:.1f}x |")
    width = 6000  # an MNIST agent's samples (P = 10)
    keyed = _seconds(lambda: noise.uniform(1, agent, 2, 3, noise.STREAM_BATCH, width) < 0.2, cpu, repeats)
    exact = _seconds(lambda: secret.bernoulli(agent, 2, 3, noise.STREAM_BATCH, width, 0.2), cpu, repeats)
    lines.append(f"| Poisson mask (q = 0.2), {width:,} samples | {width / keyed / 1e6:.1f} | "
                 f"{width / exact / 1e6:.1f} | {exact / keyed:.1f}x |")
    # One agent's local step of the main job (ObjPM, Gaussian, Poisson q = 0.2) on MNIST, E = 1.
    config = privacy.calibrate(dataclasses.replace(main_job(), dataset="mnist", data_dir=mnist_dir))
    config = dataclasses.replace(config, local_steps=1)
    data = agent_data(load_mnist(mnist_dir), config, [0])
    zeros = torch.zeros((1, *data.shape), dtype=torch.float64)
    steps = {}
    for kind, randomness in (("simulation", None), ("deployment", secret)):
        steps[kind] = _seconds(lambda r=randomness: local.agent_round(config, data, zeros[0], zeros, zeros, 1,
                                                                      randomness=r), cpu, repeats)
    torch.set_num_threads(threads)
    lines.append(f"| one agent's local step of the main job on MNIST (6,000 samples, d = 7,840), ms | "
                 f"{steps['simulation'] * 1e3:.1f} | {steps['deployment'] * 1e3:.1f} | "
                 f"{steps['deployment'] / steps['simulation']:.2f}x |")
    return "\n".join(lines)


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
        env = flwr_env(home)
        run_config = (f"algorithm='objp' preset='papers' iadmm-papers.epsilon=0.1 iadmm-papers.num-agents="
                      f"{agents} iadmm-papers.rounds={rounds} iadmm-papers.out='{out}'")
        try:
            start_local_superlink(env)
            subprocess.run(["flwr", "run", ".", "--stream", "--run-config", run_config,
                            "--federation-config", f"num-supernodes={agents}"],
                           cwd=ROOT, env=env, check=True, capture_output=True, timeout=3600)
        finally:
            stop_flwr_processes(home)
        lines = (out / "metrics.jsonl").read_text().splitlines()
        seconds = sorted(json.loads(line)["seconds"] for line in lines)
        return seconds[len(seconds) // 2]


def _table(rows: list[Row], header: str) -> str:
    lines = [header, "",
             "| what | s/round | gradient | BLAS products | floor: read X | floor: dense FLOPs "
             "| NumPy reference | round / read X | round / FLOPs | speed-up on NumPy | CUDA launches/round |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    def cell(value: float | None, form: str = "{:.4f}") -> str:
        return "" if value is None else form.format(value)

    for r in rows:
        cells = [r.label, cell(r.round), cell(r.gradient), cell(r.blas), cell(r.floor), cell(r.flops_floor),
                 cell(r.numpy), cell(None if r.floor is None else r.round / r.floor, "{:.2f}"),
                 cell(None if r.flops_floor is None else r.round / r.flops_floor, "{:.2f}"),
                 cell(None if r.numpy is None else r.numpy / r.round, "{:.1f}x"), cell(r.launches, "{}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    keep_freed_memory()  # as dpadmm train | reproduce run the engine
    parser = ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="timed rounds (and repeats) per measurement")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--mnist-dir", default=str(data_dir("mnist")),
                        help="the MNIST IDX files (default: ../shared/data/mnist where it exists, else "
                             "dpadmm's cache)")
    parser.add_argument("--femnist-dir", default="",
                        help="time the real FEMNIST (LEAF samples, 195 writers) instead of random data")
    parser.add_argument("--seeds", type=positive_int, default=1,
                        help="runs batched per engine step (reproduce's seeds)")
    parser.add_argument("--skip-numpy", action="store_true", help="do not time the NumPy reference")
    parser.add_argument("--flower", action="store_true", help="also time the Flower simulation (P = 195)")
    parser.add_argument("--flower-rounds", type=positive_int, default=5)
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--draws", action="store_true",
                        help="only the two kinds of randomness: keyed draws against secret grid releases")
    args = parser.parse_args(argv)
    if args.markdown:
        check_file(parser, "--markdown", args.markdown)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: torch {torch.__version__} sees no GPU here; use --device cpu")
    needed = [("mnist", args.mnist_dir, "--mnist-dir")]
    if args.femnist_dir and not args.draws:
        needed.append(("femnist", args.femnist_dir, "--femnist-dir"))
    require_data(parser, needed, {"femnist": 195})
    if args.draws:
        table = randomness_table(args.mnist_dir, args.rounds)
        print(table)
        if args.markdown:
            Path(args.markdown).write_text(table + "\n")
        return 0

    mnist = papers(algorithm="objp", epsilon=0.1, num_agents=10, dataset="mnist", data_dir=args.mnist_dir,
                      device=args.device, dtype=args.dtype)
    femnist = papers(algorithm="objpm", epsilon=0.05, local_steps=10, num_agents=195, rho_preset="femnist",
                        device=args.device, dtype=args.dtype)
    if args.femnist_dir:
        femnist_data, femnist_label = load_dataset("femnist", args.femnist_dir, 195), "FEMNIST (LEAF samples)"
    else:
        femnist_data, femnist_label = femnist_shaped(), "FEMNIST-shaped (random, dense)"
    # the main job's step on MNIST (Poisson q = 0.2, Gaussian, E = 10, eps-bar calibrated for eps = 8)
    sampled = privacy.calibrate(dataclasses.replace(main_job(), dataset="mnist", data_dir=args.mnist_dir,
                                                    device=args.device, dtype=args.dtype))
    runs = f", {args.seeds} seeds batched" if args.seeds > 1 else ""
    rows = []
    mnist_data = load_mnist(args.mnist_dir)
    for label, config, dataset in (
        (f"MNIST P=10 ObjP (E=1){runs}", mnist, mnist_data),
        (f"{femnist_label} P=195 ObjPM (E=10){runs}", femnist, femnist_data),
        (f"MNIST P=10 the main job's step: ObjPM (E=10), Poisson q=0.2{runs}", sampled, mnist_data),
    ):
        row = engine_row(label, config, dataset, args.rounds, args.seeds)
        if not args.skip_numpy and config.sampling_rate == 1:  # the NumPy reference takes full batches
            cpu = agent_data(dataset, dataclasses.replace(config, device="cpu", dtype="float64"),
                             range(config.num_agents))
            row.numpy = numpy_seconds(config, cpu, max(1, min(args.rounds, 3))) * args.seeds
        rows.append(row)
        print(f"{label}: {row.round:.4f} s/round, gradient {row.gradient:.4f} s, BLAS {row.blas} s, "
              f"read X {row.floor:.4f} s, FLOPs {row.flops_floor:.4f} s, NumPy {row.numpy}", file=sys.stderr)
    if args.flower:
        rows.append(Row("Flower simulation, P=195 ObjP (E=1), embedded data 784x10",
                        flower_seconds(args.flower_rounds, 195)))

    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    header = (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
              f"threads, torch {torch.__version__}, numpy {np.__version__}, device {args.device} ({device}), "
              f"dtype {args.dtype}; {args.rounds} timed rounds per measurement.")
    table = _table(rows, header) + "\n\n" + noise_table(torch.device(args.device), args.rounds)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
