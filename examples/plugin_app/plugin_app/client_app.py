"""ClientApp of the plug-in example: one agent with its own data and the app's own network.

The DP-IADMM protocol (which agent am I; E noisy local updates from the w, lambda_p and last
local iterate the server sends) is ``clients.dpiadmm``'s; this module only says where the
agent's data come from and which network it trains. The agent keeps no state between
rounds: everything it needs arrives with each train message.

The data here are the MNIST sample that ships with dpadmm (``load_dataset("default")``),
cut into ``num-partitions`` contiguous blocks by Flower's simulation node config
(``partition-id``, ``num-partitions``). A real app loads its own samples instead: any
``x [I_p, J]`` float tensor and ``y [I_p]`` integer labels.
"""

from __future__ import annotations

from functools import lru_cache

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients.dpiadmm import answer_query, train_reply
from dpadmm.data import load_dataset
from dpadmm.iadmm.federation import DTYPES
from dpadmm.models.logistic import AgentData
from plugin_app.settings import settings

app = ClientApp()


@lru_cache(maxsize=8)
def agent_data(partition_id: int, num_partitions: int, dtype: str) -> AgentData:
    """This agent's training samples, batched as dpadmm's one-agent ``AgentData`` (cached per worker).

    ``agents=[partition_id]`` keys the agent's noise streams, and ``total`` is I, the number
    of samples over *all* agents: the objective is (1/I) sum_i l_i, so I is a public
    parameter every agent must agree on (in a deployment, give it in the node or run config).
    """
    dataset = load_dataset("default")  # replace with your own data
    block = dataset.partition(num_partitions)[partition_id]
    return AgentData.from_blocks([dataset.x_train[block]], [dataset.y_train[block]],
                                 num_classes=dataset.num_classes, total=dataset.num_train,
                                 agents=[partition_id], dtype=DTYPES[dtype])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which agent this node is (it keys the agent's state by this id)."""
    return answer_query(msg, int(context.node_config["partition-id"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """E local updates of the app's network on this agent's data; reply z_p^{t+1}."""
    config, own = settings(context.run_config)
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    if num_partitions != config.num_agents:
        raise ValueError(f"the federation has {num_partitions} SuperNodes but "
                         f"num-agents={config.num_agents}; run with --federation-config "
                         f"\"num-supernodes={config.num_agents}\"")
    data = agent_data(partition_id, num_partitions, config.dtype)
    # The node's own settings (state-dir, randomness) choose where its secret lives: never the run config.
    return train_reply(msg, config, data, partition_id, module=own.model(), node_config=context.node_config)
