"""ClientApp: the run config's ``method`` chooses which client answers a train message.

Flower's DP-FedAvg clients run their training inside ``fixedclipping_mod`` (what
``ClientApp(mods=[fixedclipping_mod])`` does in an app with that one method); DP-IADMM's clients clip
and add noise themselves, and also answer the server's query for their agent id; DP-SGD's clients clip and
add noise through Opacus.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod

from digits_app import dpfedavg, dpiadmm, dpsgd
from digits_app.task import settings

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return dpiadmm.query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    _, own = settings(context.run_config)
    if own.method == "dp-fedavg":
        return fixedclipping_mod(msg, context, dpfedavg.train)
    if own.method == "dp-sgd":
        return dpsgd.train(msg, context)
    return dpiadmm.train(msg, context)
