"""The DP-IADMM ClientApp: one agent's lines 15-23 of 003 Algorithm 1.

The learning is ``dpadmm.local.agent_round`` with an agent dimension of 1; this module only
moves tensors in and out of Flower Messages and keeps the agent's state (lambda_p and the
last local iterate) in ``context.state`` between rounds.

Where the agent's data come from, by node config:

- simulation: ``partition-id`` and ``num-partitions`` (Flower sets them): block
  ``partition-id`` of the configured data set's partition;
- deployment on a device: ``partition-id`` (this agent's id, 0..P-1), ``data-path`` (the
  device's own file: LEAF JSON, IDX images with ``labels-path``, or npz; see
  :mod:`dpadmm.data.node`), ``writer`` for a LEAF file with several writers, and
  ``num-samples-total``, the global sample count I (a public parameter of eq. (63)).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from dpadmm import privacy, schedules
from dpadmm.config import RunConfig
from dpadmm.consensus import dual_digest, dual_update
from dpadmm.data.node import load_node_data
from dpadmm.federation import DTYPES, agent_data, load_for, resolve_device
from dpadmm.local import agent_round
from dpadmm.models import AgentData

STATE_ARRAYS = "dpadmm-state"
STATE_META = "dpadmm-meta"

app = ClientApp()


@lru_cache(maxsize=8)
def _calibrated(config: RunConfig) -> RunConfig:
    """The run config with eps-bar calibrated to target-epsilon, computed by the agent itself."""
    return privacy.calibrate(config)


@lru_cache(maxsize=256)
def _partition(config: RunConfig, partition_id: int) -> AgentData:
    """This agent's block of the data set's partition (cached per worker process)."""
    return agent_data(load_for(config), config, [partition_id])


@lru_cache(maxsize=4)
def _device_data(config: RunConfig, agent: int, path: str, labels_path: str, writer: str, total: int,
                 num_classes: int) -> AgentData:
    """This device's own samples (deployment), batched as one agent."""
    x, y = load_node_data(path, labels_path=labels_path, writer=writer)
    if int(y.max()) >= num_classes:
        raise ValueError(f"data-path {path} has label {int(y.max())}; the model has {num_classes} classes")
    return AgentData.from_blocks([x], [y], num_classes=num_classes, total=total, agents=[agent],
                                 dtype=DTYPES[config.dtype], device=resolve_device(config.device))


def agent_data_for(config: RunConfig, node_config: Mapping[str, Any], num_classes: int) -> AgentData:
    """The agent's data: the device's own file when the node config names one, else its partition."""
    partition_id = int(node_config["partition-id"])
    if not 0 <= partition_id < config.num_agents:
        raise ValueError(f"partition-id={partition_id} is not allowed; "
                         f"it must be in 0..{config.num_agents - 1}")
    if "data-path" in node_config:
        if "num-samples-total" not in node_config:
            raise ValueError("node config has data-path but no num-samples-total: give the global sample "
                             "count I of eq. (63), a public parameter of the run")
        return _device_data(config, partition_id, str(node_config["data-path"]),
                            str(node_config.get("labels-path", "")), str(node_config.get("writer", "")),
                            int(node_config["num-samples-total"]), num_classes)
    num_partitions = int(node_config["num-partitions"])
    if num_partitions != config.num_agents:
        raise ValueError(f"the federation has {num_partitions} partitions but "
                         f"num-agents={config.num_agents}; set both to the same value")
    return _partition(config, partition_id)


def _read_state(context: Context, shape: tuple[int, int], dtype: torch.dtype) -> tuple[dict, int]:
    """(tensors, last round) from context.state; zeros and round 0 on the first call."""
    if STATE_ARRAYS not in context.state:
        zeros = torch.zeros(shape, dtype=dtype)
        return {"lam": zeros, "z_chain": zeros, "z_sent": zeros}, 0
    arrays = context.state[STATE_ARRAYS].to_torch_state_dict()
    return {k: v.to(dtype) for k, v in arrays.items()}, int(context.state[STATE_META]["round"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Receive the round's w, run E local updates, send z_p^{t+1}, update lambda_p."""
    config = _calibrated(RunConfig.from_mapping(context.run_config))
    w_received = msg.content["arrays"]["w"].numpy()
    data = agent_data_for(config, context.node_config, num_classes=int(w_received.shape[1]))
    partition_id = int(data.agents[0])
    if w_received.shape != data.shape:
        raise ValueError(f"the server's w has shape {w_received.shape} "
                         f"but this agent's data give {data.shape}")
    t = int(msg.content["config"]["server-round"])
    w = torch.tensor(w_received, device=data.x.device, dtype=data.x.dtype)
    state, last_round = _read_state(context, data.shape, data.x.dtype)
    if last_round != t - 1:
        raise RuntimeError(f"agent {partition_id} holds state of round {last_round} but was sent round {t}; "
                           "its lambda_p cannot be continued")
    state = {k: v.to(data.x.device) for k, v in state.items()}
    if config.algorithm == "outp" and t > 1:
        # OutP's server updates w after the agents: w^t arrives now, so line 23 of round t-1 runs here.
        state["lam"] = dual_update(state["lam"], w, state["z_sent"], schedules.rho_at(config, t - 1))
    result = agent_round(config, data, w, state["lam"][None], state["z_chain"][None], t)
    z_sent = result.z_sent[0]
    if config.algorithm != "outp":
        state["lam"] = dual_update(state["lam"], w, z_sent, schedules.rho_at(config, t))
    context.state[STATE_ARRAYS] = ArrayRecord(
        {"lam": state["lam"].cpu(), "z_chain": result.z_last[0].cpu(), "z_sent": z_sent.cpu()})
    context.state[STATE_META] = ConfigRecord({"round": t})
    dual_sum, dual_l1 = dual_digest(state["lam"])
    metrics = MetricRecord({
        "partition-id": partition_id,
        "num-examples": int(data.counts[0]),
        "noise-magnitude": float(result.noise_magnitude[0]),
        "dual-sum": dual_sum,
        "dual-l1": dual_l1,
    })
    content = RecordDict({"arrays": ArrayRecord({"z": z_sent.cpu()}), "metrics": metrics})
    return Message(content=content, reply_to=msg)
