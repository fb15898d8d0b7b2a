"""A Grid that runs the ClientApp in this process: Flower's DP-FedAvg without SuperLink and Ray.

For FEMNIST's 195 agents a `flwr run` simulation costs seconds per round of framework overhead
on two cores, more than the learning. This Grid hands each message to the same ``ClientApp``
object (its mods included) with a node ``Context`` like a simulation's (``partition-id``,
``num-partitions``), so the strategy, wrapper, mod, accountant and client code are Flower's and
the app's, unchanged. What it leaves out is the transport: messages are deep-copied instead of
serialised, so no reply shares memory with the server's arrays. The clients run one after the
other.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, Mapping

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


class InProcessGrid(Grid):
    """``num_nodes`` nodes with partition ids 0..num_nodes-1, each executing ``client_app`` in-process."""

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: Mapping[str, object]) -> None:
        self._app = client_app
        self._run = Run.create_empty(run_id=1)
        # A new Message takes its run, sender and task ids from the process's task identity, which
        # Flower's runtimes set for the ServerApp's process; here that process is this one.
        TaskIdentity.run_id, TaskIdentity.task_id = self._run.run_id, 1
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        self._contexts = {
            node_id: Context(run_id=1, node_id=node_id, state=RecordDict(), run_config=dict(run_config),
                             node_config={"partition-id": p, "num-partitions": num_nodes})
            for p, node_id in enumerate(range(1, num_nodes + 1))
        }
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp now; keep the reply for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            delivered = copy.deepcopy(msg)
            delivered.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            reply = self._app(delivered, self._contexts[msg.metadata.dst_node_id])
            self._replies[delivered.metadata.message_id] = copy.deepcopy(reply)
            ids.append(delivered.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
