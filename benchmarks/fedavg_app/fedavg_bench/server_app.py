"""ServerApp: Flower's own FedAvg, sending dpadmm's payload (3 arrays) and timing every round.

The payload is what DP-IADMM sends an agent, w, lambda_p and z_p, as three arrays of shape
(bench-features, bench-classes) in ``dtype``. FedAvg averages the arrays each client replies
(z, and z-last when E > 1, as DP-IADMM's agents), so the next round's 3 arrays are built from that
average; nothing else in
FedAvg changes. It broadcasts one ArrayRecord to every node, whereas DP-IADMM's arrays differ
per agent; the difference is part of what the benchmark measures.

Per round it appends a line to the JSONL file ``bench-timings``:

- ``seconds``: from ``configure_train`` to the end of ``aggregate_train``, the interval our
  strategy reports as ``seconds`` in rounds.jsonl;
- ``cycle``: from the end of the previous round (``evaluate_fn``, which ``Strategy.start`` calls
  at round 0 and after every round) to the end of this one, the whole loop;
- ``configure``, ``send-and-receive``, ``aggregate``: the parts of ``seconds``;
- ``replied``: the replies without an error. FedAvg goes on without the failed ones, so a
  ClientApp that fails would otherwise look fast.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

MODES = ("same-work", "echo")

app = ServerApp()


class TimedFedAvg(FedAvg):
    """FedAvg that keeps dpadmm's 3-array payload and notes when each round starts and aggregates.

    The subclass only wraps FedAvg's methods: sampling, messages and aggregation are Flower's.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.configured = 0.0
        self.sent = 0.0  # configure_train returned: the messages are built
        self.received = 0.0  # aggregate_train called: every reply is in
        self.aggregated = 0.0
        self.replied = 0  # replies without an error in the last round: the benchmark checks it is P

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """FedAvg's configure_train, with the averaged (z, z-last) sent on as (w, lambda, z)."""
        self.configured = time.perf_counter()
        if "lambda.weight" not in arrays:  # after round 1: the average of the replies that FedAvg computed
            last = arrays["z-last.weight"] if "z-last.weight" in arrays else arrays["z.weight"]
            arrays = ArrayRecord({"w.weight": arrays["z.weight"], "lambda.weight": last,
                                  "z.weight": arrays["z.weight"]})
        messages = super().configure_train(server_round, arrays, config, grid)
        self.sent = time.perf_counter()
        return messages

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.received = time.perf_counter()
        replies = list(replies)
        self.replied = sum(not reply.has_error() for reply in replies)
        result = super().aggregate_train(server_round, replies)
        self.aggregated = time.perf_counter()
        return result


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_config = context.run_config
    mode = str(run_config["bench-mode"])
    if mode not in MODES:
        raise ValueError(f"bench-mode={mode!r} is not allowed; choose one of {', '.join(MODES)}")
    agents, rounds = int(run_config["num-agents"]), int(run_config["rounds"])
    shape = (int(run_config["bench-features"]), int(run_config["bench-classes"]))
    dtype = np.dtype(str(run_config["dtype"]))
    timings = Path(str(run_config["bench-timings"]))
    if not str(run_config["bench-timings"]):
        raise ValueError("bench-timings must name the JSONL file for the round timings")
    timings.parent.mkdir(parents=True, exist_ok=True)

    initial = ArrayRecord({f"{key}.weight": Array(np.zeros(shape, dtype)) for key in ("w", "lambda", "z")})
    strategy = TimedFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=agents,
                           min_available_nodes=agents)
    last_end = time.perf_counter()

    with open(timings, "w", encoding="utf-8") as out:

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            """No evaluation: the timestamp of the round's end, which Strategy.start gives us here."""
            nonlocal last_end
            now = time.perf_counter()
            if server_round > 0:
                record = {"round": server_round, "seconds": strategy.aggregated - strategy.configured,
                          "cycle": now - last_end, "replied": strategy.replied,
                          "configure": strategy.sent - strategy.configured,
                          "send-and-receive": strategy.received - strategy.sent,
                          "aggregate": strategy.aggregated - strategy.received, "time": time.time()}
                out.write(json.dumps(record) + "\n")
                out.flush()
            last_end = now
            return None

        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, evaluate_fn=evaluate)
