"""A ClientApp that runs the real ADMM-sharing party (``clients.client_app``) and spoils chosen replies.

Used by ``tests/test_sharing_flower.py`` as the client of a real Flower simulation (copied into a
temporary Flower app): each (party, round) in FAULTS gets one kind of bad reply, everything else
is the real party's reply. "refuse" is the reply of a party that can no longer use its data (a fault that
would repeat every round), which ends the run.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients import client_app

FAULTS = {(1, 2): "non-finite", (0, 3): "raise", (1, 4): "shape", (1, 6): "refuse"}
EVERY_PARTY_SPOILS = 99  # the run config's sharing.seed that makes every party send a non-finite message

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return client_app.query(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return client_app.evaluate(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    party = int(context.node_config["partition-id"])
    t = int(msg.content["config"]["server-round"])
    fault = FAULTS.get((party, t))
    if int(context.run_config["sharing.seed"]) == EVERY_PARTY_SPOILS:
        fault = "non-finite"
    if fault == "raise":
        raise RuntimeError(f"injected failure of party {party} in round {t}")
    if fault == "refuse":
        return client_app.refusal(msg, f"injected refusal of party {party}'s data in round {t}")
    reply = client_app.train(msg, context)
    if fault is None:
        return reply
    message = np.array(reply.content["arrays"]["message"].numpy(), copy=True)
    if fault == "shape":
        message = np.concatenate([message, [0.0]])
    else:
        message[0] = np.nan
    content = RecordDict({"arrays": ArrayRecord({"message": Array(message)}),
                          "metrics": reply.content["metrics"], "config": reply.content["config"]})
    return Message(content=content, reply_to=msg)
