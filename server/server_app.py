"""The DP-IADMM ServerApp: run config -> strategy -> central evaluation -> results.

Writes the same ``config.json`` / ``privacy.json`` / ``metrics.jsonl`` (and ``weights.npz``
with ``save-weights``) as ``dpadmm train``, logs the test error of every evaluated round and
ends with the privacy ledger's summary.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from dpadmm import privacy
from dpadmm.config import RunConfig
from dpadmm.federation import load_for
from dpadmm.results import RunWriter, central_metrics
from strategies import DPIADMM

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = privacy.calibrate(RunConfig.from_mapping(context.run_config))
    dataset = load_for(config)
    ledger = privacy.ledger(config, total_samples=dataset.num_train) if config.private else None
    strategy = DPIADMM(config, shape=(dataset.num_features, dataset.num_classes))
    writer = RunWriter(config, engine="flower")
    log(INFO, "dpadmm: writing %s", Path(writer.directory).resolve() / "metrics.jsonl")
    if ledger:
        writer.write_ledger(ledger)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0 or not (server_round % config.eval_every == 0 or server_round == config.rounds):
            return None
        w = torch.tensor(arrays["w"].numpy())
        record = {"round": server_round, **central_metrics(w, dataset, config.beta)}
        record.update(dict(strategy.last_train_metrics or {}))
        writer.record(record, w)
        log(INFO, "dpadmm round %d/%d: test error %.4f, train loss %.4f, consensus violation %.4g",
            server_round, config.rounds, record["test-error"], record["train-loss"],
            record.get("consensus-violation", float("nan")))
        return MetricRecord({k: v for k, v in record.items() if isinstance(v, (int, float))})

    try:
        strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=config.rounds,
                       evaluate_fn=evaluate)
    finally:
        writer.close()
    log(INFO, "dpadmm: %s", ledger.summary() if ledger else "privacy: none (non-private run, no noise)")
