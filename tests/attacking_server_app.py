"""A malicious server's ServerApp: tests/test_attacks.py submits the app with this module in place of
server/server_app.py.

It sends the messages a plan names (a JSON file that the test writes at :data:`PLAN`, which it sets when it
copies this module into the app) to the SuperNodes the plan names, each message alike to every node, under one
run identity it draws, and writes what each node answered: ``answered`` with what the reply states besides its
arrays' values (its config and metric records, its arrays' names and shapes), ``refused`` with the node's
reason, or ``failed`` with the error's text. A device answers with its installed ClientApp whatever the FAB
holds, but the server side of a run is the FAB's: this is what any server can send.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from dpadmm.privacy.randomness import new_run_identity
from dpadmm.wire import IDENTITY_KEY, refusal_in

PLAN = ""  # the plan's path, set by the test in its copy of this module
KINDS = {"query": MessageType.QUERY, "train": MessageType.TRAIN, "evaluate": MessageType.EVALUATE}

app = ServerApp()


def crafted(step: dict[str, Any], identity: str) -> RecordDict:
    """A step's content: its config values and the run identity; each array zeros of its shape and dtype but
    for the entries the step sets ([index..., value])."""
    content = RecordDict({"config": ConfigRecord({**step["config"], IDENTITY_KEY: identity})})
    if "arrays" in step:
        arrays = {}
        for name, array in step["arrays"].items():
            values = np.zeros(array["shape"], dtype=array["dtype"])
            for *index, value in array.get("set", []):
                values[tuple(index)] = value
            arrays[name] = Array(values)
        content["arrays"] = ArrayRecord(arrays)
    return content


def outcome(reply: Message | None) -> list[str]:
    """[status, text] of one node's reply."""
    if reply is None:
        return ["no reply", ""]
    if reply.has_error():
        return ["failed", reply.error.reason]
    refused = refusal_in(reply)
    if refused is not None:
        return ["refused", refused]
    content = reply.content
    stated = {name: dict(record) for name, record in [*content.config_records.items(),
                                                      *content.metric_records.items()]}
    shapes = {name: list(array.shape) for record in content.array_records.values()
              for name, array in record.items()}
    return ["answered", json.dumps({"records": stated, "arrays": shapes}, sort_keys=True)]


@app.main()
def main(grid: Grid, context: Context) -> None:
    plan = json.loads(Path(PLAN).read_text())
    nodes: dict[str, int] = plan["nodes"]
    identity = new_run_identity()
    outcomes: dict[str, dict[str, list[str]]] = {}
    for step in plan["steps"]:
        messages = [Message(content=crafted(step, identity), message_type=KINDS[step["kind"]],
                            dst_node_id=node) for node in nodes.values()]
        replies = {reply.metadata.src_node_id: reply
                   for reply in grid.send_and_receive(messages, timeout=plan["timeout"])}
        outcomes[step["name"]] = {name: outcome(replies.get(node)) for name, node in nodes.items()}
    Path(plan["out"]).write_text(json.dumps(outcomes, indent=1))
