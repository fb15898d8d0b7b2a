"""The DP-ADMM / DP-AccADMM server strategy (paper 002) on Flower's Message API: central DP.

The paper's algorithm is centralised: one noisy full-batch gradient per iteration. On Flower
the training rows are split among the clients; each iteration the server sends every client
the point where the gradient is wanted (x_{t-1}, or x-hat_{t-1} for AccADMM), each client
returns the sum of its per-sample gradients, each clipped to L2 norm c, and its sample count,
and the server adds the Gaussian noise once to the mean and takes the y-, x- and dual steps
(:func:`dpadmm.linadmm.engine.iterate`, the engine's own function). With one client this is the
paper's algorithm; with any number the iterates are the same up to the order of a sum.

Who must be trusted: the server sees every client's exact gradient sum before it adds the
noise (central DP); the guarantee is about what the server releases (the iterates). An
iteration needs every client's rows: a missing or rejected reply stops the run with an error
naming it, since the mean over n (the public sample count) would otherwise be wrong.

Randomness. The server is the one party that draws, so it decides its own kind
(:func:`strategies.nodes.server_kind`): on
Flower's in-memory grid (``flwr run`` on the simulation engine, ``run_simulation``) the simulation kind,
keyed by the run's seed as the engine's; on any other grid (a SuperLink with SuperNodes) the deployment kind,
from the server's own secret (:func:`server_secret`, a file in the server's state folder, agent id 0)
bound to a run identity drawn for the run: nobody who holds the run config can recompute or subtract the
noise, and the noisy mean is released on a grid. ``$DPADMM_RANDOMNESS`` in the server's environment may
force either kind (a forced simulation on a deployment is stated as a warning). The server records every
iteration it answered with a digest of the gradient it released, and refuses to release another gradient
for the same iteration of the same run: the same noise on two gradients would reveal their difference.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dpadmm.linadmm import engine, privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.privacy.randomness import NodeSecret, new_run_identity, request_digest, server_state_dir
from dpadmm.wire import GRADIENT_KEY, IDENTITY_KEY, POINT_KEY
from strategies.nodes import Roster, require_argument, require_tensor
from strategies.rounds import run_rounds


def server_secret(environ: Mapping[str, str] | None = None) -> NodeSecret:
    """The server's secret and record of answered iterations (agent id 0), in :func:`server_state_dir`:
    created on first use (256 bits from the OS CSPRNG, readable by the server's user only), never sent."""
    return NodeSecret(server_state_dir(environ), engine.SERVER_AGENT)


class DPLinADMM(Strategy):
    """Server side of DP-ADMM and DP-AccADMM (002 Algorithms 2 and 3) for ``num-agents`` clients.

    ``a`` is the constraint matrix [W; I] and ``num_samples`` the public total n. After each
    iteration ``evaluate_fn(t, state, y)`` is called with the engine's state (one run). ``secret`` (the
    server's :func:`server_secret`) makes the noise the deployment kind's, bound to the strategy's
    :attr:`run_identity`; None keys it by the run's seed (the simulation kind).

    Example (in a ServerApp)::

        strategy = DPLinADMM(config, problem.a, problem.num_samples)
        strategy.start(grid=grid, evaluate_fn=lambda t, state, y: ...)
    """

    def __init__(self, config: LinAdmmConfig, a: torch.Tensor, num_samples: int,
                 secret: NodeSecret | None = None) -> None:
        require_argument("config", config, LinAdmmConfig, "a dpadmm.linadmm.config.LinAdmmConfig")
        require_tensor("a", a, 2)
        require_argument("num_samples", num_samples, int, "the clients' sample count n, an integer >= 1")
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples!r} is not allowed; give the clients' sample count "
                             "n >= 1")
        if config.dual_init != "zero":
            raise ValueError(f"dual-init={config.dual_init!r} is not allowed on Flower: the paper's u_0 "
                             "needs the exact gradient of all the clients' data at x_0; use 'zero'")
        self.run_identity = new_run_identity()  # new per run: two runs never share noise
        self.secret = secret
        self.randomness = secret.randomness(self.run_identity) if secret else None
        self.config = config
        self.a = a
        self.num_samples = num_samples
        self.constants = engine.settings(config, a)
        self.sigma = privacy.noise_std(config, num_samples)
        self.state = engine.initial_state(config, a, 1)
        self.roster = Roster(config.num_agents, config.node_timeout, config.round_timeout,
                             identity=self.run_identity)
        self.round = 0
        self.last_y: torch.Tensor | None = None
        self.seconds = 0.0  # wall time of the last iteration, from sending the point to the new iterate
        self._started = 0.0

    # ----- Strategy API -----

    def summary(self) -> None:
        c = self.config
        privacy_text = f"eps={c.target_epsilon:g} for the run (sigma={self.sigma:.4g})" if c.private else \
            "non-private"
        log(INFO, "\t├── %s on %s: %s, T=%d, eta=%g, gamma=%g, rho=%g, lambda=%g", c.algorithm, c.dataset,
            privacy_text, c.rounds, c.eta, self.constants.gamma, c.rho, c.l1)
        log(INFO, "\t└── %d clients, n=%d samples, clip c=%g", c.num_agents, self.num_samples, c.grad_bound)

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, engine.State, torch.Tensor], MetricRecord | None] | None = None
              ) -> Result:
        """Run iterations 1..T (``num_rounds``, default the configuration's); ``initial_arrays`` is ignored
        (x_0 = 0, u_0 = 0). What ``evaluate_fn`` returns is the result's ServerApp-side evaluation."""
        num_rounds = self.config.rounds if num_rounds is None else num_rounds
        timeout = self.config.round_timeout if timeout is None else timeout

        def after_round(t: int, _seconds: float) -> MetricRecord | None:  # its own clock: after the wait
            if evaluate_fn is not None and self.last_y is not None:
                return evaluate_fn(t, self.state, self.last_y)
            return None

        return run_rounds(self, grid, num_rounds, timeout, after_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send every client the point where iteration t takes its gradient."""
        holders = self.roster.bind(grid)
        missing = sorted(set(range(self.config.num_agents)) - set(holders))
        if missing:
            raise RuntimeError(f"round {server_round}: no connected node holds partitions {missing}; every "
                               "client's rows are needed for the full-batch gradient")
        self._started = time.perf_counter()
        point = engine.query_point(self.state, self.constants.accelerated)[0]
        messages = []
        for p, node in sorted(holders.items()):
            content = RecordDict({
                "arrays": ArrayRecord({POINT_KEY: Array(point.numpy())}),
                # the run identity, to which a deployed client's device charges the run (clients.randomness)
                "config": ConfigRecord({"server-round": server_round, "partition-id": p,
                                        IDENTITY_KEY: self.run_identity}),
            })
            message = Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)
            messages.append(message)
        return messages

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Sum the clients' clipped gradient sums, add the noise to the mean, take the iteration."""
        d = self.a.shape[1]
        total = torch.zeros(d, dtype=self.a.dtype)
        count, answered = 0, set()
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                raise RuntimeError(f"round {server_round}: node {node} failed: {reply.error.reason}")
            metrics = reply.content["metrics"]
            partition, computed_for = int(metrics["partition-id"]), int(metrics["server-round"])
            if computed_for != server_round:
                raise RuntimeError(f"round {server_round}: node {node} answered for round {computed_for}")
            value = reply.content["arrays"][GRADIENT_KEY].numpy()
            if value.shape != (d,) or not np.isfinite(value).all():
                raise RuntimeError(f"round {server_round}: node {node} sent a gradient sum of shape "
                                   f"{value.shape} (expected ({d},), finite)")
            total += torch.from_numpy(np.asarray(value, dtype=np.float64)).to(self.a.dtype)
            count += int(metrics["count"])
            answered.add(partition)
        missing = sorted(set(range(self.config.num_agents)) - answered)
        if missing:
            raise RuntimeError(f"round {server_round}: partitions {missing} did not reply; every client's "
                               "rows are needed for the full-batch gradient")
        if count != self.num_samples:
            raise RuntimeError(f"round {server_round}: the clients hold {count} samples, but the run is "
                               f"configured for n = {self.num_samples} (the public count of the sensitivity "
                               "c/n)")
        if self.secret is not None:  # refuse to reuse this iteration's noise on another gradient
            data = total.detach().cpu().contiguous().numpy().tobytes()
            self.secret.answer(self.run_identity, server_round,
                               request_digest(repr(sorted(self.config.to_mapping().items())), server_round,
                                              str(total.dtype), data))
        gradient = engine.release(total.unsqueeze(0), self.num_samples, [self.config.seed], server_round,
                                  self.sigma, self.randomness)
        self.state, self.last_y = engine.iterate(self.a, self.state, gradient, self.constants)
        self.round = server_round
        self.seconds = time.perf_counter() - self._started
        return ArrayRecord({"x": Array(self.state.x[0].numpy())}), MetricRecord({"clients": len(answered)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: the server evaluates x centrally."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
