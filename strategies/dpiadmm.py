"""The DP-IADMM server strategy (003 Algorithm 1, lines 1-9) on Flower's Message API."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from logging import ERROR, INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dpadmm import schedules
from dpadmm.config import RunConfig
from dpadmm.consensus import consensus_violation, dual_digest, dual_update, global_update
from dpadmm.federation import DTYPES


class DPIADMM(Strategy):
    """Server side of DP-IADMM (ObjP, ObjPM, ObjT, IADMM) and of the OutP baseline.

    Holds w, and z_p, lambda_p for every agent p = 0..P-1 (P = ``config.num_agents``),
    indexed by the partition id a client reports. Per round t:

    * objective-perturbation family: ``configure_train`` computes w^{t+1} (line 5) and sends
      it; ``aggregate_train`` stores each z_p^{t+1} and updates lambda_p (line 8);
    * OutP: the agents update first with w^t; ``aggregate_train`` then computes w^{t+1}
      and the duals.

    ``aggregate_train`` returns w^{t+1} as the round's global model (what ``evaluate_fn``
    sees) and a MetricRecord with ``consensus-violation``, ``noise-magnitude``, ``rho``,
    ``replies``, ``dual-mismatches`` and ``seconds`` (wall time of the round, from sending w
    to the last aggregation). ``shape`` is (J, K), the shape of w.

    Example (in a ServerApp)::

        strategy = DPIADMM(RunConfig(algorithm="objpm", epsilon=0.1, num_agents=10), shape=(784, 10))
        result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(),
                                num_rounds=strategy.config.rounds, evaluate_fn=my_eval)
    """

    def __init__(self, config: RunConfig, shape: tuple[int, int]):
        self.config = config
        self.shape = (int(shape[0]), int(shape[1]))
        zeros = torch.zeros((config.num_agents, *self.shape), dtype=DTYPES[config.dtype])
        self.w = zeros[0].clone()
        self.z = zeros.clone()
        self.lam = zeros.clone()
        self.last_train_metrics: MetricRecord | None = None
        self._round_started = time.perf_counter()

    # ----- Strategy API -----

    def initial_arrays(self) -> ArrayRecord:
        """The starting global model w = 0 (Algorithm 1 starts from w = z_p = lambda_p = 0)."""
        return ArrayRecord({"w": self.w.clone()})

    def summary(self) -> None:
        c = self.config
        log(INFO, "\t├── DP-IADMM: algorithm=%s, eps-bar=%s per local step, E=%d, P=%d, T=%d",
            c.algorithm, c.effective_epsilon, c.steps, c.num_agents, c.rounds)
        log(INFO, "\t└── rho constants (c1, c2, Tc) = %s, a = %s, beta = %s",
            c.rho_constants, c.prox_scale, c.beta)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send the round's model to every agent (line 6); compute w^{t+1} first (line 5)."""
        self._round_started = time.perf_counter()
        rho_t = schedules.rho_at(self.config, server_round)
        if self.config.algorithm != "outp":
            self.w = global_update(self.z, self.lam, rho_t)
        node_ids = self._wait_for_nodes(grid)
        train_config = ConfigRecord(dict(config))
        train_config["server-round"] = server_round
        content = RecordDict({"arrays": ArrayRecord({"w": self.w.clone()}), "config": train_config})
        return [Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)
                for node in node_ids]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Store each z_p^{t+1} and update lambda_p (line 8); w^{t+1} after the agents for OutP."""
        rho_t = schedules.rho_at(self.config, server_round)
        received: dict[int, tuple[torch.Tensor, MetricRecord]] = {}
        for reply in replies:
            accepted = self._accept(reply)
            if accepted is not None:
                p, z_p, metrics = accepted
                if p in received:
                    log(ERROR, "round %d: two replies claim partition %d; keeping the first", server_round, p)
                    continue
                received[p] = (z_p, metrics)
        if len(received) < self.config.num_agents:
            missing = sorted(set(range(self.config.num_agents)) - set(received))
            log(WARNING, "round %d: no reply from partitions %s; they keep their last z_p and lambda_p",
                server_round, missing)
        mismatches = 0
        if self.config.algorithm == "outp":
            # The agents' copy lags one round (they learn w^{t+1} with the next message).
            mismatches += self._check_duals(server_round, received)
        for p, (z_p, _) in received.items():
            self.z[p] = z_p
        if self.config.algorithm == "outp":
            self.w = global_update(self.z, self.lam, rho_t)
        for p in received:
            self.lam[p] = dual_update(self.lam[p], self.w, self.z[p], rho_t)
        if self.config.algorithm != "outp":
            mismatches += self._check_duals(server_round, received)
        magnitudes = [float(m["noise-magnitude"]) for _, m in received.values()]
        metrics = MetricRecord({
            "consensus-violation": consensus_violation(self.w, self.z),
            "noise-magnitude": sum(magnitudes) / len(magnitudes) if magnitudes else 0.0,
            "rho": rho_t,
            "replies": len(received),
            "dual-mismatches": mismatches,
            "seconds": time.perf_counter() - self._round_started,
        })
        self.last_train_metrics = metrics
        return ArrayRecord({"w": self.w.clone()}), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: w is evaluated centrally (``evaluate_fn``)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # ----- helpers -----

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        """Every agent's node: Algorithm 1 needs all P agents (partial participation is not built yet)."""
        needed = self.config.num_agents
        deadline = time.monotonic() + self.config.node_timeout
        while len(nodes := sorted(grid.get_node_ids())) < needed:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(nodes)} of num-agents={needed} nodes connected within node-timeout="
                    f"{self.config.node_timeout:g} s. In simulation, size the federation to match: "
                    f"flwr run . --federation-config 'num-supernodes={needed}'")
            log(INFO, "Waiting for nodes: %d of %d connected", len(nodes), needed)
            time.sleep(1.0)
        if len(nodes) > needed:
            raise ValueError(f"{len(nodes)} nodes are connected but num-agents={needed}; every node is an "
                             "agent, so set num-agents to the number of nodes")
        return nodes

    def _accept(self, reply: Message) -> tuple[int, torch.Tensor, MetricRecord] | None:
        """The reply's (partition id, z_p, metrics), or None with a logged reason."""
        if reply.has_error():
            log(ERROR, "reply from node %s carries an error: %s", reply.metadata.src_node_id, reply.error)
            return None
        try:
            metrics = reply.content["metrics"]
            p = int(metrics["partition-id"])
            z_p = reply.content["arrays"]["z"].numpy()
        except (KeyError, TypeError, ValueError) as err:
            log(ERROR, "malformed reply from node %s (%s); ignored", reply.metadata.src_node_id, err)
            return None
        if not 0 <= p < self.config.num_agents:
            log(ERROR, "reply claims partition-id %d outside 0..%d; ignored", p, self.config.num_agents - 1)
            return None
        if tuple(z_p.shape) != self.shape:
            log(ERROR, "reply from partition %d has z of shape %s, expected %s; ignored", p, z_p.shape,
                self.shape)
            return None
        return p, torch.tensor(z_p, dtype=self.z.dtype), metrics

    def _check_duals(self, server_round: int, received: dict[int, tuple[torch.Tensor, MetricRecord]]) -> int:
        """Count agents whose reported lambda_p digest differs from the server's copy."""
        bad = 0
        for p, (_, metrics) in received.items():
            server_sum, server_l1 = dual_digest(self.lam[p])
            client = (float(metrics.get("dual-sum", math.nan)), float(metrics.get("dual-l1", math.nan)))
            if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                       for a, b in zip(client, (server_sum, server_l1), strict=True)):
                bad += 1
                log(ERROR, "round %d: lambda_%d differs between agent %s and server %s", server_round, p,
                    client, (server_sum, server_l1))
        return bad
