"""The task with DP-SGD on the clients (Opacus) and Flower's plain FedAvg on the server.

The recipe of Flower's Opacus example: each client trains the received model with Opacus's
``PrivacyEngine.make_private`` and the server averages the replies with ``FedAvg``. It is DP-IADMM's
like-for-like baseline, held to the same figures from RunConfig: each local step takes each of the
client's samples with probability q (``sampling-rate``, Poisson), clips every sample's gradient to L2 norm C
(``clip-norm``) and adds Gaussian noise of standard deviation z C to their sum; a client takes E
(``steps``) such steps a round, for ``rounds`` rounds. z is the noise multiplier that Opacus's PRV
accountant puts at (``target-epsilon``, ``delta``) for those T E steps, so the statement is sample-level
(one training sample of one client added or removed) for the whole run, and, the noise being added on the
client before anything leaves it, it holds against the server too. Opacus is imported inside the
functions, so that the other two methods run where it is not installed (it comes with the ``compare``
extra).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from threadpoolctl import threadpool_limits
from torch import nn

from digits_app.task import Net, Results, StopsWhenEveryReplyFails, client_block, settings
from dpadmm.iadmm.config import RunConfig
from dpadmm.models.modules import initial_parameters


@contextmanager
def prv_accounting() -> Iterator[None]:
    """Where Opacus's PRV accountant runs: with one BLAS thread, and without the warning of its domain.

    Its discretisation takes dot products over a domain of millions of points, which numpy's OpenBLAS splits
    over its worker threads; a fork in another thread of the process during such a call (in a simulation,
    Flower starts Ray's processes from its main thread while the ServerApp's thread calibrates) ends those
    workers, and the call then waits for them forever at 100% CPU: the run hangs before its first round. On
    one thread the call involves no worker. And the accountant sizes its domain with an RDP bound, which
    warns at the search's small z that a larger order would be tighter: a looser bound only widens the
    domain, so the warning is dropped."""
    with threadpool_limits(limits=1, user_api="blas"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@lru_cache(maxsize=8)
def noise_multiplier(target_epsilon: float, delta: float, sampling_rate: float, steps: int) -> float:
    """Opacus's z for ``steps`` Poisson-subsampled Gaussian steps at (``target_epsilon``, ``delta``) by its
    PRV accountant (within 0.01 below the target). Cached: the server and every client compute it, each for
    itself (a client must not take its noise from the server), and one search takes seconds."""
    from opacus.accountants.utils import MAX_SIGMA, get_noise_multiplier

    refused = (f"target-epsilon={target_epsilon!r} is not allowed with method='dp-sgd': give an epsilon > 0 "
               f"that a noise multiplier up to {MAX_SIGMA:g} reaches in {steps} steps at sampling rate "
               f"{sampling_rate:g}")
    if not (0 < target_epsilon < math.inf):
        raise ValueError(refused)  # Opacus would answer inf with z = 10, and 0 after a long search
    with prv_accounting():
        try:
            return get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                        sample_rate=sampling_rate, steps=steps, accountant="prv")
        except ValueError as error:  # Opacus: "The privacy budget is too low."
            raise ValueError(refused) from error


def spent_epsilon(config: RunConfig, z: float) -> float:
    """The whole run's epsilon at ``delta`` by Opacus's PRV accountant: T E steps of (z, q), one client's."""
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    for _ in range(config.rounds * config.steps):
        accountant.step(noise_multiplier=z, sample_rate=config.sampling_rate)
    with prv_accounting():
        return accountant.get_epsilon(delta=config.delta)


def calibrated(config: RunConfig) -> float:
    """z for this run: T = ``rounds`` rounds of E = ``steps`` local steps at rate q = ``sampling-rate``."""
    return noise_multiplier(config.target_epsilon, config.delta, config.sampling_rate,
                            config.rounds * config.steps)


class StoppingFedAvg(StopsWhenEveryReplyFails, FedAvg):
    """Flower's FedAvg, stopping a run whose every reply failed (it would keep the model and go on)."""


def serve(grid: Grid, context: Context) -> None:
    """Train ``rounds`` rounds of FedAvg over every client; log and record the global model after each, then
    the run's epsilon by Opacus's PRV accountant."""
    config, own = settings(context.run_config)
    z = calibrated(config)  # before training: an unreachable target stops the run here
    strategy = StoppingFedAvg(fraction_evaluate=0.0, min_available_nodes=config.num_agents,
                              weighted_by_key="weight")
    results = Results(config, own)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        value = results.add_round(server_round, arrays)
        log(INFO, "digits_app dp-sgd round %d: test accuracy %.4f", server_round, value)
        return MetricRecord({"accuracy": value})

    initial = ArrayRecord(initial_parameters(Net(), config.seed, dtype=torch.float32))
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=config.rounds,
                   train_config=ConfigRecord({"lr": own.dpsgd_lr, "seed": config.seed}), evaluate_fn=evaluate)
    epsilon = spent_epsilon(config, z)
    line = (f"guarantee: eps = {epsilon:.4g} at delta = {config.delta:g} for the whole run (Opacus's PRV "
            f"accountant, {config.rounds * config.steps} steps of DP-SGD at sampling rate "
            f"{config.sampling_rate:g}), per client for one training sample added or removed (sample-level); "
            f"noise multiplier z = {z:.4g} on the sum of the gradients clipped to {config.clip_norm:g}, "
            "added by each client at each local step before anything leaves it, so it holds against everyone "
            "who sees what a client sends, the server included")
    # in the words DP-IADMM's strategy states its own mechanism in
    mechanism = (f"gaussian, noise multiplier {z:.4g}, sampling {config.sampling_rate:g}, "
                 f"{config.steps} per round")
    results.write(epsilon=epsilon, delta=config.delta, noise_multiplier=z, line=line, mechanism=mechanism)
    log(INFO, "digits_app: %s", line)


def train(msg: Message, context: Context) -> Message:
    """E DP-SGD steps (Opacus) from the received model on this client's block; reply the model."""
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader

    config, _ = settings(context.run_config)
    round_config = msg.content["config"]
    partition_id, x, y = client_block(context.node_config, config)
    z = calibrated(config)  # the client's own calibration, from the run config, not from the server
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    # Two streams keyed by (seed, round, partition id): the same run draws the same batches and noise.
    base = int(round_config["seed"]) * 1_000_003 + int(round_config["server-round"]) * 1_009 + partition_id
    sampling, noise = torch.Generator().manual_seed(2 * base), torch.Generator().manual_seed(2 * base + 1)
    # The Poisson loader built here rather than by make_private(poisson_sampling=True), which would draw the
    # batches from torch's global generator: make_private takes no generator for them outside secure mode.
    # Hence poisson_sampling=False below: it keeps this loader, whose batches are Poisson at rate q.
    loader = DPDataLoader(torch.utils.data.TensorDataset(x, y), sample_rate=config.sampling_rate,
                          generator=sampling)
    with warnings.catch_warnings():
        # Opacus's notes that the seeded noise is not a secure RNG (the simulation wants it reproducible) and
        # torch's that its per-sample hooks fire on a first layer whose input needs no gradient.
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        model, optimizer, loader = PrivacyEngine(accountant="prv").make_private(
            module=net, optimizer=torch.optim.SGD(net.parameters(), lr=float(round_config["lr"])),
            data_loader=loader, noise_multiplier=z, max_grad_norm=config.clip_norm, poisson_sampling=False,
            noise_generator=noise)
        taken = 0
        while taken < config.steps:  # exactly E steps: a pass of the loader is 1 / q batches
            for xb, yb in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                optimizer.step()
                taken += 1
                if taken == config.steps:
                    break
    # Equal weights: the number of a client's samples is what the neighbours differ in, so it is not sent.
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord({"weight": 1})})
    return Message(content=content, reply_to=msg)
