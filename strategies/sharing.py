"""The ADMM-sharing server strategy (paper 001) on Flower's Message API: vertical federated learning.

The server holds the labels, z and y; party m (one SuperNode) holds its column block and x_m.
Each round the server sends every party s - z and y (N-vectors), each party answers with its
noisy message D_m x~_m, and the server takes the z- and y-steps
(:func:`dpadmm.sharing.engine.server_step`, the engine's own function). Every party adds its own
noise, so the server sees only noisy messages (each party's guarantee covers its own features).

Alignment: vertical learning needs row i to be the same sample at every party and at the server.
Each party's train reply carries the digest of its ordered sample ids; one that differs from the
digest of the server's labels' ids is a configuration error of the deployment, not a fault of a
round, and stops the run with a ValueError that names the party (a reply without a digest is a
malformed reply, rejected like the faults below).

Faults: a reply that is missing, an error, for another round or party, of the wrong length or not
finite is rejected with a logged reason, and the round uses that party's last accepted message
(the start's zeros if it has none). The server then sends that party the message it holds
(``own``), so that its subtraction trick stays consistent with the server's sum.

Randomness: the server draws a run identity per run and sends it every round (``run-identity``); each
party binds its own secret to it when deployed (:mod:`clients.randomness`) and reports the kind it used,
which the server records (:attr:`ADMMSharing.kinds`) for the privacy statement. The server chooses no
party's kind.

Evaluation, in simulation, asks each party for its test scores and sums them: test log loss and error, and
the primal residual of what was sent. The training objective needs the exact training scores, which
the noise protects, so a Flower run does not report it (the engine does). A deployed party refuses to send
test scores (a noise-free function of its training rows, ``clients.gate``), so on a deployed grid the server
asks for none and records the primal residual of the released messages only.
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

from dpadmm.models.binary import majority_share
from dpadmm.privacy.randomness import SIMULATION, new_run_identity
from dpadmm.sharing import engine, privacy, updates
from dpadmm.sharing.config import SharingConfig
from dpadmm.wire import (
    DUAL_KEY,
    IDENTITY_KEY,
    IDS_DIGEST_KEY,
    MESSAGE_KEY,
    OWN_KEY,
    PULLED_KEY,
    SCORES_KEY,
)
from strategies.nodes import (
    Roster,
    mechanism_fault,
    refused,
    reported_kind,
    require_argument,
    require_tensor,
    server_kind,
    stop_if_every_reply_was_rejected,
)
from strategies.rounds import read_reply, run_rounds, vector_fault


class ADMMSharing(Strategy):
    """Server side of ADMM sharing (001 Algorithm 1, eq. (16)) for ``len(parties)`` parties.

    ``labels`` [N] and ``test_labels`` are +-1; ``ids_digest`` is the digest of their ordered sample ids
    (:func:`dpadmm.data.vertical.ids_digest`), which every party's must equal. After each round
    ``evaluate_fn(t, record)`` is called with the round's metrics when the round is evaluated.
    """

    def __init__(self, config: SharingConfig, labels: torch.Tensor, test_labels: torch.Tensor,
                 ids_digest: str) -> None:
        require_argument("config", config, SharingConfig, "a dpadmm.sharing.config.SharingConfig")
        require_tensor("labels", labels, 1, "+-1")
        require_tensor("test_labels", test_labels, 1, "+-1")
        self.config = config
        self.labels = labels
        self.test_labels = test_labels
        self.ids_digest = ids_digest
        self.parties = len(config.widths)
        n = int(labels.shape[0])
        self.rho = config.penalty(n)
        self.messages = labels.new_zeros((1, self.parties, n))
        self.z = labels.new_zeros((1, n))
        self.y = labels.new_zeros((1, n))
        self.held = [0] * self.parties  # the round of each party's message the server holds (0: the start)
        self.resend = [False] * self.parties  # whether the party must be sent the message the server holds
        self.run_identity = new_run_identity()  # what deployed parties bind their secrets to, per run
        self.roster = Roster(self.parties, config.node_timeout, config.round_timeout,
                             source=f"parties={config.parties!r}", identity=self.run_identity)
        self.rejected: list[tuple[int, int, str]] = []  # (round, party, reason)
        self.seconds = 0.0  # of the last round: from sending s - z and y to the new z and y
        self.elapsed = 0.0  # of rounds 1..t (evaluations excluded), as the engine's ``elapsed``
        self.sent = 0  # the last round sent out: a run stopped in it counts the parties' releases up to it
        self.kinds: dict[int, str] = {}  # the randomness each party last reported (clients.randomness)
        # the mechanism this run's statement covers: a message that states another is rejected
        self.mechanism = privacy.mechanism_of(config, n)

    # ----- Strategy API -----

    def summary(self) -> None:
        c = self.config
        log(INFO, "\t├── admm-sharing on %s, parties %s: %s, T=%d, rho=%g, l2=%g, x-bound=%g", c.dataset,
            c.parties, f"eps={c.epsilon:g} per round ({c.noise} noise)" if c.private else "non-private",
            c.rounds, self.rho, c.l2, c.x_bound)

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, dict[str, float]], MetricRecord | None] | None = None
              ) -> Result:
        """Run rounds 1..T (``num_rounds``, default the configuration's); x, z, y start at 0. The result's
        ServerApp-side evaluation of a round is what ``evaluate_fn`` returns, else the round's metrics."""
        num_rounds = self.config.rounds if num_rounds is None else num_rounds
        timeout = self.config.round_timeout if timeout is None else timeout
        # deployed parties release no test scores (clients.gate): a deployed run's rounds record what the
        # server computes from the released messages only
        tested = server_kind(grid) == SIMULATION
        if not tested:
            log(INFO, "deployed parties do not send test scores, a noise-free function of their training "
                "rows: each round records the primal residual of the released messages only")

        def after_round(t: int, seconds: float) -> MetricRecord | None:
            self.seconds = seconds
            self.elapsed += seconds
            if t % self.config.eval_every == 0 or t == num_rounds:
                if tested:
                    asks = self.configure_evaluate(t, ArrayRecord(), ConfigRecord(), grid)
                    record = self.aggregate_evaluate(t, refused(grid.send_and_receive(messages=asks,
                                                                                      timeout=timeout)))
                else:
                    record = MetricRecord({"round": t, "primal-residual": self._residual()})
                if record is None:
                    return None
                if evaluate_fn is not None:
                    returned = evaluate_fn(t, dict(record))
                    return record if returned is None else returned
                return record
            return None

        return run_rounds(self, grid, num_rounds, timeout, after_round)

    def _holders(self, grid: Grid, server_round: int) -> dict[int, int]:
        holders = self.roster.bind(grid)
        missing = sorted(set(range(self.parties)) - set(holders))
        if missing:
            log(WARNING, "round %d: no connected node holds parties %s; their last messages are used",
                server_round, missing)
        return holders

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Send every party s - z and y (and, after a fault, the message the server holds of it)."""
        self.sent = server_round
        pulled = (self.messages.sum(dim=1) - self.z)[0].cpu().numpy()
        dual = self.y[0].cpu().numpy()
        messages = []
        for m, node in sorted(self._holders(grid, server_round).items()):
            record = {PULLED_KEY: Array(pulled), DUAL_KEY: Array(dual)}
            if self.resend[m]:
                record[OWN_KEY] = Array(self.messages[0, m].cpu().numpy())
            content = RecordDict({
                "arrays": ArrayRecord(record),
                "config": ConfigRecord({"server-round": server_round, "partition-id": m,
                                        "own-round": self.held[m], IDENTITY_KEY: self.run_identity}),
            })
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def _reject(self, server_round: int, party: int, reason: str) -> None:
        log(WARNING, "round %d: party %d rejected: %s; its last message is used", server_round, party, reason)
        self.rejected.append((server_round, party, reason))
        self.resend[party] = True

    def _accept(self, server_round: int, reply: Message, length: int, key: str
                ) -> tuple[int, np.ndarray] | str:
        """(party, vector) of a valid reply, else the reason it is not."""
        got = read_reply(reply, server_round, self.parties, key, "party", "round")
        if isinstance(got, str):
            return got
        party, value = got
        if key == MESSAGE_KEY:  # before the length: a party of other samples holds another N, too
            try:
                digest = str(reply.content["config"][IDS_DIGEST_KEY])
            except (KeyError, TypeError) as err:
                return f"malformed reply: no digest of party {party}'s sample ids ({err!r})"
            self._check_aligned(party, digest)
            fault = vector_fault(value, length, "party", party) or mechanism_fault(reply, self.mechanism)
        else:  # test scores: no release of the training features, no mechanism
            fault = vector_fault(value, length, "party", party)
        return fault or (party, value)

    def _check_aligned(self, party: int, digest: str) -> None:
        """A ValueError, which stops the run, unless ``party``'s ids are the labels' ids in their order."""
        if digest != self.ids_digest:
            raise ValueError(
                f"party {party}'s sample ids are not aligned with the labels' (digest {digest[:12]}... of "
                f"its ids and test_ids, {self.ids_digest[:12]}... of the labels'): every party's data-path "
                "file and the server's labels-path file must list the same ids in the same order, for the "
                "training and for the test samples (dpadmm deploy vertical writes such files)")

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Keep each valid message, take the z- and y-steps with the messages held."""
        answered, reasons = set(), {}
        for reply in replies:
            got = self._accept(server_round, reply, self.messages.shape[2], MESSAGE_KEY)
            if isinstance(got, str):
                sender = self.roster.nodes.get(reply.metadata.src_node_id)
                if sender is None:
                    log(WARNING, "round %d: a reply from an unknown node rejected: %s", server_round, got)
                else:
                    reasons[sender] = got
                continue
            party, value = got
            self.messages[0, party] = torch.from_numpy(value).to(self.messages.dtype)
            self.held[party], self.resend[party] = server_round, False
            answered.add(party)
            self.kinds[party] = reported_kind(reply)
        for party in sorted(set(range(self.parties)) - answered):
            self._reject(server_round, party, reasons.get(party, "no reply"))
        stop_if_every_reply_was_rejected(server_round, len(answered),
                                         [(f"party {m}", why) for m, why in sorted(reasons.items())])
        self.z, self.y = engine.server_step(self.messages, self.y, self.labels, self.rho)
        return ArrayRecord(), MetricRecord({"parties": len(answered)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Ask every party for its test scores."""
        return [Message(content=RecordDict({"config": ConfigRecord({"server-round": server_round,
                                                                    "partition-id": m})}),
                        message_type=MessageType.EVALUATE, dst_node_id=node)
                for m, node in sorted(self._holders(grid, server_round).items())]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Test log loss and error of the summed scores; the primal residual of what was sent."""
        n_test = int(self.test_labels.shape[0])
        scores = self.test_labels.new_zeros((1, n_test))
        answered = set()
        for reply in replies:
            got = self._accept(server_round, reply, n_test, SCORES_KEY)
            if isinstance(got, str):
                log(WARNING, "round %d: evaluation reply rejected: %s", server_round, got)
                continue
            party, value = got
            if party not in answered:
                scores += torch.from_numpy(value).to(scores.dtype)
                answered.add(party)
        if len(answered) != self.parties:
            log(WARNING, "round %d: test scores of %d of %d parties; not evaluated", server_round,
                len(answered), self.parties)
            return None
        error = updates.error(scores, self.test_labels)[0]
        return MetricRecord({"round": server_round,
                             "test-log-loss": float(updates.loss(scores, self.test_labels)[0]),
                             "test-error": float(error), "test-majority": majority_share(self.test_labels),
                             "test-undecided": float(updates.undecided(scores)[0]),
                             "primal-residual": self._residual()})

    def _residual(self) -> float:
        """||sum_m D_m x~_m - z||: the primal residual of the messages held, released ones."""
        return float(torch.linalg.vector_norm(self.messages.sum(dim=1) - self.z))
