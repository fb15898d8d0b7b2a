"""The round loop of the strategies that run a fixed number of synchronous rounds (002's DPLinADMM, 001's
ADMMSharing, 004's GraphRouter): send every holder its message, wait for the replies, aggregate, then the
strategy's own after-round work (evaluation, records); and the checks of a reply that carries one vector.
Flower's own ``Strategy.start`` assumes FedAvg's shape (arrays in, arrays out, a client-side evaluation
round every round), which these do not have.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies.nodes import refused


def run_rounds(strategy: Strategy, grid: Grid, num_rounds: int, timeout: float,
               after_round: Callable[[int, float], MetricRecord | None]) -> Result:
    """Rounds 1..``num_rounds`` of ``strategy`` (its configure_train and aggregate_train), each followed by
    ``after_round(t, seconds)`` with the seconds from sending the round's messages to the end of its
    aggregation. What ``after_round`` returns (the round's evaluation, None where none) goes into the
    result's ``evaluate_metrics_serverapp``, so that Flower's closing summary ("ServerApp-side Evaluate
    Metrics") shows it, as it does for DP-IADMM's strategy, instead of an empty ``{}``."""
    log(INFO, "Starting %s strategy:", strategy.__class__.__name__)
    strategy.summary()
    result = Result()
    started = time.time()
    for t in range(1, num_rounds + 1):
        log(INFO, "")
        log(INFO, "[ROUND %s/%s]", t, num_rounds)
        begun = time.perf_counter()
        messages = strategy.configure_train(t, ArrayRecord(), ConfigRecord(), grid)
        replies = refused(grid.send_and_receive(messages=messages, timeout=timeout))
        result.arrays, result.train_metrics_clientapp[t] = strategy.aggregate_train(t, replies)
        evaluated = after_round(t, time.perf_counter() - begun)
        if evaluated is not None:
            result.evaluate_metrics_serverapp[t] = evaluated
    log(INFO, "Strategy execution finished in %.2fs", time.time() - started)
    for line in io.StringIO(str(result)):
        log(INFO, "\t%s", line.strip("\n"))
    return result


def read_reply(reply: Message, server_round: int, holders: int, key: str, who: str, unit: str
               ) -> tuple[int, np.ndarray] | str:
    """(the sender's id, its vector ``key``) of a reply that is no error, is for ``server_round`` and comes
    from one of ``holders`` ids (``metrics["partition-id"]``); else the reason it is not, naming the sender
    as ``who`` and the round as ``unit``."""
    if reply.has_error():
        return f"node {reply.metadata.src_node_id} failed: {reply.error.reason}"
    try:
        metrics = reply.content["metrics"]
        sender, computed_for = int(metrics["partition-id"]), int(metrics["server-round"])
        value = np.asarray(reply.content["arrays"][key].numpy(), dtype=np.float64)
    except (KeyError, TypeError, ValueError) as err:
        return f"malformed reply ({err!r})"
    if computed_for != server_round:
        return f"{who} {sender} answered for {unit} {computed_for}"
    if not 0 <= sender < holders:
        return f"no {who} {sender} in this run"
    return sender, value


def vector_fault(value: np.ndarray, length: int, who: str, sender: int) -> str | None:
    """Why ``value`` is not a finite vector of ``length`` entries (None if it is)."""
    if value.shape != (length,) or not np.isfinite(value).all():
        return f"{who} {sender} sent a vector of shape {value.shape} (expected ({length},), finite)"
    return None
