"""strategies.rounds: the round loop of 002's, 001's and 004's strategies hands each round's evaluation to
Flower's result, so that Flower's closing summary ("ServerApp-side Evaluate Metrics") shows it instead of
``{}``. The real strategies through a real ``flwr run`` are checked in test_linadmm_flower.py,
test_sharing_flower.py and test_decentral_flower.py; here the loop itself, with a strategy that sends
nothing, on a grid that delivers nothing (the loop's contract does not depend on the messages).
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.rounds import run_rounds
from tests.conftest import NoNodes


class Silent(Strategy):
    """Sends no message in any round and aggregates what came back (nothing)."""

    def summary(self) -> None:
        return None

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        return ArrayRecord(), MetricRecord({"replies": len(list(replies))})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


class Empty(NoNodes):
    """A grid with no nodes: every message list sent is answered by no reply."""

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        assert list(messages) == []
        return []


def test_each_rounds_evaluation_reaches_the_result_flower_prints() -> None:
    """Rounds 1 and 3 are evaluated, round 2 is not: the result holds the two evaluations by round, and its
    text (what Flower logs at the end of a run) shows them."""
    def after_round(t: int, seconds: float) -> MetricRecord | None:
        assert seconds >= 0
        return None if t == 2 else MetricRecord({"round": t, "test-accuracy": 0.25 * t})

    result = run_rounds(Silent(), Empty(), 3, 5.0, after_round)
    assert sorted(result.evaluate_metrics_serverapp) == [1, 3]
    assert dict(result.evaluate_metrics_serverapp[3]) == {"round": 3, "test-accuracy": 0.75}
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    text = str(result)
    assert "ServerApp-side Evaluate Metrics:\n{}" not in text and "'test-accuracy': '7.5000e-01'" in text
