"""ServerApp: Flower's FedAvg wrapped in ``DifferentialPrivacyClientSideFixedClipping``, job by job.

Every job is one DP-FedAvg training from dpadmm's initial model (zeros for logistic regression)
with Flower's own classes: FedAvg (every client, every round, uniform weights), the wrapper that
sends the clipping norm and adds N(0, (z C / n)^2) to the average, and Flower's ``RdpAccountant``
(add-or-remove-one client, no amplification), whose epsilon each result reports. The global model
of the last round is evaluated centrally on the two halves of the test set
(:func:`dpfedavg_bench.baselines.evaluation_split`).

Flower draws its noise from NumPy's global generator; each job seeds it with its seed, so that a
job is reproducible (the clients' shuffling is keyed by the same seed).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import (
    Grid,
    NeighboringRelation,
    PrivacyConfig,
    RdpAccountant,
    SamplingMethod,
    ServerApp,
)
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg

from dpadmm.data import Dataset
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import load_for
from dpadmm.models.modules import build_model, initial_parameters
from dpfedavg_bench.baselines import DpFedAvgConfig, error_rate, evaluation_split

app = ServerApp()


def run_job(grid: Grid, config: DpFedAvgConfig, data: Dataset, num_agents: int,
            delta: float) -> dict[str, Any]:
    """Train one DP-FedAvg configuration; its final validation and test errors and Flower's epsilon."""
    started = time.perf_counter()
    np.random.seed(config.seed % 2**32)
    accountant = RdpAccountant(PrivacyConfig(
        target_delta=delta, population_size=num_agents,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION))
    fedavg = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=num_agents,
                    min_available_nodes=num_agents, weighted_by_key="agent-weight")
    strategy = DifferentialPrivacyClientSideFixedClipping(
        fedavg, noise_multiplier=config.noise_multiplier, clipping_norm=config.clip_norm,
        num_sampled_clients=num_agents, accountant=accountant)
    module = build_model("logistic", data.num_features, data.num_classes)
    initial = initial_parameters(module, config.seed, dtype=torch.float32)
    val, test = evaluation_split(data.num_test)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """The final model's errors (the earlier rounds are not reported)."""
        if server_round != config.rounds:
            return None
        params = dict(arrays.to_torch_state_dict())
        return MetricRecord({
            "val-error": error_rate(module, params, data.x_test[val], data.y_test[val]),
            "test-error": error_rate(module, params, data.x_test[test], data.y_test[test]),
        })

    train_config = ConfigRecord({"lr": config.lr, "local-epochs": config.local_epochs,
                                 "batch-size": config.batch_size, "seed": config.seed})
    initial_arrays = ArrayRecord({k: Array(v.numpy()) for k, v in initial.items()})
    result = strategy.start(grid=grid, initial_arrays=initial_arrays, num_rounds=config.rounds,
                            train_config=train_config, evaluate_fn=evaluate)
    final = result.evaluate_metrics_serverapp[config.rounds]
    spent = strategy.privacy_spent()
    assert spent is not None  # the strategy has an accountant
    return {"val-error": float(final["val-error"]), "test-error": float(final["test-error"]),
            "flower-epsilon": spent.epsilon, "flower-releases": spent.num_releases,
            "seconds": time.perf_counter() - started}


def run_jobs(grid: Grid, run_config: dict[str, Any]) -> None:
    """Every job of the file ``jobs``, each result appended to ``results`` as soon as it is known."""
    if not run_config["jobs"] or not run_config["results"]:
        raise ValueError("jobs and results must name the JSON file of jobs and the JSONL file of results")
    num_agents, delta = int(run_config["num-agents"]), float(run_config["delta"])
    data = load_for(RunConfig(dataset=str(run_config["dataset"]), data_dir=str(run_config["data-dir"]),
                              num_agents=num_agents))
    fields = {f.name for f in dataclasses.fields(DpFedAvgConfig)}
    jobs = json.loads(Path(str(run_config["jobs"])).read_text())
    with open(str(run_config["results"]), "a", encoding="utf-8") as out:
        for job in jobs:
            config = DpFedAvgConfig(**{k: v for k, v in job.items() if k in fields})
            record = {"key": job["key"], **run_job(grid, config, data, num_agents, delta)}
            out.write(json.dumps(record) + "\n")
            out.flush()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_jobs(grid, dict(context.run_config))
