"""ClientApp: plain local SGD on the agent's block; Flower's ``fixedclipping_mod`` clips the update.

The agent is the node's ``partition-id`` in dpadmm's partition of the configured data set (the
blocks DP-IADMM's agents hold). It replies its model with the received keys in the received order
(the mod requires it) and the weight 1: Flower's accountant for fixed clipping accepts only equal
client weights, the uniform average whose sensitivity is C / n.
"""

from __future__ import annotations

from functools import lru_cache

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from torch import nn

from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import load_for
from dpadmm.models.modules import build_model
from dpfedavg_bench.baselines import agent_blocks, local_sgd, stream_seed

app = ClientApp(mods=[fixedclipping_mod])


@lru_cache(maxsize=2)
def federation(dataset: str, data_dir: str, num_agents: int) -> tuple[nn.Module, list]:
    """The model and every agent's (x, y), loaded once per worker process."""
    data = load_for(RunConfig(dataset=dataset, data_dir=data_dir, num_agents=num_agents))
    return build_model("logistic", data.num_features, data.num_classes), agent_blocks(data, num_agents)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local SGD from the received model, with the round's ConfigRecord settings."""
    run_config, config = context.run_config, msg.content["config"]
    module, blocks = federation(str(run_config["dataset"]), str(run_config["data-dir"]),
                                int(run_config["num-agents"]))
    partition = int(context.node_config["partition-id"])
    x, y = blocks[partition]
    received = msg.content["arrays"].to_torch_state_dict()
    local = local_sgd(module, dict(received), x, y, epochs=int(config["local-epochs"]),
                      batch_size=int(config["batch-size"]), lr=float(config["lr"]),
                      seed=stream_seed(int(config["seed"]), partition, int(config["server-round"])))
    arrays = ArrayRecord({k: Array(local[k].numpy()) for k in received})
    metrics = MetricRecord({"agent-weight": 1, "num-examples": int(x.shape[0])})
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
