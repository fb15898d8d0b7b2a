"""Paper 004 on Flower: a ServerApp that only routes (no server in the algorithm, none in the trust model).

004's agents talk to their graph neighbours; Flower's SuperNodes talk to a SuperLink. The router
makes the one look like the other: each iteration k it sends every agent the iterates that the
agent's neighbours exchanged at k - 1 (and the agent's own), and collects each agent's x^k. It never
combines iterates and holds no agent's data, weights, noise or dual: it sees exactly the transcript
of exchanged iterates, which is what 004's adversary, every other agent colluding, sees (Definition
1), and no more. Each agent's guarantee is against that view.

The graph is a public function of (graph, agents, edges, seed) (:mod:`dpadmm.decentral.graphs`);
x^0 depends on no data, so the router draws it with the engine's keyed stream. An agent whose reply is
missing, failed, for another iteration or agent, of the wrong length or not finite is rejected with
a logged reason, and its neighbours get its last exchanged iterate again (a stale value: the
algorithms are then no longer the paper's, which the log says). The agents' Algorithm-1 duals live
with the agents (their Flower ``context.state``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dpadmm.decentral import engine
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents
from dpadmm.wire import EXCHANGED_KEY, NEIGHBOURS_KEY
from strategies.nodes import Roster
from strategies.rounds import read_reply, run_rounds, vector_fault


class GraphRouter(Strategy):
    """Routes paper 004's exchanged iterates along the graph of ``agents`` (one run: [1, N, N]).

    After each iteration ``evaluate_fn(k, state)`` is called with the exchanged iterates (duals are the
    agents' and are zeros here)."""

    def __init__(self, config: DecentralConfig, agents: Agents) -> None:
        if config.exchange != "plain":
            raise ValueError(f"exchange={config.exchange!r} runs in the engine only (dpadmm train): the "
                             "router forwards iterates; use exchange='plain' on Flower")
        self.config = config
        self.adjacency = agents.adjacency[0]
        self.n = int(self.adjacency.shape[0])
        self.state = engine.initial_state(agents, [config.seed])
        self.roster = Roster(self.n, config.node_timeout, config.round_timeout)
        self.rejected: list[tuple[int, int, str]] = []  # (iteration, agent, reason)
        self.seconds = 0.0  # of the last iteration, from sending the iterates to the last reply
        self.elapsed = 0.0  # of iterations 1..k, as the engine's ``elapsed``

    # ----- Strategy API -----

    def summary(self) -> None:
        c = self.config
        log(INFO, "\t├── %s (%s weights) on %s, N=%d agents, %s graph (%d edges), K=%d", c.algorithm,
            c.weights, c.dataset, self.n, c.graph, int(self.adjacency.sum()) // 2, c.rounds)
        log(INFO, "\t└── %s; the server only routes: it sees the exchanged iterates, as the colluding agents "
            "do", f"Laplace noise, beta_k = {c.noise_growth:g}^k" if c.private else "no noise")

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, engine.State], None] | None = None) -> Result:
        """Iterations 1..K (``num_rounds``, default the configuration's) from the keyed x^0."""
        num_rounds = self.config.rounds if num_rounds is None else num_rounds
        timeout = self.config.round_timeout if timeout is None else timeout

        def after_round(k: int, seconds: float) -> None:
            self.seconds = seconds
            self.elapsed += seconds
            if evaluate_fn is not None:
                evaluate_fn(k, self.state)

        return run_rounds(self, grid, num_rounds, timeout, after_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send every agent its own and its neighbours' iterates of the last iteration."""
        holders = self.roster.bind(grid, needed=self.n)
        missing = sorted(set(range(self.n)) - set(holders))
        if missing:
            log(WARNING, "iteration %d: no connected node holds agents %s; their last iterates are reused",
                server_round, missing)
        x = self.state.x[0]
        messages = []
        for i, node in sorted(holders.items()):
            around = [i, *(int(j) for j in torch.nonzero(self.adjacency[i]).flatten())]
            content = RecordDict({
                "arrays": ArrayRecord({EXCHANGED_KEY: Array(x[around].cpu().numpy())}),
                "config": ConfigRecord({"server-round": server_round, "partition-id": i,
                                        NEIGHBOURS_KEY: around}),
            })
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def _accept(self, server_round: int, reply: Message, d: int) -> tuple[int, np.ndarray] | str:
        """(agent, iterate) of a valid reply, else the reason it is not."""
        got = read_reply(reply, server_round, self.n, EXCHANGED_KEY, "agent", "iteration")
        if isinstance(got, str):
            return got
        agent, value = got
        return vector_fault(value, d, "agent", agent) or (agent, value)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Keep every valid iterate as agent i's x^k; nothing is combined."""
        x = self.state.x.clone()
        answered, reasons = set(), {}
        for reply in replies:
            got = self._accept(server_round, reply, int(x.shape[-1]))
            if isinstance(got, str):
                sender = self.roster.nodes.get(reply.metadata.src_node_id)
                if sender is None:
                    log(WARNING, "iteration %d: a reply from an unknown node rejected: %s", server_round, got)
                else:
                    reasons[sender] = got
                continue
            agent, value = got
            x[0, agent] = torch.from_numpy(value).to(x.dtype)
            answered.add(agent)
        for agent in sorted(set(range(self.n)) - answered):
            reason = reasons.get(agent, "no reply")
            log(WARNING, "iteration %d: agent %d rejected: %s; its last iterate is reused", server_round,
                agent, reason)
            self.rejected.append((server_round, agent, reason))
        self.state = engine.State(x=x, dual=self.state.dual)
        return ArrayRecord(), MetricRecord({"agents": len(answered)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: the router evaluates the exchanged iterates."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
