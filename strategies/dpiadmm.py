"""The DP-IADMM server strategy (003 Algorithm 1, lines 1-9) on Flower's Message API.

The server is the single keeper of the ADMM state: w, and z_p, the last local iterate
and lambda_p of every agent p. Each round it sends a sampled agent its own lambda_p and
local iterate together with w, and the agent sends back its new z_p (and, for E > 1, its
last local iterate). Agents keep nothing between rounds, so a device that restarts, drops
out or misses rounds loses nothing, and a server restarted from its checkpoint continues
exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dpadmm import wire
from dpadmm.iadmm import privacy, schedules
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.consensus import (
    consensus_violation,
    dual_reference,
    dual_update,
    global_update,
    model_after_round,
)
from dpadmm.iadmm.federation import DTYPES
from dpadmm.models.modules import Params
from dpadmm.privacy.ledger import Ledger
from dpadmm.privacy.randomness import new_run_identity
from dpadmm.privacy.randomness import statement as randomness_statement
from dpadmm.runs import checkpoint
from strategies.nodes import (
    Roster,
    claimed_partition,
    mechanism_fault,
    refused,
    reported_kind,
    require_argument,
    require_tensor,
    stop_if_every_reply_was_rejected,
)

# Keys that only steer waiting; a checkpoint may be resumed with other values.
OPERATIONAL_KEYS = ("node-timeout", "round-timeout")


@dataclass
class RoundReport:
    """The operator's view of one round: who was asked, who counted, who did not and why.

    ``rejected`` lists replies that were not aggregated, each with the node, the partition
    it was asked for (or claims, when its node was not asked; None if unreadable) and the
    reason. ``privacy_spent`` is the largest
    epsilon spent so far by any agent (PLD at ``delta``, over the rounds each agent was
    actually asked; inf for a non-private run).
    """

    round: int
    sampled: list[int]
    replied: list[int] = field(default_factory=list)
    no_reply: list[int] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    privacy_spent: float = 0.0
    seconds: float = 0.0
    randomness: list[str] = field(default_factory=list)  # the kinds the accepted replies report using

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DPIADMM(Strategy):
    """Server side of DP-IADMM (ObjP, ObjPM, ObjT, IADMM) and of the OutP baseline.

    Per round t, for the agents :func:`dpadmm.iadmm.schedules.participants` samples:

    * objective-perturbation family: ``configure_train`` computes w^{t+1} = eq. (4a) over
      all P agents (line 5) and sends it; ``aggregate_train`` stores each accepted z_p^{t+1}
      and updates lambda_p (line 8);
    * OutP: the agents update first with w^t; ``aggregate_train`` then computes w^{t+1}
      and the duals.

    An agent that was not sampled, did not reply in time or whose reply was rejected keeps
    its last z_p and lambda_p; w still averages all P. A reply is rejected (with a logged
    reason, never aggregated) when it carries an error (the ClientApp's, or the SuperLink's
    "node unavailable"), answers no message of this round, comes from another node than the
    one asked, claims another partition than its node holds, was computed for another round,
    or has a ``z`` of the wrong shape or dtype or with non-finite entries.

    Agents are identified by the partition id each node reports once (a query message);
    the binding node -> partition is kept, and a second node claiming a partition that a
    connected node holds is refused. With ``checkpoint`` the whole state is saved there
    atomically after every round, and a new strategy with the same configuration resumes
    from it (:attr:`round` is the last completed round).

    The model is any set of named parameter tensors: ``parameters`` is w^1 = z_p^0 (zeros
    for logistic regression, as in Algorithm 1; a network's own initialisation, see
    :func:`dpadmm.models.modules.initial_parameters`), and lambda_p starts at 0. Every update
    applies per tensor. Messages carry the variables in one ``ArrayRecord`` keyed
    ``<role>.<parameter>`` (:mod:`dpadmm.wire`).

    The configuration is calibrated here (eps-bar to ``target-epsilon``), as each agent calibrates it in
    :func:`clients.dpiadmm.train_reply`; a reply stating another mechanism is rejected, so
    :meth:`statement` covers every release the run used. ``evaluate_fn(t, arrays)`` and ``Result.arrays``
    receive the model after round t (:meth:`model`).

    Example: a ServerApp and its ClientApp (RunConfig's defaults are the main job: the whole run
    (8, 1e-5)-DP per agent, and a step rule that follows the noise)::

        @server.main()
        def main(grid, context):
            config = RunConfig(model="custom", num_agents=5)
            strategy = DPIADMM(config, initial_parameters(MyNet(), config.seed))
            result = strategy.start(grid=grid, evaluate_fn=my_eval)  # my_eval(t, arrays): the model after t
            print(privacy.headline(strategy.statement(total_samples=I), my_error(result.arrays)))

        @client.query()
        def query(msg, context):
            return answer_query(msg, int(context.node_config["partition-id"]))

        @client.train()
        def train(msg, context):
            p = int(context.node_config["partition-id"])
            data = AgentData.from_blocks([x_p], [y_p], num_classes=10, total=I, agents=[p])
            return train_reply(msg, RunConfig(model="custom", num_agents=5), data, p, module=MyNet(),
                               node_config=context.node_config)

    ``examples/plugin_app`` is a complete app, and docs/families/iadmm.md shows one built outside this
    repository.
    """

    def __init__(self, config: RunConfig, parameters: Mapping[str, torch.Tensor], *,
                 checkpoint_path: str | Path | None = None,
                 on_round: Callable[[RoundReport], None] | None = None):
        require_argument("config", config, RunConfig, "a dpadmm.iadmm.config.RunConfig")
        if not parameters:
            raise ValueError("parameters is empty; give the model's initial parameters as a dict of tensors")
        for name, p in parameters.items():
            require_tensor(f"parameters[{name!r}]", p, p.dim() if isinstance(p, torch.Tensor) else 1)
        # eps-bar calibrated to target-epsilon here, as every agent calibrates it (clients.dpiadmm's
        # train_reply): the strategy's statement and its accounts are about the noise the agents add
        self.config = config = privacy.calibrate(config)
        self.dtype = DTYPES[config.dtype]
        self.shapes = {name: tuple(int(d) for d in p.shape) for name, p in parameters.items()}
        self.w: Params = {name: p.detach().to(device="cpu", dtype=self.dtype).clone()
                          for name, p in parameters.items()}
        self.z: Params = {name: p.expand(config.num_agents, *p.shape).clone() for name, p in self.w.items()}
        self.z_chain = self._chain()
        self.lam: Params = {name: torch.zeros_like(p) for name, p in self.z.items()}
        self.round = 0
        self.taken = [0] * config.num_agents  # rounds each agent was asked to compute (its releases)
        # The run's identity, which deployed nodes bind their secrets to: new for each run, kept by the
        # checkpoint, so that a resumed run asks its nodes for the same draws and a new run for new ones.
        self.run_identity = new_run_identity()
        # every round samples the same number of agents: the run can start once that many are connected
        self.roster = Roster(config.num_agents, config.node_timeout, config.round_timeout,
                             needed=len(schedules.participants(config, 1)), identity=self.run_identity)
        self.checkpoint_path = None if checkpoint_path is None else Path(checkpoint_path)
        self.on_round = on_round
        self.last_train_metrics: MetricRecord | None = None
        self.last_report: RoundReport | None = None
        self._sent: list[tuple[Message, int, int]] = []  # this round's (message, node id, partition)
        self._started = time.perf_counter()
        self.kinds: dict[int, str] = {}  # the randomness each agent last reported (clients.randomness)
        # the mechanism this run's statement covers: a reply that states another is rejected
        self.mechanism = privacy.mechanism_of(config)
        self._resume()

    # ----- Strategy API -----

    def initial_arrays(self) -> ArrayRecord:
        """The current global model: w^1 at the start, the model after the saved round on resume."""
        return ArrayRecord(self.model())

    def summary(self) -> None:
        c = self.config
        log(INFO, "\t├── DP-IADMM: algorithm=%s, %s, E=%d, P=%d, T=%d, fraction-train=%g", c.algorithm,
            privacy.step_line(c), c.steps, c.num_agents, c.rounds, c.fraction_train)
        log(INFO, "\t└── rho constants (c1, c2, Tc) = %s, a = %s, beta = %s",
            c.rho_constants, c.scale, c.beta)

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Run rounds :attr:`round` + 1 .. ``num_rounds`` (default T), resuming after a restart.

        Flower's loop, with three differences: it starts after the last checkpointed round,
        it has no federated evaluation (w is evaluated centrally by ``evaluate_fn``), and
        after each round it calls ``on_round`` and writes the checkpoint. ``initial_arrays``
        is ignored: the state is the strategy's own (w = 0, or the checkpoint's).
        """
        num_rounds = self.config.rounds if num_rounds is None else num_rounds
        timeout = self.config.round_timeout if timeout is None else timeout
        train_config = ConfigRecord() if train_config is None else train_config
        log(INFO, "Starting %s strategy at round %d of %d:", self.__class__.__name__, self.round + 1,
            num_rounds)
        self.summary()
        result = Result()
        t_start = time.time()
        arrays = self.initial_arrays()
        for t in range(self.round + 1, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", t, num_rounds)
            replies = refused(grid.send_and_receive(
                messages=self.configure_train(t, arrays, train_config, grid), timeout=timeout))
            arrays, metrics = self.aggregate_train(t, replies)
            result.arrays = arrays
            result.train_metrics_clientapp[t] = metrics
            if evaluate_fn:
                res = evaluate_fn(t, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[t] = res
            if self.on_round and self.last_report is not None:
                self.on_round(self.last_report)
            if self.last_report is not None:
                stop_if_every_reply_was_rejected(t, len(self.last_report.replied), [
                    (f"partition {r['partition']}", r["reason"]) for r in self.last_report.rejected])
            self.save()
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        return result

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send each sampled agent w, its lambda_p and last iterate (line 6); w^{t+1} first (line 5)."""
        self._started = time.perf_counter()
        sampled = schedules.participants(self.config, server_round)
        self.last_report = RoundReport(round=server_round, sampled=sampled)
        if self.config.algorithm != "outp":
            self.w = global_update(self.z, self.lam, schedules.rho_at(self.config, server_round),
                                   self.config.server_update)
        holders = self.roster.bind(grid)
        self._sent = []
        # w is the same for every agent: serialised once, and the one Array (its bytes, its chunks' hashes)
        # goes into every message, as Flower's FedAvg sends one record to all. Flower serialises each array
        # when the record is built, so the per-agent rows go in as views, not copies.
        shared = {key: Array(value) for key, value in wire.pack({"w": self.w}).items()}
        for p in sampled:
            node = holders.get(p)
            if node is None:
                continue  # no connected node holds p: it counts as no reply
            self.taken[p] += 1
            train_config = ConfigRecord(dict(config))
            train_config["server-round"] = server_round
            train_config["partition-id"] = p
            train_config[wire.IDENTITY_KEY] = self.run_identity
            own = wire.pack({"lambda": _row(self.lam, p), "z": _row(self.z_chain, p)})
            state = ArrayRecord({**shared, **{key: Array(value) for key, value in own.items()}})
            message = Message(content=RecordDict({"arrays": state, "config": train_config}),
                              message_type=MessageType.TRAIN, dst_node_id=node)
            self._sent.append((message, node, p))
        return [message for message, _, _ in self._sent]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Store each accepted z_p^{t+1} and update lambda_p (line 8); w^{t+1} after the agents for OutP.

        Returns the model after this round's replies (:meth:`model`, what ``evaluate_fn(t, arrays)`` and
        ``Result.arrays`` receive, as Flower's strategies return theirs) and the round's metrics, where
        ``consensus-violation`` is the residual of this round's dual update (the w it sent, the z_p it
        received)."""
        rho_t = schedules.rho_at(self.config, server_round)
        report = self.last_report or RoundReport(round=server_round, sampled=[])
        accepted: dict[int, tuple[Params, Params]] = {}
        # The grid gave each sent message its id; a reply names the message it answers.
        asked = {message.metadata.message_id: (node, p) for message, node, p in self._sent}
        for reply in replies:
            node, p = asked.pop(reply.metadata.reply_to_message_id, (reply.metadata.src_node_id, None))
            outcome = self._check(reply, node, p, server_round)
            if isinstance(outcome, str):
                partition = p if p is not None else claimed_partition(reply)
                report.rejected.append({"node": node, "partition": partition, "reason": outcome})
                log(WARNING, "round %d: rejected the reply of node %s (partition %s): %s", server_round, node,
                    partition, outcome)
                continue
            accepted[p] = outcome
            self.kinds[p] = reported_kind(reply)
        report.randomness = sorted({self.kinds[p] for p in accepted})
        # Every replying agent's rows at once: one copy per parameter, not one per agent (each a parallel
        # region of torch's threads, which wait on CPUs the ClientApps hold in a simulation).
        order = sorted(accepted)
        rows = torch.tensor(order, dtype=torch.long)
        if order:
            for name in self.shapes:  # z_chain is z itself when E = 1: the same values either way
                self.z[name][rows] = torch.stack([accepted[p][0][name] for p in order])
                self.z_chain[name][rows] = torch.stack([accepted[p][1][name] for p in order])
        if self.config.algorithm == "outp":
            self.w = global_update(self.z, self.lam, rho_t, self.config.server_update)
        reference = dual_reference(self.config.server_update, self.w, self.z)
        if len(order) == self.config.num_agents:  # the same element-wise operations as one agent at a time
            self.lam = dual_update(self.lam, reference, self.z, rho_t)
        elif order:
            lam = dual_update({name: v[rows] for name, v in self.lam.items()}, reference,
                              {name: v[rows] for name, v in self.z.items()}, rho_t)
            for name in self.shapes:
                self.lam[name][rows] = lam[name]
        self.round = server_round
        report.replied = sorted(accepted)
        report.no_reply = sorted(set(report.sampled) - set(accepted)
                                 - {r["partition"] for r in report.rejected})
        report.privacy_spent = privacy.spent(self.config, max(self.taken))
        report.seconds = time.perf_counter() - self._started
        self._log(report)
        metrics = MetricRecord({
            "consensus-violation": consensus_violation(self.w, self.z),
            "rho": rho_t,
            "replies": len(accepted),
            "rejected": len(report.rejected),
            "no-reply": len(report.no_reply),
            "seconds": report.seconds,
        })
        self.last_train_metrics = metrics
        return ArrayRecord(self.model()), metrics

    def model(self) -> Params:
        """The model after the last completed round's replies (a copy):
        :func:`dpadmm.iadmm.consensus.model_after_round`, post-processing of the releases the server
        holds; before round 1, w^1."""
        if self.round == 0:
            return _copy(self.w)
        return model_after_round(self.config.algorithm, _copy(self.w), self.z, self.lam,
                                 schedules.rho_at(self.config, self.round + 1), self.config.server_update)

    def statement(self, total_samples: int | None = None) -> Ledger | None:
        """This run's privacy statement (None for a non-private run): the ledger of one agent under the
        strategy's (calibrated) configuration, whose randomness line says what the agents that replied so
        far reported using (:mod:`clients.randomness`: keyed by the seed in a simulation, their own secret
        on deployed nodes). ``total_samples`` (I, the samples of all agents) makes the sensitivity a
        number. ``statement().summary()`` is the full statement, ``privacy.headline(statement(), error)``
        its one line; every reply it covers ran the mechanism it states (the others are rejected)."""
        if not self.config.private:
            return None
        ledger = privacy.ledger(self.config, total_samples=total_samples)
        return dataclasses.replace(ledger, randomness=randomness_statement(set(self.kinds.values()) or None))

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: w is evaluated centrally (``evaluate_fn``)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # ----- checkpoints -----

    def save(self) -> None:
        """Write the state after :attr:`round` to the checkpoint, atomically (no-op without one)."""
        if self.checkpoint_path is None:
            return
        checkpoint.save(self.checkpoint_path, {
            "round": self.round, "config": self._identity(), "shapes": self._shape_identity(),
            "w": self.w, "z": self.z, "z_chain": self.z_chain, "lam": self.lam,
            "rho": schedules.rho_at(self.config, max(self.round, 1)),
            "taken": list(self.taken), "privacy_spent": privacy.spent(self.config, max(self.taken)),
            "nodes": [[n, p] for n, p in self.roster.nodes.items()],
            "seed": self.config.seed,  # the key of participation, and of the simulation kind's draws
            "run_identity": self.run_identity, "kinds": [[p, k] for p, k in self.kinds.items()],
        })

    def _resume(self) -> None:
        saved = checkpoint.load(self.checkpoint_path, {"config": self._identity(),
                                                       "shapes": self._shape_identity()})
        if saved is None:
            return
        for key in ("w", "z", "lam"):
            setattr(self, key, {name: v.to(self.dtype) for name, v in saved[key].items()})
        self.z_chain = self._chain({name: v.to(self.dtype) for name, v in saved["z_chain"].items()})
        self.round = int(saved["round"])
        self.taken = [int(k) for k in saved["taken"]]
        self.roster.nodes = {int(n): int(p) for n, p in saved["nodes"]}
        self.run_identity = str(saved.get("run_identity", self.run_identity))
        self.roster.identity = self.run_identity  # the nodes charged this run under it: their query names it
        self.kinds = {int(p): str(k) for p, k in saved.get("kinds", [])}
        log(INFO, "DP-IADMM: resuming after round %d from %s", self.round, self.checkpoint_path)

    def _chain(self, saved: Params | None = None) -> Params:
        """The agents' last local iterates, z_p^0 at the start: z itself when E = 1 (they are equal), so
        the server keeps two copies of the agents' parameters instead of three for all but ObjPM."""
        if self.config.steps == 1:
            return self.z
        return _copy(self.z) if saved is None else saved

    def _shape_identity(self) -> dict[str, list[int]]:
        """The model a checkpoint must match: each parameter's name and shape."""
        return {name: list(shape) for name, shape in self.shapes.items()}

    def _identity(self) -> dict[str, Any]:
        """The configuration a checkpoint must match (waiting times may differ)."""
        return {k: v for k, v in self.config.to_mapping().items() if k not in OPERATIONAL_KEYS}

    # ----- helpers -----

    def _check(self, reply: Message, node: int, p: int | None,
               server_round: int) -> tuple[Params, Params] | str:
        """(z_p, last local iterate) of an acceptable reply, or the reason to reject it."""
        if reply.has_error():  # also the SuperLink's own "node unavailable" replies
            return f"the ClientApp failed: {reply.error.reason}"
        if p is None:
            return "it answers no message of this round (a late or duplicate reply)"
        if reply.metadata.src_node_id != node:
            return f"it comes from node {reply.metadata.src_node_id}, but the message went to node {node}"
        roles = ("z", "z-last") if self.config.sends_last_iterate else ("z",)
        try:
            metrics = reply.content["metrics"]
            claimed, computed_for = int(metrics["partition-id"]), int(metrics["server-round"])
            received = wire.unpack(reply.content["arrays"])
            arrays = {role: {name: received[role][name].numpy() for name in self.shapes} for role in roles}
        except (KeyError, TypeError, ValueError) as err:
            return f"malformed: {type(err).__name__} {err}"
        if claimed != p:
            return f"claims partition {claimed}, but its node holds partition {p}"
        if computed_for != server_round:
            return f"computed for round {computed_for}, not this round {server_round}"
        expected = np.dtype(str(self.dtype).removeprefix("torch."))
        for role in roles:
            if set(received[role]) != set(self.shapes):
                return f"{role} has parameters {sorted(received[role])}, expected {sorted(self.shapes)}"
            for name, value in arrays[role].items():
                key = role if list(self.shapes) == [name] else f"{role}.{name}"
                if value.dtype != expected:
                    return f"{key} has dtype {value.dtype}, expected {expected}"
                if tuple(value.shape) != self.shapes[name]:
                    return f"{key} has shape {tuple(value.shape)}, expected {self.shapes[name]}"
                if not np.isfinite(value).all():
                    return f"{key} has non-finite entries"
        fault = mechanism_fault(reply, self.mechanism)
        if fault is not None:
            return fault
        tensors = {role: {name: torch.from_numpy(v.copy()) for name, v in arrays[role].items()}
                   for role in roles}
        return tensors["z"], tensors.get("z-last", tensors["z"])

    def _log(self, report: RoundReport) -> None:
        spent = ("none (non-private)" if math.isinf(report.privacy_spent)
                 else f"eps={report.privacy_spent:.4g}")
        log(INFO, "round %d: %d of %d sampled agents replied; no reply: %s; rejected: %s; privacy spent "
            "(largest over agents, PLD at delta=%g): %s", report.round, len(report.replied),
            len(report.sampled), report.no_reply or "none",
            [(r["partition"], r["reason"]) for r in report.rejected] or "none", self.config.delta, spent)


def _row(params: Params, p: int) -> Params:
    """Agent p's row of the per-agent parameters ([P, ...] -> [...]): views, not copies."""
    return {name: v[p] for name, v in params.items()}


def _copy(params: Params) -> Params:
    return {name: v.clone() for name, v in params.items()}
