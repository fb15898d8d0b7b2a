"""The ClientApp of every family; for DP-IADMM one agent's lines 15-22 of 003 Algorithm 1.

``algorithm`` picks the family (:mod:`dpadmm.families`). A DP-ADMM / DP-AccADMM (002) client
answers with its rows' clipped gradient sum (:mod:`clients.linadmm`); an ADMM-sharing (001) party
with its noisy message, and for evaluation its test scores (:mod:`clients.sharing`). For DP-IADMM:

The learning is ``dpadmm.iadmm.local.agent_round`` with an agent dimension of 1, called through
``clients.dpiadmm`` (the protocol helpers any user's ClientApp can call too); this module only
finds the agent's data and model. The agent keeps **no state between rounds**:
the server sends it w together with its own lambda_p and last local iterate, and it sends
back z_p^{t+1} (and its last iterate when z_p^{t+1} averages E > 1). lambda_p is a function of the w's and
z_p's the server already holds, so the server's copy is the agent's line 23 computed once;
a device that restarts or misses rounds therefore loses nothing (docs/deployment.md says
what this means for privacy).

Where the agent's data come from, by node config:

- simulation: ``partition-id`` and ``num-partitions`` (Flower sets them): block
  ``partition-id`` of the configured data set's partition;
- deployment on a device: ``partition-id`` (this agent's id, 0..P-1), ``data-path`` (the
  device's own file: LEAF JSON, IDX images with ``labels-path``, or npz; see
  :mod:`dpadmm.data.node`), ``writer`` for a LEAF file with several writers, and
  ``num-samples-total``, the global sample count I (a public parameter of eq. (63)).

An ADMM-sharing (001) party: in simulation its column block of the configured data set; in
deployment ``partition-id`` (its party, 0..M-1) and ``data-path``, its own ``.npz`` of sample ids
and column block (:func:`dpadmm.data.vertical.read_party_file`). A 004 agent: in simulation its
samples of the run's draw; in deployment ``partition-id`` (its agent, 0..N-1) and ``data-path``, its
own ``.npz`` of samples (:func:`dpadmm.decentral.problem.read_agent_file`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from clients.decentral import device_request as decentral_request
from clients.decentral import iterate_reply, secure_sum_mod, sum_reply
from clients.dpiadmm import answer_query, train_reply
from clients.dpiadmm import device_request as iadmm_request
from clients.gate import check_evaluate, check_query, check_train
from clients.linadmm import gradient_reply
from clients.randomness import data_digest, node_admission, node_charge
from clients.sharing import round_reply, scores_reply
from dpadmm.data import NUM_CLASSES, NUM_FEATURES, Dataset
from dpadmm.data.libsvm import load_binary
from dpadmm.data.node import load_device_data
from dpadmm.data.partition import partition_contiguous
from dpadmm.data.vertical import read_party_file, row_digest
from dpadmm.decentral import engine as decentral_engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents, agent_view, read_agent_file
from dpadmm.families import from_run_config
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.federation import DTYPES, agent_data, load_for, resolve_device
from dpadmm.linadmm import engine as linadmm_engine
from dpadmm.linadmm import privacy as linadmm_privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import rows as problem_rows
from dpadmm.models.logistic import AgentData
from dpadmm.models.modules import build_model
from dpadmm.privacy.device import DeviceRefused, RunRequest
from dpadmm.sharing import engine as sharing_engine
from dpadmm.sharing import privacy as sharing_privacy
from dpadmm.sharing.config import SharingConfig
from dpadmm.wire import IDENTITY_KEY, REFUSED_KEY

app = ClientApp()
log = logging.getLogger("dpadmm.node")


@lru_cache(maxsize=256)
def _partition(config: RunConfig, partition_id: int) -> AgentData:
    """This agent's block of the data set's partition (cached per worker process)."""
    return agent_data(load_for(config), config, [partition_id])


@lru_cache(maxsize=4)
def _device_data(config: RunConfig, agent: int, path: str, labels_path: str, writer: str, total: int,
                 num_classes: int) -> AgentData:
    """This device's own samples (deployment), batched as one agent."""
    x, y, dropped = load_device_data(path, labels_path=labels_path, writer=writer, num_classes=num_classes)
    if dropped:  # the device's own log only: a count computed from the data
        log.warning("dpadmm node: data-path %s: %d row(s) outside the run's %d classes or [0, 1] are not "
                    "used", path, dropped, num_classes)
    if x.shape[0] > total:  # the operator's setting is wrong; the text names no count of the data
        raise ValueError(f"data-path {path} holds more samples than num-samples-total={total}, the "
                         "federation's count; give the count of all agents' samples")
    return AgentData.from_blocks([x], [y], num_classes=num_classes, total=total, agents=[agent],
                                 dtype=DTYPES[config.dtype], device=resolve_device(config.device))


def require_federation(num_partitions: int, agents: int, setting: str, who: str = "agent") -> None:
    """A simulated federation has one SuperNode per agent: a ValueError naming ``setting`` (the key that sets
    the run's ``agents``) and the fix unless it has ``agents`` SuperNodes."""
    if num_partitions != agents:
        raise ValueError(f"the federation has {num_partitions} SuperNodes but {setting} needs {agents}, one "
                         f"per {who}: flwr run . --federation-config 'num-supernodes={agents}'")


def agent_data_for(config: RunConfig, node_config: Mapping[str, Any], num_classes: int) -> AgentData:
    """The agent's data: the device's own file when the node config names one, else its partition."""
    partition_id = int(node_config["partition-id"])
    if not 0 <= partition_id < config.num_agents:
        raise ValueError(f"partition-id={partition_id} is not allowed; "
                         f"it must be in 0..{config.num_agents - 1}")
    if "data-path" in node_config:
        if "num-samples-total" not in node_config:
            raise ValueError("node config has data-path but no num-samples-total: give the global sample "
                             "count I of eq. (63), a public parameter of the run")
        return _device_data(config, partition_id, str(node_config["data-path"]),
                            str(node_config.get("labels-path", "")), str(node_config.get("writer", "")),
                            int(node_config["num-samples-total"]), num_classes)
    agents = config.num_agents
    require_federation(int(node_config["num-partitions"]), agents, f"num-agents={agents}")
    return _partition(config, partition_id)


@lru_cache(maxsize=4)
def model_for(config: RunConfig) -> nn.Module | None:
    """The configured module (None: logistic regression's closed-form fast path)."""
    if config.model == "logistic":
        return None
    return build_model(config.model, NUM_FEATURES, NUM_CLASSES[config.dataset])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which agent this node is (its partition id, from the node config), once the node has
    read its configuration and its data as its rounds will (:func:`read_node`) and its device has admitted
    the run the query names (``wire.IDENTITY_KEY``) as it would at the run's first release
    (:func:`~clients.randomness.node_admission`): a node that refuses says why instead (:func:`refusal`), and
    the server ends the run before round 1 (``Roster.admit``), before it writes anything and before any node
    releases anything."""
    try:
        check_query(msg)
        config, held = read_node(context)
        node_admission(context.node_config, int(context.node_config["partition-id"]),
                       str(msg.content.config_records.get("config", {}).get(IDENTITY_KEY, "")),
                       lambda: device_request_for(config, held, context.node_config))
    except (Refused, DeviceRefused) as error:
        return refusal(msg, str(error))
    return answer_query(msg, int(context.node_config["partition-id"]))


def device_request_for(config: Any, held: Any, node_config: Mapping[str, Any]) -> RunRequest:
    """The run as this node's device sees it (:mod:`dpadmm.privacy.device`), from the family's configuration
    and what the node holds for it (:func:`read_node`)."""
    if isinstance(config, LinAdmmConfig):
        features, labels = held
        return linadmm_privacy.device_request(config, data_digest(features, labels), int(features.shape[-2]))
    if isinstance(config, DecentralConfig):
        return decentral_request(config, held, int(node_config["partition-id"]))
    if isinstance(config, SharingConfig):
        parties, _ = held
        return sharing_privacy.device_request(config, data_digest(parties.blocks),
                                              int(parties.blocks.shape[1]))
    return iadmm_request(config, held)


@lru_cache(maxsize=8)
def linadmm_rows(config: LinAdmmConfig, partition_id: int,
                 num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features with unit-norm rows, labels +-1) of this client's contiguous block of the training rows."""
    require_federation(num_partitions, config.num_agents, f"num-agents={config.num_agents}")
    dataset = load_binary(config.dataset, config.data_dir)
    block = partition_contiguous(dataset.num_train, config.num_agents)[partition_id]
    return problem_rows(dataset.x_train[block], dataset.y_train[block], linadmm_engine.DTYPES[config.dtype])


@lru_cache(maxsize=8)
def sharing_partition(config: SharingConfig, partition_id: int, num_partitions: int
                      ) -> tuple[sharing_engine.Parties, str]:
    """(this party's column block of the configured data set, its ids' digest) in simulation: party =
    partition id, one per SuperNode; the ids are the row numbers."""
    require_federation(num_partitions, len(config.widths), f"parties={config.parties!r}", "party")
    dataset = sharing_engine.dataset_of(config)
    parties = sharing_engine.parties_of(dataset, config.widths, [partition_id],
                                        sharing_engine.DTYPES[config.dtype])
    return parties, row_digest(dataset.num_train, len(dataset.y_test))


@lru_cache(maxsize=4)
def sharing_file(config: SharingConfig, partition_id: int, path: str) -> tuple[sharing_engine.Parties, str]:
    """(this party's column block, its ids' digest) in deployment, from the device's own file: built by the
    function the simulation uses, so the rows are scaled as there."""
    own = read_party_file(path, config.widths, partition_id)
    parties = sharing_engine.parties_from_blocks([own.x], [own.x_test], [partition_id],
                                                 sharing_engine.DTYPES[config.dtype])
    return parties, own.digest()


def sharing_party(config: SharingConfig, node_config: Mapping[str, Any]
                  ) -> tuple[sharing_engine.Parties, str]:
    """This party's block and ids' digest: the device's own file when the node config names one
    (``data-path``), else its partition of the configured data set."""
    partition_id = int(node_config["partition-id"])
    if "data-path" in node_config:
        return sharing_file(config, partition_id, str(node_config["data-path"]))
    return sharing_partition(config, partition_id, int(node_config["num-partitions"]))


@lru_cache(maxsize=2)
def decentral_dataset(name: str, data_dir: str) -> Dataset:
    """The data set simulated agents draw their samples from, read once per worker process: a worker serves
    many agents in turn (more than :func:`decentral_partition` keeps), and reading UCI Adult takes half a
    second."""
    return decentral_engine.load_dataset(name, data_dir)


@lru_cache(maxsize=8)
def decentral_partition(config: DecentralConfig, agent: int, num_partitions: int) -> Agents:
    """What agent ``agent`` of 004 holds and knows in simulation: its samples of the run's draw, the public
    graph."""
    require_federation(num_partitions, config.agents, f"agents={config.agents}")
    dtype = decentral_engine.DTYPES[config.dtype]
    return agent_view(config, decentral_dataset(config.dataset, config.data_dir), agent, dtype)


@lru_cache(maxsize=4)
def decentral_file(config: DecentralConfig, agent: int, path: str) -> Agents:
    """What agent ``agent`` of 004 holds and knows in deployment: its own file's samples, the public graph."""
    return read_agent_file(config, agent, path, decentral_engine.DTYPES[config.dtype])


def decentral_agent(config: DecentralConfig, node_config: Mapping[str, Any]) -> Agents:
    """This agent's view: the device's own file when the node config names one (``data-path``), else its
    samples of the configured data set."""
    agent = int(node_config["partition-id"])
    if "data-path" in node_config:
        return decentral_file(config, agent, str(node_config["data-path"]))
    return decentral_partition(config, agent, int(node_config["num-partitions"]))


class Refused(Exception):
    """This node's configuration or data is refused (a ``ValueError`` or ``OSError`` while reading them): a
    fault every round would repeat, answered by :func:`refusal` instead of a result."""


@contextmanager
def refusing() -> Iterator[None]:
    """Turn a ``ValueError`` or ``OSError`` raised while the node reads its configuration or its data into
    :class:`Refused`. The protocol's own checks of a round's message (a replayed round, a malformed state)
    stay outside: they cost the node that round only."""
    try:
        yield
    except (ValueError, OSError) as error:
        raise Refused(str(error)) from error


def refusal(msg: Message, reason: str) -> Message:
    """The reply that ends the run (``strategies.nodes.refused``): the reason in ``wire.REFUSED_KEY``."""
    return Message(RecordDict({"config": ConfigRecord({REFUSED_KEY: reason})}), reply_to=msg)


def read_node(context: Context) -> tuple[Any, Any]:
    """(the family's configuration, what this node holds for it), read as its rounds read them: DP-ADMM's
    (features, labels), a 004 agent's view, a sharing party's (block, ids' digest), DP-IADMM's data with the
    run's data set's class count (never the server's arrays': :func:`clients.gate.iadmm_shapes`). Anything
    refused: :class:`Refused`. DP-IADMM's configuration is returned as the run config gives it:
    ``train_reply`` calibrates it (on a deployed node, once per run)."""
    with refusing():
        chosen = from_run_config(context.run_config)
        partition_id = int(context.node_config["partition-id"])
        if isinstance(chosen, LinAdmmConfig):
            return chosen, linadmm_rows(chosen, partition_id, int(context.node_config["num-partitions"]))
        if isinstance(chosen, DecentralConfig):
            return chosen, decentral_agent(chosen, context.node_config)
        if isinstance(chosen, SharingConfig):
            return chosen, sharing_party(chosen, context.node_config)
        return chosen, agent_data_for(chosen, context.node_config, NUM_CLASSES[chosen.dataset])


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """ADMM sharing: this party's test scores (the other families evaluate on the server)."""
    try:
        with refusing():
            config = from_run_config(context.run_config)
        check_evaluate(msg, context.node_config, config)
        config, held = read_node(context)
    except (Refused, DeviceRefused) as error:
        return refusal(msg, str(error))
    if not isinstance(config, SharingConfig):
        return refusal(msg, f"algorithm={config.algorithm!r} evaluates on the server; no client evaluation")
    parties, _ = held
    return scores_reply(msg, context, parties, int(context.node_config["partition-id"]))


@app.train(mods=[secure_sum_mod])
def train(msg: Message, context: Context) -> Message:
    """DP-IADMM: receive w, lambda_p and the last iterate, run E local updates, send z_p^{t+1}.
    DP-ADMM / DP-AccADMM: receive the point, send the clipped gradient sum of this client's rows.
    004: release the agent's next iterate (with exchange=secret through SecAgg+, whose mod wraps this).
    A node whose configuration or data is refused says why (:func:`refusal`), and the server ends the run.
    The protocol's own checks of a round's message (a replayed round, a malformed state) raise: they cost
    the node that round only."""
    try:
        config, held = read_node(context)
        partition_id = int(context.node_config["partition-id"])
        check_train(msg, config, held, partition_id)  # before any value meets the data (clients.gate)
    except (Refused, DeviceRefused) as error:
        return refusal(msg, str(error))
    try:
        if isinstance(config, LinAdmmConfig):
            # central DP: the exact sums leave the device only if its operator trusts the server, and the
            # run the server adds its noise for is charged to the device's budget like any other
            settings = msg.content["config"]
            node_charge(context.node_config, settings, partition_id, int(settings["server-round"]),
                        lambda: device_request_for(config, held, context.node_config))
            features, labels = held
            return gradient_reply(msg, config, features, labels, partition_id)
        if isinstance(config, DecentralConfig):
            reply = sum_reply if config.exchange == "secret" else iterate_reply
            return reply(msg, context, config, held, partition_id)
        if isinstance(config, SharingConfig):
            parties, digest = held
            return round_reply(msg, context, config, parties, partition_id, digest)
        return train_reply(msg, config, held, partition_id, model_for(config), context.node_config)
    except DeviceRefused as error:
        return refusal(msg, str(error))
