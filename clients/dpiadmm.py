"""The agent's side of the DP-IADMM protocol for any model: what a user's ClientApp calls.

A Flower app with its own model and data plugs our strategy in (``strategies.DPIADMM``)
and answers its messages with these helpers::

    from clients.dpiadmm import answer_query, train_reply

    @app.query()
    def query(msg, context):
        return answer_query(msg, partition_id)

    @app.train()
    def train(msg, context):
        config = RunConfig.from_mapping(context.run_config)  # calibrated by train_reply itself
        data = AgentData.from_blocks([x], [y], num_classes=K, total=I, agents=[partition_id])
        return train_reply(msg, config, data, partition_id, module=MyNet())

The learning is ``dpadmm.iadmm.local.agent_round`` with an agent dimension of 1: E local
updates of eq. (8) (or the trust region) with per-sample clipping and noise. The
agent keeps no model state between rounds: the server sends w, lambda_p and the last local
iterate, and the agent sends back z_p^{t+1} (and its last iterate when z_p^{t+1} averages E > 1).

Its noise and samples: inside Flower's simulation engine, the streams keyed by the run's seed (a
simulation equals the engine); on a deployed node, the node's own secret, bound to the run identity the
server sends (:mod:`clients.randomness`). A deployed node records each (run, round) it answered with a
digest of the request, and refuses the same round asked again with another state: the draws of a round
are fixed, and two different inputs under the same noise would reveal their difference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch import nn

from clients.randomness import data_digest, node_randomness
from dpadmm import wire
from dpadmm.iadmm import privacy
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.local import agent_round
from dpadmm.models.logistic import AgentData
from dpadmm.privacy.device import RunRequest
from dpadmm.privacy.randomness import Secret, request_digest


def answer_query(msg: Message, partition_id: int) -> Message:
    """Tell the server which agent this node is: its partition id (the key of its state and noise)."""
    return Message(content=RecordDict({"metrics": MetricRecord({"partition-id": int(partition_id)})}),
                   reply_to=msg)


def local_update(config: RunConfig, data: AgentData, arrays: ArrayRecord, t: int,
                 module: nn.Module | None = None,
                 randomness: Secret | None = None) -> dict[str, torch.Tensor]:
    """The reply's arrays: E local updates of round t from the received w, lambda_p and last iterate.

    ``module=None`` is the papers' logistic regression (one parameter, ``weight`` [J, K], on
    the closed-form fast path); otherwise the received parameters are ``module``'s.
    ``randomness`` is the deployment kind's (None: keyed by the seed).
    Returns ``z.<parameter>`` (z_p^{t+1}) and, when z is the average of E > 1 iterates,
    ``z-last.<parameter>`` (:attr:`RunConfig.sends_last_iterate`).
    """
    received = wire.unpack(arrays)
    missing = [role for role in wire.DOWN if role not in received]
    if missing:
        raise ValueError(f"the server's message lacks {missing}; it must carry {list(wire.DOWN)}")
    device, dtype = data.x.device, data.x.dtype
    state = {role: {name: torch.tensor(received[role][name].numpy(), device=device, dtype=dtype)
                    for name in received["w"]} for role in wire.DOWN}
    if module is None:
        if list(state["w"]) != ["weight"] or state["w"]["weight"].shape != data.shape:
            shapes = {name: tuple(v.shape) for name, v in state["w"].items()}
            raise ValueError(f"the server's parameters {shapes} are not logistic regression's "
                             f"{{'weight': {data.shape}}} for this agent's data")
        w, lam, z_chain = (state[role]["weight"] for role in wire.DOWN)
        result = agent_round(config, data, w, lam[None], z_chain[None], t, randomness=randomness)
        z_sent, z_last = {"weight": result.z_sent}, {"weight": result.z_last}
    else:
        w = state["w"]
        lam, z_chain = ({name: v[None] for name, v in state[role].items()} for role in ("lambda", "z"))
        result = agent_round(config, data, w, lam, z_chain, t, module=module, randomness=randomness)
        z_sent, z_last = result.z_sent, result.z_last
    reply = {"z": {name: v[0].cpu() for name, v in z_sent.items()}}
    if config.sends_last_iterate:
        reply["z-last"] = {name: v[0].cpu() for name, v in z_last.items()}
    return wire.pack(reply)


def request_of(msg: Message, config: RunConfig) -> str:
    """The digest of what a train message asks: the run config and every array it sends (w, lambda_p, z)."""
    arrays = msg.content["arrays"]
    parts: list[bytes | str] = [repr(sorted(config.to_mapping().items()))]
    for name in sorted(arrays):
        array = arrays[name]
        parts += [name, str(array.dtype), repr(list(array.shape)), bytes(array.data)]
    return request_digest(*parts)


def device_request(config: RunConfig, data: AgentData) -> RunRequest:
    """The run as this agent's device sees it (:func:`dpadmm.iadmm.privacy.device_request`), bound to its
    data."""
    return privacy.device_request(config, data_digest(data.x, data.y, data.counts))


def train_reply(msg: Message, config: RunConfig, data: AgentData, partition_id: int,
                module: nn.Module | None = None, node_config: Mapping[str, object] | None = None) -> Message:
    """Answer a train message: refuse another agent's state, run round t, reply z_p^{t+1}.

    ``config`` is the run's, as the run config gives it: the agent calibrates eps-bar to its
    ``target-epsilon`` itself (on a deployed node once per run, by the device's ledger; a client cannot skip
    it). ``data`` is this agent's, with ``agents=[partition_id]`` (the agent's id in its draws) and ``total``
    the federation's sample count I. ``node_config`` is the node's (``context.node_config``): its
    ``randomness`` and ``state-dir`` settings, if any (:mod:`clients.randomness`). On a deployed node the
    device admits the run first (:mod:`dpadmm.privacy.device`: its policy and lifetime budget); a refusal
    raises :class:`~dpadmm.privacy.device.DeviceRefused`. The reply says which kind of randomness the agent
    used and which mechanism it ran (``wire.MECHANISM_KEY``), which the server checks against its statement.
    """
    sent_for = int(msg.content["config"]["partition-id"])
    if sent_for != partition_id:
        raise ValueError(f"the server sent the state of partition {sent_for} to agent {partition_id}; "
                         "refusing to compute on another agent's state")
    if int(data.agents[0]) != partition_id:
        raise ValueError(f"data.agents={data.agents.tolist()} but partition_id={partition_id}: the data's "
                         "agent id keys the noise streams and must be this agent's partition id")
    t = int(msg.content["config"]["server-round"])
    randomness, kind, charge = node_randomness(node_config or {}, msg.content["config"], partition_id, t,
                                               lambda: request_of(msg, config),
                                               lambda: device_request(config, data))
    if charge is not None and "epsilon" in charge.settings:  # calibrated once, when the device admitted it
        run = dataclasses.replace(config, epsilon=charge.settings["epsilon"])
    else:
        run = privacy.calibrate(config)
    out = local_update(run, data, msg.content["arrays"], t, module, randomness)
    metrics = MetricRecord({"partition-id": partition_id, "server-round": t})
    stated = ConfigRecord({wire.KIND_KEY: kind, wire.MECHANISM_KEY: privacy.mechanism_of(run)})
    return Message(content=RecordDict({"arrays": ArrayRecord(out), "metrics": metrics, "config": stated}),
                   reply_to=msg)
