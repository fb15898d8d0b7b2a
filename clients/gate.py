"""The gate: every message a node answers, of every family and kind, is checked here before its values
meet the node's data.

A deployed device answers a server it does not trust, and the server sees more than the releases: whether
the node answered, refused or failed, and the text of a refusal. If anything computed from the data decided
those, a server could ask a question whose answer is one noise-free bit about a sample (two entries of z at
1e308 overflow a sample's logit iff both its pixels are bright; a z that puts the regulariser at the edge of
the release's range; a w with fewer classes than the device's largest label). So the node decides whether it
answers from what the server sent and what its operator set, here, and after the gate nothing computed from
the data can change that decision:

- the message's shape: exactly the arrays its kind carries, each of the shape the node's own description
  gives (DP-IADMM's model from the run's data set and model, never the class count of the server's w; a
  party's or an agent's from the sizes its protocol makes public: the shared sample count, the feature
  count, its neighbours in the public graph), float32 or float64, and the config values it needs (this
  node's partition, a round of the run);
- the values: every entry finite and at most :data:`MAX_ABS` in magnitude, and, where a family states it,
  an a-priori bound on the value a release adds its noise to (DP-IADMM's
  :func:`dpadmm.iadmm.local.release_bound`) within :data:`MAX_RELEASE`, so every later step stays finite;
- the kind: ADMM sharing's evaluate reply (test scores, a noise-free function of the party's training rows)
  is refused on a deployed node.

After the gate the rules that remain are total: per-sample clipping drops a term whose norm is not finite
(:func:`dpadmm.models.logistic.total_clip_factors`), a grid release clamps each coordinate into its range
instead of refusing it (:mod:`dpadmm.privacy.secure`), a sharing party's x-step is projected onto its ball
whatever it holds (:func:`dpadmm.sharing.updates.onto_ball`), a deployed 004 agent's noisy iterate is
clipped to ``secagg-range`` as SecAgg+ would clip it. The device's own file is read by per-row rules too: a
row outside the run's classes or range is dropped (DP-IADMM, :func:`dpadmm.data.node.load_device_data`) or
kept as a zero row (001, 004, whose sample counts are public), counted in the device's log only. Refusals
(:class:`~dpadmm.privacy.device.DeviceRefused`) name only what the server sent and the operator set.

The same gate runs in simulation, so that a simulated node answers as a deployed one would (only the
evaluate refusal is the deployment kind's: a simulation protects nothing, and its parties' test scores are
how a simulated run is evaluated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from clients.randomness import node_kind
from dpadmm import wire
from dpadmm.data import NUM_CLASSES, NUM_FEATURES
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.local import release_bound
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.models.modules import build_model
from dpadmm.privacy.device import DeviceRefused
from dpadmm.privacy.randomness import DEPLOYMENT
from dpadmm.sharing.config import SharingConfig

# The largest magnitude of a number a server sends a node: far above any model, dual or iterate a run holds
# (a run whose values grow past it has diverged), far below where a product of two of them overflows float32.
MAX_ABS = 2.0**40
# The largest a-priori bound on a value before its noise (float32 holds 2**128): the sums and steps after it
# stay finite, so whether the node answers is never decided by an overflow.
MAX_RELEASE = 2.0**64
FLOATS = ("float32", "float64")
EVALUATE_REFUSED = ("a deployed party does not answer evaluate messages: its test scores are a noise-free "
                    "function of its training rows, outside any release")


def integer(settings: Mapping[str, Any], key: str, low: int, high: int) -> int:
    """``settings[key]``, an integer in ``low..high``, or refused naming the key and the range."""
    value = settings.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = type(value).__name__ if not isinstance(value, int | float | str) else repr(value)[:40]
        raise DeviceRefused(f"the server's {key}={shown} is not allowed; it must be an integer in "
                            f"{low}..{high}")
    return value


def arrays(record: Any, shapes: Mapping[str, tuple[int, ...]], optional: Sequence[str] = ()
           ) -> dict[str, np.ndarray]:
    """The arrays of ``record`` as numpy, when it holds exactly the names of ``shapes`` (those of ``optional``
    may be absent), each a float32 or float64 array of its shape with finite entries of magnitude at most
    :data:`MAX_ABS` (the bytes are decoded and checked, not the array's declared metadata); else refused,
    naming the array and what is allowed."""
    if not isinstance(record, ArrayRecord):
        raise DeviceRefused("the server's message carries no array record; this message kind needs one")
    names, needed = set(record.keys()), set(shapes) - set(optional)
    if not needed <= names <= set(shapes):
        raise DeviceRefused(f"the server's arrays are {_names(names)}; this message kind carries "
                            f"{_names(needed)}" + (f" and optionally {_names(optional)}" if optional else ""))
    out = {}
    for name in sorted(names):
        try:
            value = record[name].numpy()
        except Exception:  # noqa: BLE001 (bytes that are no numpy array: the server's fault, named)
            raise DeviceRefused(f"the server's array {name!r} cannot be read as a numpy array") from None
        if value.dtype.name not in FLOATS or tuple(value.shape) != tuple(shapes[name]):
            raise DeviceRefused(f"the server's array {name!r} is {value.dtype.name} of shape "
                                f"{list(value.shape)}; this node's is float32 or float64 of shape "
                                f"{list(shapes[name])}")
        if value.size and not np.isfinite(value).all():
            raise DeviceRefused(f"the server's array {name!r} has a non-finite entry; allowed: finite "
                                "numbers")
        if value.size and float(np.abs(value).max()) > MAX_ABS:
            raise DeviceRefused(f"the server's array {name!r} has an entry of magnitude "
                                f"{float(np.abs(value).max()):.4g}; this node accepts at most 2**40")
        out[name] = value
    return out


def _names(names: Sequence[str] | set[str]) -> str:
    listed = sorted(str(n)[:40] for n in names)
    return "[" + ", ".join(repr(n) for n in listed[:8]) + (", ...]" if len(listed) > 8 else "]")


def iadmm_shapes(config: RunConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter of the run's model, from the run's model and data set (the class count of
    the data set, never of the server's arrays): logistic regression's ``weight`` [J, K], or a module's."""
    classes = NUM_CLASSES[config.dataset]
    if config.model == "logistic":
        return {"weight": (NUM_FEATURES, classes)}
    module = build_model(config.model, NUM_FEATURES, classes)
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def _iadmm(msg: Message, config: RunConfig, partition_id: int) -> None:
    settings = msg.content.config_records.get("config", {})
    integer(settings, "partition-id", partition_id, partition_id)
    integer(settings, "server-round", 1, config.rounds)
    shapes = iadmm_shapes(config)
    received = arrays(msg.content.array_records.get("arrays"),
                      wire.pack({role: shapes for role in wire.DOWN}))
    if config.algorithm != "outp" and config.clipped:
        largest = max((float(np.abs(v).max()) for v in received.values() if v.size), default=0.0)
        bound = release_bound(config, largest)
        if not bound <= MAX_RELEASE:
            raise DeviceRefused(f"with beta={config.beta:g}, clip-norm={config.clip_norm:g}, "
                                f"sampling-rate={config.sampling_rate:g} and the server's largest entry "
                                f"{largest:.4g}, a gradient before its noise could reach {bound:.4g}; this "
                                "node releases values of at most 2**64")


def _linadmm(msg: Message, config: LinAdmmConfig, features: torch.Tensor, partition_id: int) -> None:
    settings = msg.content.config_records.get("config", {})
    integer(settings, "partition-id", partition_id, partition_id)
    integer(settings, "server-round", 1, config.rounds)
    arrays(msg.content.array_records.get("arrays"), {wire.POINT_KEY: (int(features.shape[-1]),)})


def _sharing(msg: Message, config: SharingConfig, samples: int, partition_id: int) -> None:
    settings = msg.content.config_records.get("config", {})
    integer(settings, "partition-id", partition_id, partition_id)
    t = integer(settings, "server-round", 1, config.rounds)
    integer(settings, "own-round", 0, t - 1)
    shape = (samples,)
    arrays(msg.content.array_records.get("arrays"), {wire.PULLED_KEY: shape, wire.DUAL_KEY: shape,
                                                     wire.OWN_KEY: shape}, optional=(wire.OWN_KEY,))


def _decentral(msg: Message, config: DecentralConfig, view: Agents, agent: int) -> None:
    d = int(view.features.shape[-1])
    if config.exchange == "secret":
        return  # SecAgg+'s own messages: checked by the mod, and the sum below by sum_reply's gate
    settings = msg.content.config_records.get("config", {})
    integer(settings, "partition-id", agent, agent)
    integer(settings, "server-round", 1, config.rounds)
    expected = [agent, *(int(j) for j in torch.nonzero(view.adjacency[0, agent]).flatten())]
    ids = settings.get(wire.NEIGHBOURS_KEY)
    if not isinstance(ids, list) or ids != expected:
        raise DeviceRefused(f"the server's {wire.NEIGHBOURS_KEY} are not agent {agent}'s closed "
                            f"neighbourhood in the run's public graph, {expected}")
    arrays(msg.content.array_records.get("arrays"), {wire.EXCHANGED_KEY: (len(expected), d)})


def decentral_sum(total: np.ndarray, config: DecentralConfig, view: Agents) -> None:
    """The gate of 004's SecAgg+ form: the sum S^{k-1} = sum_i x_i^{k-1} the server sends, [d], finite and
    within :data:`MAX_ABS` (it arrives inside the legacy fit message that ``secaggplus_mod`` unwraps)."""
    shape = (int(view.features.shape[-1]),)
    if total.dtype.name not in FLOATS or tuple(total.shape) != shape:
        raise DeviceRefused(f"the server's sum is {total.dtype.name} of shape {list(total.shape)}; this "
                            f"node's is float32 or float64 of shape {list(shape)}")
    if total.size and not (np.isfinite(total).all() and float(np.abs(total).max()) <= MAX_ABS):
        raise DeviceRefused("the server's sum has an entry that is not finite or above 2**40 in magnitude; "
                            "allowed: finite numbers of magnitude at most 2**40")


def check_train(msg: Message, config: Any, held: Any, partition_id: int) -> None:
    """The gate of a train message of ``config``'s family, for the node holding ``held`` (what
    ``clients.client_app.read_node`` returns: only its shapes are read here)."""
    if isinstance(config, LinAdmmConfig):
        _linadmm(msg, config, held[0], partition_id)
    elif isinstance(config, DecentralConfig):
        _decentral(msg, config, held, partition_id)
    elif isinstance(config, SharingConfig):
        _sharing(msg, config, int(held[0].blocks.shape[1]), partition_id)
    else:
        _iadmm(msg, config, partition_id)


def check_evaluate(msg: Message, node_config: Mapping[str, Any], config: Any) -> None:
    """The gate of an evaluate message: refused on a deployed node (ADMM sharing's scores are no release;
    the other families evaluate on the server), else its round must be one of the run's."""
    if node_kind(node_config) == DEPLOYMENT:
        raise DeviceRefused(EVALUATE_REFUSED)
    rounds = getattr(config, "rounds", 1)
    integer(msg.content.config_records.get("config", {}), "server-round", 0, rounds)


def check_query(msg: Message) -> None:
    """The gate of a query message: the partition question, and nothing else of size (an identity)."""
    content = msg.content
    if not isinstance(content, RecordDict) or content.array_records:
        raise DeviceRefused("the server's query carries arrays; a query asks for the partition id only")
    settings = content.config_records.get("config", {})
    if settings.get("query") != "partition-id":
        raise DeviceRefused("the server's query does not ask for the partition id; no other query is "
                            "answered")
