"""The task with Flower's own DP: FedAvg wrapped in ``DifferentialPrivacyClientSideFixedClipping``.

Server: FedAvg (every client, every round, equal weights) inside the wrapper, which sends the clipping
norm C and adds Gaussian noise of standard deviation z C / n to the average of the n clipped updates;
Flower's ``RdpAccountant`` accounts it. Flower does not calibrate z, so :func:`noise_multiplier` finds
the z whose ``rounds`` releases its accountant puts at ``target-epsilon``. Client: plain local SGD;
Flower's ``fixedclipping_mod`` clips the update (the client app applies it). The statement is
client-level (one client's whole data set added or removed) and holds against those who see the
global models, not against the server: it receives every clipped update without noise.
"""

from __future__ import annotations

import math
from logging import INFO

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import (
    GaussianPrivacyEvent,
    Grid,
    NeighboringRelation,
    PrivacyConfig,
    RdpAccountant,
    SamplingMethod,
)
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg
from torch import nn

from digits_app.task import Net, Results, StopsWhenEveryReplyFails, client_block, settings
from dpadmm.models.modules import initial_parameters


def accountant(delta: float, clients: int) -> RdpAccountant:
    """Flower's accountant for fixed clipping: add-or-remove-one client, every client every round."""
    return RdpAccountant(PrivacyConfig(target_delta=delta, population_size=clients,
                                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                       sampling_method=SamplingMethod.NO_AMPLIFICATION))


def noise_multiplier(target_epsilon: float, delta: float, rounds: int, clients: int) -> float:
    """The smallest z (to 0.1 %) whose ``rounds`` releases Flower's accountant puts at or below the target."""
    def epsilon(z: float) -> float:
        spent = accountant(delta, clients)
        spent.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=clients, population_size=clients),
                      rounds)
        return spent.get_epsilon(delta)

    low, high = 0.05, 1000.0
    if not (0 < target_epsilon < math.inf) or epsilon(high) > target_epsilon:
        raise ValueError(f"target-epsilon={target_epsilon!r} is not allowed with method='dp-fedavg': give an "
                         f"epsilon > 0 that a noise multiplier up to {high:g} reaches in {rounds} rounds")
    while high / low > 1.001:
        low, high = ((low * high) ** 0.5, high) if epsilon((low * high) ** 0.5) > target_epsilon else \
            (low, (low * high) ** 0.5)
    return high


class StoppingClientSideFixedClipping(StopsWhenEveryReplyFails, DifferentialPrivacyClientSideFixedClipping):
    """Flower's wrapper, stopping a run whose every reply failed (it would skip the round and go on)."""


def serve(grid: Grid, context: Context) -> None:
    """Train ``rounds`` rounds; log and record the (noisy) global model after each, then Flower's epsilon."""
    config, own = settings(context.run_config)
    np.random.seed(config.seed)  # the wrapper draws its noise from NumPy's global generator
    z = noise_multiplier(config.target_epsilon, config.delta, config.rounds, config.num_agents)
    fedavg = FedAvg(fraction_evaluate=0.0, min_available_nodes=config.num_agents, weighted_by_key="weight")
    strategy = StoppingClientSideFixedClipping(
        fedavg, noise_multiplier=z, clipping_norm=own.fedavg_clip, num_sampled_clients=config.num_agents,
        accountant=accountant(config.delta, config.num_agents))
    results = Results(config, own)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        value = results.add_round(server_round, arrays)
        log(INFO, "digits_app dp-fedavg round %d: test accuracy %.4f", server_round, value)
        return MetricRecord({"accuracy": value})

    initial = ArrayRecord(initial_parameters(Net(), config.seed, dtype=torch.float32))
    train_config = ConfigRecord({"lr": own.fedavg_lr, "epochs": own.fedavg_epochs, "batch": own.fedavg_batch,
                                 "seed": config.seed})
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=config.rounds, train_config=train_config,
                   evaluate_fn=evaluate)
    spent = strategy.privacy_spent()
    line = (f"guarantee: eps = {spent.epsilon:.4g} at delta = {spent.delta:g} for the whole run "
            f"({spent.accounting_method}), per client for its whole data set added or removed; noise "
            f"multiplier z = {z:.4g} added by the server to the average, so it holds against those who see "
            "the global models: the server sees each client's clipped update without noise")
    results.write(epsilon=spent.epsilon, delta=spent.delta, noise_multiplier=z, line=line)
    log(INFO, "digits_app: %s", line)


def train(msg: Message, context: Context) -> Message:
    """Local SGD from the received model; ``fixedclipping_mod`` (around this function) clips the update."""
    round_config = msg.content["config"]
    partition_id, x, y = client_block(context.node_config, settings(context.run_config)[0])
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    generator = torch.Generator().manual_seed(
        int(round_config["seed"]) * 1_000_003 + int(round_config["server-round"]) * 1_009 + partition_id)
    optimizer = torch.optim.SGD(net.parameters(), lr=float(round_config["lr"]))
    for _ in range(int(round_config["epochs"])):
        for batch in torch.randperm(len(y), generator=generator).split(int(round_config["batch"])):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
            optimizer.step()
    # Equal weights: Flower's fixed-clipping accountant accepts only the uniform average (sensitivity C / n).
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord({"weight": 1})})
    return Message(content=content, reply_to=msg)
