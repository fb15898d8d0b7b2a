"""A party of ADMM sharing (001) on Flower: its column block, its x-step and its noisy message.

The party holds the column block of its features for every sample (no labels). Each round it
receives s - z and y from the server, recovers r_m = z - sum_{k != m} D_k x~_k with the message it
sent last (the subtraction trick, Algorithm 1 party step 2), takes the x-step of eq. (6), adds its
own noise and sends D_m x~_m (:func:`dpadmm.sharing.engine.party_step`, the engine's function). It
keeps its last message and x~ in ``context.state``. The server says which round's message of this
party it holds (``own-round``); after a rejected or lost reply it sends that message itself
(``own``), so the party never subtracts a message the server did not use. For evaluation it
returns its test scores D_m^test x~_m (outside the guarantee, as every prediction is).

Its noise (:mod:`clients.randomness`): inside Flower's simulation engine, the stream keyed by the run's
seed (a simulation equals the engine); on a deployed node, its node's own secret bound to the run identity
the server sends (``run-identity``), the message released by the grid Gaussian mechanism, so that the
server, which holds the seed, can neither recompute nor subtract the noise. ``noise = paper`` has no grid
sampler: a deployed party refuses it. A deployed party records each (run, round) it answered with a digest
of the request (s - z, y, and the message it subtracts), and refuses a different request for a round it
answered. A restarted party keeps its secret and its record (files in its state folder) but loses its last
message (``context.state``), as before: the server sends that message back (``own``) after the failed
round, a request for the next round. The reply's ``config`` record says which kind the party used.

Every train reply also carries the digest of the party's ordered sample ids (``ids-sha256`` in its
``config`` record, :func:`dpadmm.data.vertical.ids_digest`): vertical learning is only meaningful
when row i is the same sample at every party and at the server, and the server checks this against
its labels' ids before it uses the message.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from clients.randomness import data_digest, node_kind, node_randomness
from dpadmm.privacy.randomness import DEPLOYMENT, request_digest
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig
from dpadmm.wire import (
    DUAL_KEY,
    IDS_DIGEST_KEY,
    KIND_KEY,
    MECHANISM_KEY,
    MESSAGE_KEY,
    OWN_KEY,
    PULLED_KEY,
    SCORES_KEY,
)

KEPT, ROUND = "sharing-kept", "sharing-round"  # the party's records in context.state (one namespace)


def _vector(record: ArrayRecord, key: str, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.array(record[key].numpy(), copy=True)).to(dtype=like.dtype, device=like.device)


def _cached(context: Context, round_: int, like: torch.Tensor) -> torch.Tensor:
    """The message this party sent in ``round_`` (round 0: the zero start)."""
    if round_ == 0:
        return torch.zeros_like(like)
    held = context.state.config_records.get(ROUND)
    if held is None or int(held["round"]) != round_:
        raise ValueError(f"the server holds this party's message of round {round_}, which it no longer has "
                         "(restarted?); the server sends it back next round")
    return _vector(context.state.array_records[KEPT], MESSAGE_KEY, like)


def request_of(config: SharingConfig, t: int, *vectors: torch.Tensor) -> str:
    """The digest of what round t asks of a party: the run config, t and the vectors its message is computed
    from (s - z, y, its own last message), so that the same digest means the same x-step and message."""
    parts: list[bytes | str | int] = [repr(sorted(config.to_mapping().items())), t]
    for vector in vectors:
        data = vector.detach().cpu().contiguous().numpy().tobytes()
        parts += [str(vector.dtype), repr(list(vector.shape)), data]
    return request_digest(*parts)


def round_reply(msg: Message, context: Context, config: SharingConfig, parties: engine.Parties,
                partition_id: int, digest: str) -> Message:
    """Answer a train message: this party's x-step and noisy message of the round, with ``digest``, that of
    its ordered sample ids, and the kind of randomness it used (``context.node_config`` may force one)."""
    settings = msg.content["config"]
    asked, t = int(settings["partition-id"]), int(settings["server-round"])
    if asked != partition_id:
        raise ValueError(f"the server asked party {asked}, but this node holds party {partition_id}")
    if config.private and config.noise == "paper" and node_kind(context.node_config) == DEPLOYMENT:
        raise ValueError(engine.PAPER_REFUSED)
    arrays = msg.content["arrays"]
    like = parties.blocks.new_zeros(parties.blocks.shape[1])
    pulled, y = _vector(arrays, PULLED_KEY, like), _vector(arrays, DUAL_KEY, like)
    if OWN_KEY in arrays:
        own = _vector(arrays, OWN_KEY, like)
    else:
        own = _cached(context, int(settings["own-round"]), like)
    n = int(like.shape[0])
    randomness, kind, _ = node_randomness(
        context.node_config, settings, partition_id, t, lambda: request_of(config, t, pulled, y, own),
        lambda: privacy.device_request(config, data_digest(parties.blocks), n))
    x, message = engine.party_step(parties, pulled.unsqueeze(0), own.view(1, 1, -1), y.unsqueeze(0), config,
                                   config.penalty(n), [config.seed], t, privacy.noise_std(config, n),
                                   randomness)
    context.state.array_records[KEPT] = ArrayRecord({MESSAGE_KEY: Array(message[0, 0].cpu().numpy()),
                                                      "x": Array(x[0, 0].cpu().numpy())})
    context.state.config_records[ROUND] = ConfigRecord({"round": t})
    metrics = MetricRecord({"partition-id": partition_id, "server-round": t})
    reply = ArrayRecord({MESSAGE_KEY: Array(message[0, 0].cpu().numpy())})
    stated = ConfigRecord({IDS_DIGEST_KEY: digest, KIND_KEY: kind,
                           MECHANISM_KEY: privacy.mechanism_of(config, n)})
    return Message(content=RecordDict({"arrays": reply, "metrics": metrics, "config": stated}), reply_to=msg)


def scores_reply(msg: Message, context: Context, parties: engine.Parties, partition_id: int) -> Message:
    """Answer an evaluate message: this party's test scores D_m^test x~_m with its last x~."""
    like = parties.test_blocks.new_zeros(parties.test_blocks.shape[2])
    kept = context.state.array_records.get(KEPT)
    x = like if kept is None else _vector(kept, "x", like)
    scores = parties.test_blocks[0] @ x
    metrics = MetricRecord({"partition-id": partition_id,
                            "server-round": int(msg.content["config"]["server-round"])})
    return Message(content=RecordDict({"arrays": ArrayRecord({SCORES_KEY: Array(scores.cpu().numpy())}),
                                       "metrics": metrics}), reply_to=msg)
