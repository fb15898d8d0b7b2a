"""ClientApp: dpadmm's local round under FedAvg (``same-work``), or a reply without work (``echo``).

``same-work`` calls the very functions ``clients.client_app.train`` calls,
``agent_data_for`` and ``clients.dpiadmm.local_update``: the agent's data (cached per worker process), one
``dpadmm.iadmm.local.agent_round`` (E local steps with their Laplace noise), and z back with the last
iterate when E > 1 (two arrays for ObjPM). It skips only the DP-IADMM message checks (partition
and round ids), which FedAvg has no use for.
``echo`` sends as many of the received arrays back untouched: the same bytes on the wire and no
computation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.client_app import agent_data_for, calibrated, model_for, num_classes_for
from clients.dpiadmm import local_update
from dpadmm.iadmm.config import RunConfig

app = ClientApp()

RUN_CONFIG_KEYS = frozenset(f.name.replace("_", "-") for f in fields(RunConfig))


def _run_config(values: Mapping[str, Any]) -> RunConfig:
    """The dpadmm RunConfig in this app's run config (its ``bench-*`` keys are not dpadmm's)."""
    return calibrated(RunConfig.from_mapping({k: v for k, v in values.items() if k in RUN_CONFIG_KEYS}))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Reply z (and z-last when E > 1) of the received shape and dtype: computed or echoed."""
    arrays = msg.content["arrays"]
    config = _run_config(context.run_config)
    if str(context.run_config["bench-mode"]) == "echo":
        echoed = {"z.weight": arrays["z.weight"]}
        if config.steps > 1:
            echoed["z-last.weight"] = arrays["lambda.weight"]
        metrics = MetricRecord({"num-examples": 1})
        return Message(content=RecordDict({"arrays": ArrayRecord(echoed), "metrics": metrics}), reply_to=msg)

    data = agent_data_for(config, context.node_config, num_classes_for(config, arrays))
    out = local_update(config, data, arrays, int(msg.content["config"]["server-round"]), model_for(config))
    metrics = MetricRecord({"num-examples": int(data.counts[0])})
    return Message(content=RecordDict({"arrays": ArrayRecord(out), "metrics": metrics}), reply_to=msg)
