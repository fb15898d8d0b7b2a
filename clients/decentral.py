"""An agent of paper 004 on Flower: its own samples, its private weights, noise and dual; its neighbours'
iterates in, its own noisy iterate out.

Each iteration k the router sends the agent x^{k-1} of itself and its neighbours. The agent first
finishes iteration k - 1 (Algorithm 1's dual update, which needs the neighbours' x^{k-1}), then
releases x^k with :func:`dpadmm.decentral.engine.release`, the engine's own function, on a view of
the federation in which only its row holds data: its weights and noise come from its keyed streams
(seed, agent, k), so a Flower run equals the engine's. Its dual stays in ``context.state``; nothing
private leaves the agent.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from dpadmm.decentral import engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents
from dpadmm.wire import EXCHANGED_KEY, NEIGHBOURS_KEY

DUAL, DUAL_ROUND = "decentral-dual", "decentral-dual-round"  # the agent's records in context.state


def _dual(context: Context, k: int, view: Agents, agent: int) -> torch.Tensor:
    """The agent's dual of iteration k - 2 as a view [1, N, d] (zeros at the start)."""
    n, d = view.features.shape[1], view.features.shape[-1]
    dual = view.features.new_zeros((1, n, d))
    if k <= 2:
        return dual
    held = context.state.config_records.get(DUAL_ROUND)
    if held is None or int(held["round"]) != k - 2:
        raise ValueError(f"agent {agent} holds no dual of iteration {k - 2} (restarted, or it missed an "
                         "iteration): Algorithm 1's agents must take part in every iteration")
    dual[0, agent] = torch.from_numpy(np.array(context.state.array_records[DUAL]["dual"].numpy(), copy=True))
    return dual


def iterate_reply(msg: Message, context: Context, config: DecentralConfig, view: Agents, agent: int
                  ) -> Message:
    """Answer iteration k: finish k - 1 (the dual), release x^k."""
    settings = msg.content["config"]
    asked, k = int(settings["partition-id"]), int(settings["server-round"])
    if asked != agent:
        raise ValueError(f"the router asked agent {asked}, but this node holds agent {agent}")
    ids = [int(i) for i in settings[NEIGHBOURS_KEY]]
    expected = [agent, *(int(j) for j in torch.nonzero(view.adjacency[0, agent]).flatten())]
    if ids != expected:
        raise ValueError(f"agent {agent} was sent the iterates of agents {ids}; its graph says {expected}")
    rows = torch.from_numpy(np.array(msg.content["arrays"][EXCHANGED_KEY].numpy(), copy=True))
    n, d = view.features.shape[1], view.features.shape[-1]
    x = view.features.new_zeros((1, n, d))
    x[0, ids] = rows.to(x.dtype)
    dual = _dual(context, k, view, agent)
    if k > 1:
        dual = engine.dual(config, view, dual, x)  # iteration k - 1's, now that its iterates are known
    released, _ = engine.release(config, view, engine.State(x=x, dual=dual), [config.seed], k)
    context.state.array_records[DUAL] = ArrayRecord({"dual": Array(dual[0, agent].cpu().numpy())})
    context.state.config_records[DUAL_ROUND] = ConfigRecord({"round": k - 1})
    reply = ArrayRecord({EXCHANGED_KEY: Array(released[0, agent].cpu().numpy())})
    metrics = MetricRecord({"partition-id": agent, "server-round": k})
    return Message(content=RecordDict({"arrays": reply, "metrics": metrics}), reply_to=msg)
