"""An agent of paper 004 on Flower: its own samples, its private weights, noise and dual; its neighbours'
iterates in, its own noisy iterate out.

With ``exchange=plain``, each iteration k the router sends the agent x^{k-1} of itself and its
neighbours. The agent first finishes iteration k - 1 (Algorithm 1's dual update, which needs the
neighbours' x^{k-1}), then releases x^k with :func:`dpadmm.decentral.engine.release`, the engine's own
function, on a view of the federation in which only its row holds data (the other rows are placeholders
it discards). Its dual stays in ``context.state``; nothing private leaves the agent.

Its weights and noise (:mod:`clients.randomness`): inside Flower's simulation engine, its streams keyed by
(seed, agent, k), so a Flower simulation equals the engine; on a deployed node, its node's own secret bound
to the run identity the router sends (``run-identity``), the weights uniform and the iterate released by the
grid Laplace mechanism, so that nobody without the node's key, the router included, can recompute or
subtract them. A deployed agent records each (run, iteration) it answered with a digest of the request and
of its own state (dual, own iterate), and refuses another request for an iteration it answered: the same
draws on two different updates would reveal their difference. A restarted node loses its dual (it lives in
``context.state``) and refuses the iterations that need it, as it always has; the record only refuses what
no legitimate run asks (each iteration is asked once, and a repeated identical request is answered with the
same release). Each reply reports the kind its agent used (``config["randomness"]``; in the SecAgg+ form,
its fit metrics).

With ``exchange=secret`` (:func:`sum_reply`) the server sends S^{k-1}, the sum of all agents' x^{k-1}
(by SecAgg+: :func:`secure_sum_mod` runs Flower's ``secaggplus_mod`` around this handler), and the agent
keeps its own x^{k-1} too; its neighbour sum is S^{k-1} - x_i^{k-1}, as in the engine's
``exchange=secret``.
"""

from __future__ import annotations

from logging import WARNING

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat

from clients.gate import decentral_sum
from clients.randomness import data_digest, node_randomness
from dpadmm.decentral import engine, privacy
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents
from dpadmm.privacy.device import DeviceRefused, RunRequest
from dpadmm.privacy.randomness import DEPLOYMENT, request_digest
from dpadmm.wire import EXCHANGED_KEY, KIND_KEY, MECHANISM_KEY, NEIGHBOURS_KEY

DUAL, DUAL_ROUND = "decentral-dual", "decentral-dual-round"  # the agent's records in context.state
OWN = "decentral-own"  # with exchange=secret: its own last iterate, beside the dual


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


def request_of(config: DecentralConfig, k: int, *parts: torch.Tensor | list[int]) -> str:
    """The digest of what iteration k asks of an agent and of the state it answers from: the run config, k,
    and each part (the neighbours' ids, the iterates received, the agent's dual and own iterate), so that the
    same digest means the same update and hence the same release."""
    pieces: list[bytes | str | int] = [repr(sorted(config.to_mapping().items())), k]
    for part in parts:
        if isinstance(part, torch.Tensor):
            data = part.detach().cpu().contiguous().numpy().tobytes()
            pieces += [str(part.dtype), repr(list(part.shape)), data]
        else:
            pieces.append(repr(part))
    return request_digest(*pieces)


def device_request(config: DecentralConfig, view: Agents, agent: int) -> RunRequest:
    """The run as agent ``agent``'s device sees it (:func:`dpadmm.decentral.privacy.device_request`), bound
    to its own samples."""
    return privacy.device_request(config, data_digest(view.features[0, agent], view.labels[0, agent]),
                                  int(view.features.shape[-1]))


def iterate_reply(msg: Message, context: Context, config: DecentralConfig, view: Agents, agent: int
                  ) -> Message:
    """Answer iteration k: finish k - 1 (the dual), release x^k, with the kind of randomness the node uses
    (``context.node_config`` may force one: :mod:`clients.randomness`)."""
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
    randomness, kind, _ = node_randomness(context.node_config, settings, agent, k,
                                          lambda: request_of(config, k, ids, rows, dual[0, agent]),
                                          lambda: device_request(config, view, agent))
    released, _ = engine.release(config, view, engine.State(x=x, dual=dual), [config.seed], k, randomness)
    context.state.array_records[DUAL] = ArrayRecord({"dual": Array(dual[0, agent].cpu().numpy())})
    context.state.config_records[DUAL_ROUND] = ConfigRecord({"round": k - 1})
    reply = ArrayRecord({EXCHANGED_KEY: Array(released[0, agent].cpu().numpy())})
    metrics = MetricRecord({"partition-id": agent, "server-round": k})
    stated = ConfigRecord({KIND_KEY: kind, MECHANISM_KEY: privacy.mechanism_of(config, d)})
    return Message(content=RecordDict({"arrays": reply, "metrics": metrics, "config": stated}), reply_to=msg)


def _own(context: Context, config: DecentralConfig, k: int, view: Agents, agent: int) -> torch.Tensor:
    """The agent's own x^{k-1} as a view [1, N, d]: the keyed x^0 at the start, else the one it kept."""
    x = view.features.new_zeros((1, view.features.shape[1], view.features.shape[-1]))
    if k == 1:
        x[0, agent] = engine.initial_state(view, [config.seed]).x[0, agent]
        return x
    held = context.state.config_records.get(DUAL_ROUND)
    if held is None or int(held["round"]) != k - 2 or OWN not in context.state.array_records:
        raise ValueError(f"agent {agent} holds no iterate of iteration {k - 1} (restarted, or it missed an "
                         "iteration): Algorithm 1's agents must take part in every iteration")
    x[0, agent] = torch.from_numpy(np.array(context.state.array_records[OWN]["x"].numpy(), copy=True))
    return x


def sum_reply(msg: Message, context: Context, config: DecentralConfig, view: Agents, agent: int) -> Message:
    """Answer iteration k of the SecAgg+ form (a legacy fit message carrying S^{k-1}): finish k - 1 (the
    dual), release x^k with :func:`dpadmm.decentral.engine.release` from the neighbour sum
    S^{k-1} - x_i^{k-1}. The reply goes to ``secaggplus_mod``, which masks it; it must lie within
    ``secagg-range``, else the agent stops the run rather than let SecAgg+ clip it. The server's fit config
    carries the run identity; the reply's fit metrics say the kind of randomness (SecAgg+ passes them on)."""
    fit = recorddict_compat.recorddict_to_fitins(msg.content, keep_input=True)
    k = int(fit.config["server-round"])
    summed = parameters_to_ndarrays(fit.parameters)
    if len(summed) != 1:
        raise DeviceRefused(f"the server's fit message carries {len(summed)} arrays; it carries one, the sum "
                            "S^{k-1}")
    decentral_sum(summed[0], config, view)  # before the sum meets the agent's data
    total = torch.from_numpy(np.array(summed[0], copy=True))
    x = _own(context, config, k, view, agent)
    sums = total.to(x.dtype) - x  # [1, N, d]; only this agent's row is its neighbour sum
    dual = _dual(context, k, view, agent)
    if k > 1:
        dual = engine.dual(config, view, dual, x, sums)  # iteration k - 1's
    randomness, kind, _ = node_randomness(context.node_config, fit.config, agent, k,
                                          lambda: request_of(config, k, total, x[0, agent], dual[0, agent]),
                                          lambda: device_request(config, view, agent))
    released, _ = engine.release(config, view, engine.State(x=x, dual=dual, sums=sums), [config.seed], k,
                                 randomness)
    mine = released[0, agent].cpu().numpy()
    largest = float(np.abs(mine).max())
    if largest > config.secagg_range:
        if kind == DEPLOYMENT:
            # the noisy iterate is the release: clipping it to the range is post-processing, what SecAgg+
            # would do; whether the node answers is never decided by it (the node's own log says it)
            log(WARNING, "dpadmm node: agent %d's iterate of iteration %d is clipped to secagg-range=%g",
                agent, k, config.secagg_range)
            mine = np.clip(mine, -config.secagg_range, config.secagg_range)
        else:  # a simulation protects nothing: it stops, so that the experimenter raises the range
            raise ValueError(f"agent {agent}'s iterate of iteration {k} has a coordinate outside "
                             f"secagg-range={config.secagg_range:g}, which SecAgg+ would clip; raise it")
    context.state.array_records[DUAL] = ArrayRecord({"dual": Array(dual[0, agent].cpu().numpy())})
    context.state.array_records[OWN] = ArrayRecord({"x": Array(mine)})
    context.state.config_records[DUAL_ROUND] = ConfigRecord({"round": k - 1})
    reply = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([mine]),
                   num_examples=1, metrics={"partition-id": agent, "server-round": k, KIND_KEY: kind,
                                            MECHANISM_KEY: privacy.mechanism_of(config, int(mine.shape[-1]))})
    return Message(content=recorddict_compat.fitres_to_recorddict(reply, keep_input=True), reply_to=msg)


def secure_sum_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``secaggplus_mod`` for the messages of a SecAgg+ workflow (those carrying its configs); every
    other message passes through, so one ClientApp serves every family."""
    if msg.metadata.message_type == MessageType.TRAIN and RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)
