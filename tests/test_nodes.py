"""strategies.nodes: the checks every strategy's constructor shares (a plug-in strategy gets its arguments
from another app's code)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

import pytest
import torch
from flwr.app import Message

from clients.dpiadmm import answer_query
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import public_agents
from dpadmm.iadmm.config import RunConfig
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.sharing.config import SharingConfig
from dpadmm.wire import IDENTITY_KEY
from strategies import DPIADMM
from strategies.decentral import GraphRouter, SecureSum
from strategies.linadmm import DPLinADMM
from strategies.sharing import ADMMSharing
from tests.conftest import NoNodes

ONES = torch.ones(4, dtype=torch.float64)
EYE = torch.eye(5, dtype=torch.float64)


@pytest.mark.parametrize(("build", "error", "message"), [
    # 0/1 labels made every label-0 sample's loss constant: class 0 silently ignored
    (lambda: ADMMSharing(SharingConfig(epsilon=math.inf), torch.tensor([1.0, 0.0]), ONES, "ids"), ValueError,
     "labels[1] is 0.0; allowed: -1 or +1 (2 y - 1 for labels 0 and 1)"),
    (lambda: ADMMSharing(SharingConfig(epsilon=math.inf), ONES, torch.tensor([]), "ids"), ValueError,
     "test_labels has shape (0,); give a non-empty 1-D tensor"),
    (lambda: ADMMSharing({"parties": "66,57"}, ONES, ONES, "ids"), TypeError,
     "config is a dict; give a dpadmm.sharing.config.SharingConfig"),
    (lambda: DPLinADMM(LinAdmmConfig(), EYE, 0), ValueError, "num_samples=0 is not allowed"),
    (lambda: DPLinADMM(LinAdmmConfig(), EYE, 2.5), TypeError, "num_samples is a float; give the clients'"),
    (lambda: DPLinADMM(LinAdmmConfig(), EYE * math.nan, 5), ValueError, "a[0, 0] is nan; allowed: finite"),
    (lambda: DPLinADMM(LinAdmmConfig(), ONES, 5), ValueError, "a has shape (4,); give a non-empty 2-D"),
    (lambda: DPIADMM(RunConfig(), {"weight": torch.full((3, 2), math.inf)}), ValueError,
     "parameters['weight'][0, 0] is inf; allowed: finite numbers"),
])
def test_a_strategy_refuses_arguments_no_round_could_use(build: Callable[[], object], error: type,
                                                          message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        build()


class Answering(NoNodes):
    """``count`` connected nodes (ids 1..count, partition = id - 1) that answer every message at once with
    ``answer(message, partition)``; the messages sent are kept in :attr:`sent`."""

    def __init__(self, count: int, answer: Callable[[Message, int], Message]) -> None:
        self.count, self.answer, self.sent = count, answer, []

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        messages = list(messages)
        self.sent += messages
        return [self.answer(m, m.metadata.dst_node_id - 1) for m in messages]

    def get_node_ids(self) -> Iterable[int]:
        return range(1, self.count + 1)


SECRET = DecentralConfig(exchange="secret", graph="complete")


@pytest.mark.parametrize("build", [
    lambda: DPIADMM(RunConfig(), {"weight": torch.zeros(784, 10)}),
    lambda: DPLinADMM(LinAdmmConfig(), EYE, 5),
    lambda: ADMMSharing(SharingConfig(epsilon=math.inf), ONES, ONES, "ids"),
    lambda: GraphRouter(DecentralConfig(), public_agents(DecentralConfig(), torch.float64)),
    lambda: SecureSum(SECRET, public_agents(SECRET, torch.float64)),
])
@pytest.mark.usefixtures("server_process")
def test_every_strategys_partition_query_names_its_run(
        build: Callable[[], DPIADMM | DPLinADMM | ADMMSharing | GraphRouter | SecureSum]) -> None:
    """The query carries the run identity the strategy sends with every release, so that a deployed node's
    device decides at the query, before any node releases, what it would decide at the first release."""
    strategy = build()
    grid = Answering(strategy.roster.num_agents, answer_query)
    strategy.roster.admit(grid)
    assert len(strategy.roster.nodes) == strategy.roster.num_agents
    assert [m.content["config"][IDENTITY_KEY] for m in grid.sent] == [strategy.run_identity] * len(grid.sent)
    assert len(strategy.run_identity) == 32
