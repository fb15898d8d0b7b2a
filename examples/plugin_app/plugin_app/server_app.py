"""ServerApp of the plug-in example: dpadmm's DP-IADMM strategy training the app's own network.

A user's server needs three things from dpadmm: the run's ``RunConfig``, the initial
parameters of *their* network (``initial_parameters``: its seeded default initialisation,
as a dict of tensors) and the ``DPIADMM`` strategy. The evaluation and the results are the
app's own: here the test accuracy of the model after every round, written with each round's
participation to ``<out>/results.json``, and the run's privacy statement
(``strategy.statement``: calibrated as the agents calibrate, and naming the randomness they
reported using).
"""

from __future__ import annotations

import json
import math
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from dpadmm.data import load_dataset
from dpadmm.iadmm import privacy
from dpadmm.iadmm.federation import DTYPES
from dpadmm.models.modules import initial_parameters, logits_of
from plugin_app.settings import settings
from strategies import DPIADMM

DEFAULT_OUT = "runs/plugin_app"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config, own = settings(context.run_config)
    dtype = DTYPES[config.dtype]
    model = own.model()
    dataset = load_dataset("default")  # the server's test set (replace with your own)
    x_test, y_test = dataset.x_test.to(dtype), dataset.y_test
    w1 = initial_parameters(model, config.seed, dtype=dtype)
    strategy = DPIADMM(config, w1)

    out = Path(config.out or DEFAULT_OUT).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ledger = strategy.statement(total_samples=dataset.num_train)
    results: dict[str, Any] = {
        "config": config.to_mapping(),
        "app": {"conv-channels": own.conv_channels, "parameters": sum(p.numel() for p in w1.values())},
        "privacy": ledger.to_dict() if ledger else None,
        "rounds": [],
    }
    log(INFO, "plugin_app: %s", ledger.summary() if ledger else "non-private run (no noise)")
    log(INFO, "plugin_app: writing %s", out / "results.json")

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Test accuracy of the model after the round, how far it moved from w^1, and who took part."""
        w = {name: torch.from_numpy(array.numpy()) for name, array in arrays.items()}
        with torch.no_grad():
            accuracy = (logits_of(model, w, x_test).argmax(dim=1) == y_test).double().mean().item()
        moved = math.sqrt(sum(float((w[name] - w1[name]).double().square().sum()) for name in w1))
        report = strategy.last_report  # this round's: set while the strategy handled its replies
        record = {"round": server_round, "test-accuracy": accuracy, "distance-from-initial": moved,
                  **(report.to_dict() if report is not None else {})}
        results["rounds"].append(record)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        log(INFO, "plugin_app round %d/%d: test accuracy %.4f, %d of %d agents replied, the model moved "
            "%.4g from w^1", server_round, config.rounds, accuracy, len(record.get("replied", [])),
            len(record.get("sampled", [])), moved)
        return MetricRecord({"test-accuracy": accuracy, "distance-from-initial": moved})

    strategy.start(grid=grid, num_rounds=config.rounds, timeout=config.round_timeout, evaluate_fn=evaluate)
    ledger = strategy.statement(total_samples=dataset.num_train)  # now with the randomness the agents used
    if ledger:
        results["privacy"] = ledger.to_dict()
        (out / "results.json").write_text(json.dumps(results, indent=1))
        error = 1 - results["rounds"][-1]["test-accuracy"]
        log(INFO, "plugin_app: %s", privacy.headline(ledger, error))
        log(INFO, "plugin_app: privacy spent, the largest over agents: eps = %.4g at delta = %g (PLD)",
            privacy.spent(config, max(strategy.taken)), config.delta)
