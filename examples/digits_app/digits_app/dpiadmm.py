"""The task with dpadmm's DP-IADMM: what a Flower app adds to plug the strategy in.

Server: ``strategies.DPIADMM(config, initial parameters)`` and ``start``; the strategy calibrates the
noise to ``target-epsilon`` and sends each client w, its dual and its last local iterate. Client: its
data as a one-agent ``AgentData`` and ``train_reply``, which calibrates as well, clips every sample's
gradient and adds the noise on the client, before anything leaves it. The statement is per client, for
one training sample added or removed, against every other party, the server included.
"""

from __future__ import annotations

from logging import INFO

import torch
from flwr.app import Context, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from clients.dpiadmm import answer_query, train_reply
from digits_app.task import Net, Results, client_block, data, settings
from dpadmm.iadmm import privacy
from dpadmm.models.logistic import AgentData
from dpadmm.models.modules import initial_parameters
from strategies import DPIADMM


def serve(grid: Grid, context: Context) -> None:
    """Train ``rounds`` rounds; log and record the model after each, then the run's statement."""
    config, own = settings(context.run_config)
    strategy = DPIADMM(config, initial_parameters(Net(), config.seed, dtype=torch.float32))
    results = Results(config, own)

    def evaluate(server_round: int, arrays) -> MetricRecord:
        value = results.add_round(server_round, arrays, **strategy.last_report.to_dict())
        log(INFO, "digits_app dpiadmm round %d: test accuracy %.4f", server_round, value)
        return MetricRecord({"accuracy": value})

    strategy.start(grid=grid, num_rounds=config.rounds, evaluate_fn=evaluate)
    statement = strategy.statement(total_samples=len(data()[1]))
    line = privacy.headline(statement, 1 - results.record["rounds"][-1]["accuracy"])
    results.write(epsilon=statement.whole_run.epsilon_pld, delta=config.delta, line=line,
                  mechanism=strategy.mechanism)
    log(INFO, "digits_app: %s", line)


def query(msg: Message, context: Context) -> Message:
    """Tell the server which agent this node is."""
    return answer_query(msg, int(context.node_config["partition-id"]))


def train(msg: Message, context: Context) -> Message:
    """E noisy local updates on this client's block; reply z_p^{t+1}."""
    config, _ = settings(context.run_config)
    partition_id, x, y = client_block(context.node_config, config)
    mine = AgentData.from_blocks([x], [y], num_classes=10, total=len(data()[1]), agents=[partition_id],
                                 dtype=torch.float32)
    return train_reply(msg, config, mine, partition_id, module=Net(), node_config=context.node_config)
