"""The DP-IADMM ClientApp: one agent's lines 15-23 of 003 Algorithm 1.

The learning is ``dpadmm.local.agent_round`` with an agent dimension of 1; this module only
moves tensors in and out of Flower Messages and keeps the agent's state (lambda_p and the
last local iterate) in ``context.state`` between rounds.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from dpadmm import privacy, schedules
from dpadmm.config import RunConfig
from dpadmm.consensus import dual_digest, dual_update
from dpadmm.federation import agent_data, load_for
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
    """This agent's block of the papers' contiguous split (cached per worker process)."""
    return agent_data(load_for(config), config, [partition_id])


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
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    if num_partitions != config.num_agents:
        raise ValueError(f"the federation has {num_partitions} partitions but "
                         f"num-agents={config.num_agents}; set both to the same value")
    data = _partition(config, partition_id)
    t = int(msg.content["config"]["server-round"])
    w = torch.tensor(msg.content["arrays"]["w"].numpy(), device=data.x.device, dtype=data.x.dtype)
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
