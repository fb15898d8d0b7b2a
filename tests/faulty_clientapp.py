"""A ClientApp that runs the real agent (``clients.client_app``) and then spoils chosen replies.

Used by ``tests/test_dpiadmm.py`` as the client of a real Flower simulation (it is copied
into a temporary Flower app next to a pyproject.toml): each (partition, round) in FAULTS
gets one kind of bad reply, everything else is the real agent's reply. The server must
reject every spoiled reply with its reason and never aggregate it.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients import client_app
from dpadmm.wire import MECHANISM_KEY

# (partition, round) -> fault; with seed 0, P = 5 and fraction-train 0.8 each of these
# partitions is sampled in that round.
FAULTS = {
    (1, 1): "raise",
    (2, 2): "non-finite",
    (4, 2): "shape",
    (0, 3): "dtype",
    (3, 3): "other-id",
    (1, 4): "late",
    (2, 4): "malformed",
    (3, 5): "mechanism",  # a client that ran another mechanism than the server states (no calibration)
    (4, 6): "refuse",  # a node that can no longer use its data (a fault that would repeat): the run ends
}
EVERY_AGENT_RAISES = 99  # the run config's seed that makes every agent raise in every round

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return client_app.query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    p = int(context.node_config["partition-id"])
    t = int(msg.content["config"]["server-round"])
    fault = FAULTS.get((p, t))
    if EVERY_AGENT_RAISES in {int(v) for k, v in context.run_config.items() if k.endswith(".seed")}:
        fault = "raise"
    if fault == "raise":
        raise RuntimeError(f"injected failure of agent {p} in round {t}")
    if fault == "refuse":
        return client_app.refusal(msg, f"injected refusal of agent {p}'s data in round {t}")
    reply = client_app.train(msg, context)
    if fault is None:
        return reply
    arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
    metrics = dict(reply.content["metrics"])
    if fault == "non-finite":
        arrays["z.weight"][0, 0] = np.nan
    elif fault == "shape":
        arrays["z.weight"] = arrays["z.weight"][:-1]
    elif fault == "dtype":
        arrays["z.weight"] = arrays["z.weight"].astype(np.float32)
    elif fault == "other-id":
        metrics["partition-id"] = (p + 1) % 5
    elif fault == "late":
        metrics["server-round"] = t - 1
    spoiled = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
    content = RecordDict({"arrays": spoiled})
    if fault != "malformed":
        content["metrics"] = MetricRecord(metrics)
    stated = dict(reply.content["config"])
    if fault == "mechanism":
        stated[MECHANISM_KEY] = "laplace, noise multiplier 1.0, sampling 1.0, 2 per round"
    content["config"] = ConfigRecord(stated)
    return Message(content=content, reply_to=msg)
