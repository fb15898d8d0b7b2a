"""ClientApp: dpadmm's local round under FedAvg (``same-work``), or a reply without work (``echo``).

``same-work`` calls the very functions the main ClientApp's DP-IADMM round calls (``clients.client_app``'s
``agent_data_for``, then ``clients.dpiadmm.train_reply``'s ``dpadmm.iadmm.privacy.calibrate`` and
``local_update``): the agent's data (cached per worker process), one
``dpadmm.iadmm.local.agent_round`` (E local steps with their Laplace noise), and z back with the last
iterate when E > 1 (two arrays for ObjPM). It skips only the DP-IADMM message checks (partition
and round ids), which FedAvg has no use for.
``echo`` sends 2 of the received arrays back untouched (DP-IADMM's agents reply z and its last iterate
when E > 1, as the main job's): the same bytes on the wire and no computation. It imports neither torch nor
dpadmm (they are imported in ``same-work`` only), so that its process costs what Flower's own ClientApp
process costs: the floor of ``benchmarks.deployed_round``, where Flower starts a process per message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def _run_config(values: Mapping[str, Any]) -> Any:
    """The dpadmm RunConfig in this app's run config (its ``bench-*`` keys are not dpadmm's), read as the main
    app reads the same keys given in its ``preset``'s table (``dpadmm.families.from_run_config``, the main
    ClientApp's reading, cached by value): the keys this app leaves out take the preset's values, as in the
    main app's run, not RunConfig's defaults (the main job's, which sample a fifth of the data per step and
    reply one array: less work than the papers' preset). Calibrated as ``clients.dpiadmm.train_reply``
    calibrates it (eps-bar from ``target-epsilon``, when one is set)."""
    from dpadmm.families import DEFAULT, from_run_config, table_of
    from dpadmm.iadmm import privacy
    from dpadmm.iadmm.config import RunConfig

    keys = frozenset(f.name.replace("_", "-") for f in fields(RunConfig)) - {"algorithm"}
    preset = str(values["preset"])
    table = table_of(DEFAULT, preset)
    return privacy.calibrate(from_run_config({
        "algorithm": values["algorithm"], "preset": preset,
        **{f"{table}.{k}": v for k, v in values.items() if k in keys}}))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Reply z and z-last of the received shape and dtype: computed (z-last only when E > 1) or echoed."""
    arrays = msg.content["arrays"]
    if str(context.run_config["bench-mode"]) == "echo":
        echoed = {"z.weight": arrays["z.weight"], "z-last.weight": arrays["lambda.weight"]}
        metrics = MetricRecord({"num-examples": 1})
        return Message(content=RecordDict({"arrays": ArrayRecord(echoed), "metrics": metrics}), reply_to=msg)

    from clients.client_app import agent_data_for, model_for
    from clients.dpiadmm import local_update
    from dpadmm.data import NUM_CLASSES

    config = _run_config(context.run_config)
    data = agent_data_for(config, context.node_config, NUM_CLASSES[config.dataset])
    out = local_update(config, data, arrays, int(msg.content["config"]["server-round"]), model_for(config))
    metrics = MetricRecord({"num-examples": int(data.counts[0])})
    return Message(content=RecordDict({"arrays": ArrayRecord(out), "metrics": metrics}), reply_to=msg)
