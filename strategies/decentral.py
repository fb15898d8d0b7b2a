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

Randomness. The router draws a run identity (:func:`dpadmm.privacy.randomness.new_run_identity`) when a run
starts and sends it with every iteration (``run-identity``): deployed agents bind their own secrets to it,
so that two runs of the same run config never share weights or noise. It does not choose the agents' kind
of randomness (each node does, :mod:`clients.randomness`); it records the kind each agent reports
(:attr:`GraphRouter.kinds`), which the privacy statement states. The router holds no checkpoint: a new
run is a new identity.

With ``exchange=secret`` the server does not route but sums, by Flower's SecAgg+ (:class:`SecureSum` under
:func:`secure_workflow`): the server-based form of Algorithm 1 on the complete graph, where each agent needs
only S^k = sum_j x_j^k (Appendix A's secret-sharing exchange computes the same sum). Each agent's neighbour
sum is S^k - x_i^k, so the agents run exactly the engine's ``exchange=secret`` updates, with the sum computed
by SecAgg+ (pairwise masks, Shamir-shared seeds, stochastic quantisation) instead of the paper's Algorithm 3.
The server learns S^k and no single iterate; every agent learns S^k too (it needs it), so against all other
agents colluding the view, and the guarantee, are the plain exchange's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dpadmm.decentral import engine, privacy
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents
from dpadmm.privacy.randomness import new_run_identity
from dpadmm.wire import EXCHANGED_KEY, IDENTITY_KEY, KIND_KEY, MECHANISM_KEY, NEIGHBOURS_KEY
from strategies.nodes import Roster, mechanism_fault, reported_kind
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
        self.run_identity = new_run_identity()  # what the deployed agents bind their secrets to, per run
        self.roster = Roster(self.n, config.node_timeout, config.round_timeout, source=f"agents={self.n}",
                             identity=self.run_identity)
        self.rejected: list[tuple[int, int, str]] = []  # (iteration, agent, reason)
        self.seconds = 0.0  # of the last iteration, from sending the iterates to the last reply
        self.elapsed = 0.0  # of iterations 1..k, as the engine's ``elapsed``
        self.sent = 0  # the last iteration sent out: a run stopped in it counts the releases up to it
        self.kinds: dict[int, str] = {}  # the randomness each agent last reported (clients.randomness)
        # the mechanism this run's statement covers: an iterate that states another is rejected
        self.mechanism = privacy.mechanism_of(config, int(self.state.x.shape[-1]))

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
              evaluate_fn: Callable[[int, engine.State], MetricRecord | None] | None = None) -> Result:
        """Iterations 1..K (``num_rounds``, default the configuration's) from the keyed x^0. What
        ``evaluate_fn`` returns is the result's ServerApp-side evaluation of the iteration."""
        num_rounds = self.config.rounds if num_rounds is None else num_rounds
        timeout = self.config.round_timeout if timeout is None else timeout

        def after_round(k: int, seconds: float) -> MetricRecord | None:
            self.seconds = seconds
            self.elapsed += seconds
            return evaluate_fn(k, self.state) if evaluate_fn is not None else None

        return run_rounds(self, grid, num_rounds, timeout, after_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send every agent its own and its neighbours' iterates of the last iteration."""
        self.sent = server_round
        holders = self.roster.bind(grid)
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
                                        NEIGHBOURS_KEY: around, IDENTITY_KEY: self.run_identity}),
            })
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def _accept(self, server_round: int, reply: Message, d: int) -> tuple[int, np.ndarray] | str:
        """(agent, iterate) of a valid reply, else the reason it is not."""
        got = read_reply(reply, server_round, self.n, EXCHANGED_KEY, "agent", "iteration")
        if isinstance(got, str):
            return got
        agent, value = got
        return (vector_fault(value, d, "agent", agent) or mechanism_fault(reply, self.mechanism)
                or (agent, value))

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
            self.kinds[agent] = reported_kind(reply)
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


QUANTIZATION = 2**22  # SecAgg+'s levels per iterate coordinate (Flower's default)
MODULUS = 2**32  # its masks' modulus (Flower's default): the sum of N quantised iterates must stay below


class SecureSum(LegacyStrategy):
    """The server of Algorithm 1's SecAgg+ form (``exchange=secret``): each iteration every agent uploads
    x_i^k through SecAgg+ and the server gets only their average, from which it keeps S^k = N times it and
    sends S^k to all agents next iteration. It starts from S^0, the sum of the keyed x^0 (data-free).

    A Flower *legacy* strategy, because SecAgg+ runs as a legacy workflow (:func:`secure_workflow`).
    Algorithm 1 needs every agent's iterate in every iteration: fewer replies, or a secure aggregation
    that halts, stop the run with an error naming the iteration. After each iteration
    ``evaluate_fn(k, S^k)`` is called; the record it returns, when it holds ``log-error-average``, is
    Flower's centralised evaluation of the iteration (its loss and metrics in the closing summary). The fit
    config carries the run identity; the agents' fit metrics their kind of randomness (:attr:`kinds`)."""

    def __init__(self, config: DecentralConfig, agents: Agents,
                 evaluate_fn: Callable[[int, torch.Tensor], dict[str, float] | None] | None = None) -> None:
        if config.exchange != "secret" or config.algorithm != "ldp-admm":
            raise ValueError(f"SecureSum runs exchange='secret' with algorithm='ldp-admm', not "
                             f"exchange={config.exchange!r} with algorithm={config.algorithm!r}")
        self.n = int(agents.adjacency.shape[-1])
        if self.n * QUANTIZATION >= MODULUS:
            raise ValueError(f"agents={self.n} is too many for SecAgg+'s modulus 2^32 with 2^22 levels; "
                             f"exchange='secret' on Flower takes at most {MODULUS // QUANTIZATION - 1}")
        self.config = config
        self.evaluate_fn = evaluate_fn
        self.run_identity = new_run_identity()  # as GraphRouter's: sent with S^{k-1} to every agent
        # the federation's check before iteration 1 (Roster.admit); SecAgg+ then samples the connected nodes
        self.roster = Roster(self.n, config.node_timeout, config.round_timeout, source=f"agents={self.n}",
                             identity=self.run_identity)
        self.total = engine.initial_state(agents, [config.seed]).x[0].sum(dim=0)  # S^0
        self.summed = 0  # the last iteration whose sum arrived
        self.sent = 0  # the last iteration sent out: a run stopped in it counts the releases up to it
        self.started = 0.0
        self.seconds = 0.0  # of the last iteration, from sending S^{k-1} to the sum S^k
        self.elapsed = 0.0
        self.kinds: dict[int, str] = {}  # the randomness each agent reported in its fit metrics
        self.mechanism = privacy.mechanism_of(config, int(agents.features.shape[-1]))

    def __repr__(self) -> str:
        return f"SecureSum(N={self.n}, K={self.config.rounds})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters([self.total.cpu().numpy()])

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                      ) -> list[tuple[ClientProxy, FitIns]]:
        """Every agent gets S^{k-1}; all N must be connected."""
        if not client_manager.wait_for(self.n, timeout=int(self.config.node_timeout)):
            raise RuntimeError(f"iteration {server_round}: {client_manager.num_available()} of the "
                               f"{self.n} agents' nodes connected within node-timeout="
                               f"{self.config.node_timeout:g} s; Algorithm 1 needs all of them")
        self.started = time.perf_counter()
        self.sent = server_round
        instruction = FitIns(parameters, {"server-round": server_round, IDENTITY_KEY: self.run_identity})
        return [(proxy, instruction) for proxy in client_manager.sample(self.n, min_num_clients=self.n)]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[tuple[ClientProxy, FitRes] | BaseException]
                      ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """S^k = N times SecAgg+'s average of the agents' x_i^k."""
        if failures or len(results) != self.n:
            first = f"; the first failure: {failures[0]}" if failures else ""
            raise RuntimeError(f"iteration {server_round}: {len(results)} of the {self.n} agents' iterates "
                               f"were summed{first}; Algorithm 1 needs every agent's iterate")
        for _, result in results:  # SecAgg+ hands each agent's fit metrics on; its vector only in the sum
            agent = result.metrics.get("partition-id")
            if agent is not None:
                self.kinds[int(agent)] = str(result.metrics.get(KIND_KEY, "unreported"))
            ran = result.metrics.get(MECHANISM_KEY)
            if ran != self.mechanism:  # one agent's iterate cannot be left out of the sum: the run stops
                raise RuntimeError(f"iteration {server_round}: agent {agent} ran {ran!r}, not this run's "
                                   f"{self.mechanism!r}: the run's privacy statement would not cover the sum")
        average = parameters_to_ndarrays(results[0][1].parameters)[0]
        self.total = torch.from_numpy(np.asarray(average, dtype=np.float64) * self.n)
        self.summed = server_round
        self.seconds = time.perf_counter() - self.started
        self.elapsed += self.seconds
        return ndarrays_to_parameters([self.total.numpy()]), {"agents": len(results)}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """After iteration k: stop if its sum did not arrive (a halted SecAgg+), else ``evaluate_fn``."""
        if server_round == 0:
            return None
        if self.summed != server_round:
            raise RuntimeError(f"iteration {server_round}: the secure aggregation halted (see the log: too "
                               "few agents answered a stage); Algorithm 1 needs every agent's iterate")
        record = self.evaluate_fn(server_round, self.total) if self.evaluate_fn is not None else None
        # Flower's legacy summary keeps (loss, metrics) per round: the loss is the log-error of the agents'
        # average where the server holds the data to compute it; without one it would print a made-up loss
        if record is None or "log-error-average" not in record:
            return None
        return record["log-error-average"], {k: v for k, v in record.items() if isinstance(v, (int, float))}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
                           ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}


def secure_workflow(config: DecentralConfig, agents: int) -> DefaultWorkflow:
    """Flower's workflow for :class:`SecureSum`: SecAgg+ with every agent holding a share of every other's
    secrets (N shares) and N - 1 of them needed to unmask (so that an honest-but-curious server with N - 2
    colluding agents learns no single iterate, as with Algorithm 3), unit weights, iterates in
    [-``secagg-range``, ``secagg-range``]; no federated evaluation."""
    def no_evaluation(grid: Grid, context: Context) -> None:
        return None

    secagg = SecAggPlusWorkflow(num_shares=agents, reconstruction_threshold=agents - 1, max_weight=1.0,
                                clipping_range=config.secagg_range, quantization_range=QUANTIZATION,
                                modulus_range=MODULUS, timeout=config.round_timeout)
    return DefaultWorkflow(fit_workflow=secagg, evaluate_workflow=no_evaluation)
