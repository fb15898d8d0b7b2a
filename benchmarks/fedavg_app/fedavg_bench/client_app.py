"""ClientApp: dpadmm's local round under FedAvg (``same-work``), or a reply without work (``echo``).

``same-work`` does what ``clients.client_app.train`` does for one agent, with the same functions:
the agent's data from ``clients.client_app.agent_data_for`` (cached per worker process, as there),
the three received arrays converted to tensors, one ``dpadmm.local.agent_round`` (E local steps
with their Laplace noise), and z back with the last iterate when E > 1 (two arrays for ObjPM). It
skips only the DP-IADMM message checks (partition and round ids), which FedAvg has no use for.
``echo`` sends as many of the received arrays back untouched: the same bytes on the wire and no
computation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from functools import lru_cache
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.client_app import agent_data_for
from dpadmm import privacy
from dpadmm.config import RunConfig
from dpadmm.local import agent_round

app = ClientApp()

RUN_CONFIG_KEYS = frozenset(f.name.replace("_", "-") for f in fields(RunConfig))


@lru_cache(maxsize=8)
def _calibrated(config: RunConfig) -> RunConfig:
    """As the main ClientApp: eps-bar calibrated to target-epsilon (a no-op without one), cached."""
    return privacy.calibrate(config)


def _run_config(values: Mapping[str, Any]) -> RunConfig:
    """The dpadmm RunConfig in this app's run config (its ``bench-*`` keys are not dpadmm's)."""
    return _calibrated(RunConfig.from_mapping({k: v for k, v in values.items() if k in RUN_CONFIG_KEYS}))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Reply z (and z-last when E > 1) of the received shape and dtype: computed or echoed."""
    arrays = msg.content["arrays"]
    config = _run_config(context.run_config)
    if str(context.run_config["bench-mode"]) == "echo":
        echoed = {"z": arrays["z"], "z-last": arrays["lambda"]} if config.steps > 1 else {"z": arrays["z"]}
        metrics = MetricRecord({"num-examples": 1})
        return Message(content=RecordDict({"arrays": ArrayRecord(echoed), "metrics": metrics}), reply_to=msg)

    w_received = arrays["w"].numpy()
    data = agent_data_for(config, context.node_config, num_classes=int(w_received.shape[1]))
    received = {key: arrays[key].numpy() for key in ("w", "lambda", "z")}
    for key, value in received.items():
        if value.shape != data.shape:
            raise ValueError(f"the server's {key} has shape {value.shape} "
                             f"but this agent's data give {data.shape}")
    w, lam, z_chain = (torch.tensor(received[k], device=data.x.device, dtype=data.x.dtype)
                       for k in ("w", "lambda", "z"))
    t = int(msg.content["config"]["server-round"])
    result = agent_round(config, data, w, lam[None], z_chain[None], t)
    out = {"z": result.z_sent[0].cpu()}
    if config.steps > 1:  # as the main ClientApp: the last iterate only when it differs from z
        out["z-last"] = result.z_last[0].cpu()
    metrics = MetricRecord({"num-examples": int(data.counts[0])})
    return Message(content=RecordDict({"arrays": ArrayRecord(out), "metrics": metrics}), reply_to=msg)
