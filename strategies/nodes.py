"""Which connected node holds which agent: the roster every strategy of the app keeps; and the faults that
end a run.

Node ids are random and change when a device reconnects; an agent is its partition id, which
each node states once when asked (a query message, answered by ``clients.dpiadmm.answer_query``).
The roster keeps node -> partition, refuses a second node claiming a partition that a connected
node holds, and moves a partition to a new node when its old node is gone.

Two kinds of fault. A transient one (a timeout, a lost node, a reply that fails a check) costs that
node its round, by each strategy's dropout rules. A fault that would repeat every round ends the run
(:class:`RunRefused`, ``finished:failed``): a node that refuses its configuration or its data (it replies
with ``wire.REFUSED_KEY``, :func:`dpadmm.wire.refusal_in`) and a federation sized against the configuration
(a node claiming a partition the run does not have, or fewer nodes than the run needs within
``node-timeout``).

Both are looked for before round 1 (:meth:`Roster.admit`), which a ServerApp calls before it creates the
run folder: a node answers the partition query only after it has read its configuration and its data, and
its device has admitted the run the query names (its identity, as its first release would), so such a run
ends with nothing written and nothing released.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from logging import ERROR, INFO, WARNING
from typing import NoReturn

import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from dpadmm.privacy.randomness import DEPLOYMENT, FORCED_SIMULATION, SIMULATION, forced_kind
from dpadmm.wire import IDENTITY_KEY, KIND_KEY, MECHANISM_KEY, refusal_in


class RunRefused(RuntimeError):
    """A fault that every round would repeat: a node refused its configuration or its data, the federation
    does not match the configuration, or the server cannot read its own data. The reason is logged on one
    line (``dpadmm: the run cannot go on: ...``); raised out of the ServerApp it ends the run as
    ``finished:failed`` with the reason as its details (``flwr ls``), as a refused run config does."""


def refuse_run(reason: str) -> NoReturn:
    """Log ``reason`` on one line and raise :class:`RunRefused` with it."""
    log(ERROR, "dpadmm: the run cannot go on: %s", reason)
    raise RunRefused(reason)


def refused(replies: Iterable[Message]) -> list[Message]:
    """``replies`` as a list, after ending the run (:func:`refuse_run`) if any refuses it: every strategy
    passes what ``grid.send_and_receive`` returns through this."""
    replies = list(replies)
    reasons = [(reply.metadata.src_node_id, reason) for reply in replies
               if (reason := refusal_in(reply)) is not None]
    if reasons:
        node, reason = reasons[0]
        others = len(reasons) - 1
        more = f" (and {others} more node{'s' if others > 1 else ''})" if others else ""
        refuse_run(f"node {node} refused: {reason}{more}")
    return replies


class Roster:
    """node id -> partition id of the connected agents, for ``num_agents`` agents of which a run can start
    with ``needed`` (default: all of them). ``source`` says where the family's configuration sets that
    number, for the messages (``num-agents=10``; ADMM sharing's ``parties='66,57'``). ``identity`` is the
    run's identity (``wire.IDENTITY_KEY``), sent with every partition query: a deployed node's device
    decides there, before any node releases, everything it would decide at the run's first release (its
    lifetime and period budgets included); a strategy that restores another identity (a resumed run) sets
    it here too."""

    def __init__(self, num_agents: int, node_timeout: float, round_timeout: float,
                 needed: int | None = None, source: str | None = None, identity: str = "") -> None:
        self.num_agents = num_agents
        self.identity = identity
        self.source = source or f"num-agents={num_agents}"
        self.needed = num_agents if needed is None else needed
        self.node_timeout = node_timeout
        self.round_timeout = round_timeout
        self.nodes: dict[int, int] = {}
        self.duplicates: list[tuple[int, int, int]] = []  # (node, partition it claimed, the node holding it)
        self.waited = False

    def admit(self, grid: Grid) -> None:
        """The federation's check before round 1, which a ServerApp makes before it creates the run folder:
        the first :meth:`bind`. A node that refuses its configuration or its data (it reads them before it
        answers the query), a node holding a partition the run does not have (:class:`RunRefused`) or fewer
        than ``needed`` nodes within ``node-timeout`` (a TimeoutError) end the run here, before anything is
        written or released."""
        holders = self.bind(grid)
        log(INFO, "dpadmm: the nodes of %d of %d agents are connected and ready", len(holders),
            self.num_agents)

    def bind(self, grid: Grid) -> dict[int, int]:
        """partition -> connected node, after asking new nodes which partition they hold.

        The first call (:meth:`admit`) waits up to ``node-timeout`` for every agent's node (at least
        ``needed`` of them, or a TimeoutError); later calls take who is connected.
        """
        deadline = time.monotonic() + self.node_timeout
        while True:
            connected = set(grid.get_node_ids())
            unknown = sorted(connected - set(self.nodes))
            if unknown:
                self._query(grid, unknown, connected)
            holders = {p: n for n, p in self.nodes.items() if n in connected}
            if self.waited or len(holders) == self.num_agents:
                break
            if time.monotonic() > deadline:
                if len(holders) < self.needed:
                    raise TimeoutError(
                        f"only {len(holders)} of the {self.num_agents} nodes of {self.source} connected "
                        f"within node-timeout={self.node_timeout:g} s ({len(connected)} nodes in all)"
                        + "".join(f"; node {n} claimed partition {p}, which node {h} holds: give each "
                                  "SuperNode its own partition-id" for n, p, h in self.duplicates)
                        + ". In simulation, size the federation to match: flwr run . --federation-config "
                        f"'num-supernodes={self.num_agents}'")
                missing = sorted(set(range(self.num_agents)) - set(holders))
                log(WARNING, "starting without partitions %s: no node holds them after node-timeout", missing)
                break
            log(INFO, "Waiting for nodes: %d of %d agents connected", len(holders), self.num_agents)
            time.sleep(1.0)
        self.waited = True
        return holders

    def _query(self, grid: Grid, nodes: list[int], connected: set[int]) -> None:
        """Ask new nodes for their partition id and bind the valid, unclaimed ones."""
        asked = ConfigRecord({"query": "partition-id", IDENTITY_KEY: self.identity})
        question = RecordDict({"config": asked})
        replies = refused(grid.send_and_receive(
            [Message(content=question, message_type=MessageType.QUERY, dst_node_id=n) for n in nodes],
            timeout=self.round_timeout))
        for reply in replies:
            node = reply.metadata.src_node_id
            claimed = claimed_partition(reply)
            holder = {p: n for n, p in self.nodes.items() if n in connected}.get(claimed)
            if reply.has_error():
                log(WARNING, "node %s did not say its partition: %s", node, reply.error.reason)
            elif claimed is None:
                log(WARNING, "node %s states no readable partition id; not bound", node)
            elif not 0 <= claimed < self.num_agents:
                refuse_run(f"node {node} holds partition {claimed}, but this run has {self.num_agents} (0.."
                           f"{self.num_agents - 1}): the federation does not match the configuration. In "
                           "simulation, size it to match: flwr run . --federation-config "
                           f"'num-supernodes={self.num_agents}'")
            elif holder is not None:
                log(WARNING, "node %s claims partition %d, which connected node %s holds; not bound", node,
                    claimed, holder)
                self.duplicates.append((node, claimed, holder))
            else:
                for old in [n for n, p in self.nodes.items() if p == claimed]:
                    log(INFO, "partition %d moves from node %s (gone) to node %s", claimed, old, node)
                    del self.nodes[old]
                self.nodes[node] = claimed


def claimed_partition(reply: Message) -> int | None:
    """The partition id a reply states, or None when it carries none that is readable."""
    try:
        return int(reply.content["metrics"]["partition-id"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def reported_kind(reply: Message) -> str:
    """The kind of randomness a reply says its agent used (``clients.randomness``): "simulation",
    "deployment" or "forced-simulation"; "unreported" for a ClientApp that does not say (another app's)."""
    try:
        return str(reply.content["config"][KIND_KEY])
    except (KeyError, TypeError):
        return "unreported"


def mechanism_fault(reply: Message, announced: str) -> str | None:
    """Why a reply's stated mechanism (``wire.MECHANISM_KEY``, what its node ran as it calibrated it) is not
    the ``announced`` one, or None: the run's privacy statement covers only the announced mechanism."""
    try:
        ran: str | None = str(reply.content["config"][MECHANISM_KEY])
    except (KeyError, TypeError):
        ran = None
    if ran == announced:
        return None
    return (f"its node ran {'no stated mechanism' if ran is None else repr(ran)}, not this run's "
            f"{announced!r}: the run's privacy statement would not cover it")


def server_kind(grid: Grid | None, environ: Mapping[str, str] | None = None) -> str:
    """The kind of randomness a ServerApp that draws uses: what ``$DPADMM_RANDOMNESS`` forces, else
    simulation on Flower's in-memory grid (both ``flwr run`` on the simulation engine and ``run_simulation``
    run the ServerApp on :class:`flwr.superlink.grid.InMemoryGrid`) and deployment on any other. Forcing the
    simulation kind on another grid gives ``forced-simulation``, which the statement prints as a warning."""
    simulated = isinstance(grid, InMemoryGrid)
    forced = forced_kind({}, environ)  # a server has no node config: its environment only
    if forced == SIMULATION:
        return SIMULATION if simulated else FORCED_SIMULATION
    if forced == DEPLOYMENT:
        return DEPLOYMENT
    return SIMULATION if simulated else DEPLOYMENT


def require_argument(name: str, value: object, kind: type | tuple[type, ...], what: str) -> None:
    """A strategy's constructor argument of the wrong type, refused by name (a plug-in strategy gets them
    from another app's code, where a dict for a configuration or 0/1 labels would fail deep in a round)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise TypeError(f"{name} is a {type(value).__name__}; give {what}")


def require_tensor(name: str, value: torch.Tensor, ndim: int, values: str = "finite") -> None:
    """``value`` a non-empty tensor of ``ndim`` dimensions whose entries are finite (``values="+-1"``: each
    -1 or +1), or a ValueError naming the first bad entry."""
    require_argument(name, value, torch.Tensor, f"a {ndim}-D torch.Tensor")
    if value.dim() != ndim or value.numel() == 0:
        raise ValueError(f"{name} has shape {tuple(value.shape)}; give a non-empty {ndim}-D tensor")
    bad = ~torch.isfinite(value) if values == "finite" else (value != 1) & (value != -1)
    if bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        allowed = "finite numbers" if values == "finite" else "-1 or +1 (2 y - 1 for labels 0 and 1)"
        at = ", ".join(map(str, index))
        raise ValueError(f"{name}[{at}] is {value[index].item()!r}; allowed: {allowed}")


def stop_if_every_reply_was_rejected(server_round: int, accepted: int, rejected: list[tuple[str, str]]
                                     ) -> None:
    """End the run when a round's replies were all rejected (``rejected``: who and why): a fault every node
    repeats (each ClientApp raising on the run's configuration, a value no round can use) would leave the
    model where it started while the run "completed". A round whose nodes merely did not reply goes on, as
    Flower's strategies go on past dropouts."""
    if rejected and not accepted:
        reasons = "; ".join(f"{who}: {why}" for who, why in rejected[:3])
        raise RuntimeError(f"round {server_round}: every reply was rejected ({len(rejected)}: {reasons}); a "
                           "fault all nodes repeat would leave the model untrained, so the run stops")
