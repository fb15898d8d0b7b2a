"""The two kinds of randomness a run can use, and a node's own secret.

**Simulation** (the engine, ``dpadmm train``, ``dpadmm reproduce``, ``flwr run .`` on Flower's simulation
engine): every draw comes from a stream keyed by the run's public ``seed`` (:mod:`dpadmm.privacy.noise`),
so a run is a function of its configuration, bit for bit, and a Flower simulation equals the engine. Its
transcript is reproducible by anyone who holds the run config, the server included: a simulated run
shows what the mechanism does, it protects nothing.

**Deployment** (a Flower SuperNode on a network): every draw that touches private data (the noise, the
Poisson samples, a minibatch's order, 004's random weights) comes from :class:`Secret`, a ChaCha20 stream
under a key that only the node holds (:mod:`dpadmm.privacy.secure`), and the noise is sampled on a grid
so that its floating-point representation leaks nothing. The key of a run is
``derive(node secret, run identity, agent)``: the node secret is 256 bits from the OS CSPRNG, created on
the node the first time it is needed and kept in the node's own state folder (:class:`NodeSecret`), never
sent; the run identity is a random value the server draws when a run starts and keeps in its checkpoint,
so two runs never share noise, while a resumed run asks its nodes for the same draws again. Each draw is
a pure function of (key, agent, round, step, stream), so a repeated round repeats exactly; the node also
records which request it answered for each (run, round) and refuses a different one
(:meth:`NodeSecret.answer`): the same noise on two different inputs would cancel in their difference.

Which kind a run uses is decided where the draws are made, never by anything the server sends: the
run config is the server's, and a key there that switched a node to keyed noise would hand a malicious
server the noise. A Flower ClientApp takes the deployment kind unless it can tell that it runs inside
Flower's simulation engine (``clients.client_app``); a node-side setting (its node config or its
environment, :data:`FORCE_ENV`) may force either kind, and forcing the simulation kind on a deployment is
printed as a warning in the privacy statement.

This module is part of the privacy floor: it knows no family. A family's functions take ``randomness``
(None: the simulation kind, keyed by the run's seed; else a :class:`Secret`) and ask it for the draws.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dpadmm.files import write_once
from dpadmm.privacy import secure
from dpadmm.privacy.device import agent_lock, answered_records, check_run_identity, node_state_dir
from dpadmm.privacy.ledger import NO_RUN

SIMULATION, DEPLOYMENT = "simulation", "deployment"
KINDS = (SIMULATION, DEPLOYMENT)
FORCE_ENV = "DPADMM_RANDOMNESS"  # a node's environment may force a kind: "simulation" or "deployment"
FORCE_KEY = "randomness"  # ... as may its node config (the node's own setting, never the run config's)
STATE_KEY = "state-dir"  # ... or its node config's
SERVER_STATE_ENV = "DPADMM_SERVER_STATE"  # a server that draws (002's) keeps its secret there

FORCED_SIMULATION = "forced-simulation"  # a deployed node forced onto keyed streams (it reports so)

# What a statement says of each kind a run's agents used (and of a deployed node forced onto keyed streams).
DESCRIPTIONS = {
    SIMULATION: ("simulation randomness: the noise and samples came from streams keyed by the run's seed, so "
                 "the transcript is reproducible from the run config; the guarantee describes the mechanism "
                 "a deployment runs. Not covered: what a simulated server computes from the raw training "
                 "data (the train loss or objective it reports; a deployed server computes none)"),
    DEPLOYMENT: ("deployment randomness: each node's noise and samples came from its own 256-bit secret "
                 "(ChaCha20), never sent, with the noise on a grid (discrete Laplace / Gaussian)"),
    FORCED_SIMULATION: ("WARNING: a deployed node was forced to simulation randomness: its releases are NOT "
                        "private against anyone holding the run config, the server included"),
}


def statement(kinds: list[str] | tuple[str, ...] | set[str] | None) -> str:
    """What a privacy statement says of the randomness its run's agents reported using (None: no run, as
    ``dpadmm privacy``): one description per kind, the forced warning first."""
    if kinds is None:
        return NO_RUN
    order = [FORCED_SIMULATION, DEPLOYMENT, SIMULATION]
    known = [DESCRIPTIONS[k] for k in order if k in kinds]
    unknown = sorted(set(kinds) - set(order))
    if unknown:
        known.append(f"randomness not reported by some agents ({', '.join(unknown)}): their noise is their "
                     "app's")
    return "; ".join(known) if known else NO_RUN


def kind_of(randomness: Secret | None) -> str:
    """The kind of ``randomness`` (None: the simulation kind)."""
    return SIMULATION if randomness is None else DEPLOYMENT


def forced_kind(node_config: Mapping[str, object], environ: Mapping[str, str] | None = None) -> str | None:
    """The kind the node's own settings force (its node config's ``randomness``, else $DPADMM_RANDOMNESS),
    or None; anything else is refused with what is allowed."""
    environ = os.environ if environ is None else environ
    for where, value in ((f"node config {FORCE_KEY}", node_config.get(FORCE_KEY)),
                         (f"${FORCE_ENV}", environ.get(FORCE_ENV))):
        if value not in (None, ""):
            if value not in KINDS:
                raise ValueError(f"{where}={value!r} is not allowed; choose one of {', '.join(KINDS)}")
            return str(value)
    return None


@dataclass(frozen=True)
class Secret:
    """The deployment kind: the draws of the agents whose run keys it holds (a node holds one agent's).

    ``keys`` maps an agent id to its 32-byte key for this run (:func:`run_key`). Every draw is a pure function
    of (key, agent, round, step, stream), like the keyed streams', so a repeated round repeats exactly; unlike
    them, nobody without the key can compute it.
    """

    keys: Mapping[int, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        for agent, key in self.keys.items():
            if not isinstance(key, bytes) or len(key) != secure.KEY_BYTES:
                raise ValueError(f"the key of agent {agent} must be {secure.KEY_BYTES} bytes")

    def stream(self, agent: int, round_: int, step: int, stream: int) -> secure.Stream:
        """The cryptographic stream of one draw."""
        if agent not in self.keys:
            raise ValueError(f"this node holds the keys of agents {sorted(self.keys)}, not agent {agent}: an "
                             "agent's draws come from its own node's secret")
        return secure.draw_stream(self.keys[agent], agent, round_, step, stream)

    def _rows(self, agents: torch.Tensor) -> list[int]:
        return [int(a) for a in agents.tolist()]

    def bernoulli(self, agents: torch.Tensor, round_: int, step: int, stream: int, numel: int,
                  rate: float) -> torch.Tensor:
        """[P, numel] bool, each True with probability ``rate`` exactly (a Poisson sample's mask)."""
        rows = [secure.bernoulli(self.stream(a, round_, step, stream), numel, rate)
                for a in self._rows(agents)]
        return torch.from_numpy(np.stack(rows) if rows else np.zeros((0, numel), dtype=bool))

    def uniform(self, agents: torch.Tensor, round_: int, step: int, stream: int, numel: int) -> torch.Tensor:
        """[P, numel] float64 uniforms in (0, 1), 53 random bits each (orders and weights, not noise)."""
        rows = [secure.uniform01(self.stream(a, round_, step, stream), numel) for a in self._rows(agents)]
        return torch.from_numpy(np.stack(rows) if rows else np.zeros((0, numel)))

    def release(self, mechanism: str, value: torch.Tensor, scale: torch.Tensor, agents: torch.Tensor,
                round_: int, step: int, stream: int) -> torch.Tensor:
        """value [P, ...] with each agent's row released by the grid mechanism of ``mechanism`` (Laplace scale
        or Gaussian standard deviation ``scale[p]``): :func:`dpadmm.privacy.secure.laplace_release` or
        :func:`~dpadmm.privacy.secure.gaussian_release`. The result depends on the row only through its
        rounding to the grid."""
        if mechanism not in ("laplace", "gaussian"):
            raise ValueError(f"mechanism={mechanism!r} is not allowed; choose laplace or gaussian")
        fn = secure.laplace_release if mechanism == "laplace" else secure.gaussian_release
        spreads = [float(s) for s in scale.reshape(-1).tolist()]
        ids = self._rows(agents)
        if value.shape[0] != len(ids) or len(spreads) != len(ids):
            raise ValueError(f"value of shape {tuple(value.shape)} and scale of shape {tuple(scale.shape)} "
                             f"do not match the {len(ids)} agents")
        return torch.stack([fn(value[i], spreads[i], self.stream(a, round_, step, stream))
                            for i, a in enumerate(ids)]) if ids else value.clone()


def run_key(node_secret: bytes, run_identity: str, agent: int) -> bytes:
    """An agent's key for one run: its node's secret bound to the run's identity and the agent's id."""
    check_run_identity(run_identity)
    return secure.derive(node_secret, "dpadmm-run", run_identity, agent)


def new_run_identity() -> str:
    """A run's identity: 128 random bits from the OS CSPRNG (the server draws it once and keeps it)."""
    return secure.new_key()[:16].hex()


def request_digest(*parts: bytes | str | int | float) -> str:
    """SHA-256 of what a request asks (the state it sends), to tell a repeated request from another."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else repr(part).encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def state_dir(node_config: Mapping[str, object], environ: Mapping[str, str] | None = None) -> Path:
    """The node's own state folder: node config ``state-dir``, else $DPADMM_NODE_STATE, else
    ~/.dpadmm/node."""
    chosen = node_config.get(STATE_KEY)
    return Path(str(chosen)) if chosen else node_state_dir(environ)


def server_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The server's own state folder: ``$DPADMM_SERVER_STATE``, else ~/.dpadmm/server."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(SERVER_STATE_ENV)
    return Path(chosen) if chosen else Path.home() / ".dpadmm" / "server"


class NodeSecret:
    """A node's secret for one agent, and its record of the (run, round) requests it answered.

    Files in the node's state folder, readable by the node's user only: ``agent-<id>.key`` (32 bytes from the
    OS CSPRNG, written once, atomically) and ``agent-<id>.answered.jsonl`` (one line per answered request:
    run identity, round, digest of the request). Both survive a restart of the node, so a restarted node
    answers a cut-short round with the same draws, and nothing it answers twice costs privacy twice.
    """

    def __init__(self, directory: str | Path, agent: int):
        self.directory = Path(directory)
        self.agent = int(agent)
        self.key_path = self.directory / f"agent-{self.agent}.key"
        self.record_path = self.directory / f"agent-{self.agent}.answered.jsonl"

    def secret(self) -> bytes:
        """The node's secret for this agent, created on first use: once, under the agent's lock
        (:func:`~dpadmm.privacy.device.agent_lock`), so that every caller, in any thread or process, gets the
        same key; written to a temporary file of its own, fsynced, and linked into place with its folder
        fsynced, so that a crash leaves either no key or the whole one (a key lost after a release would
        answer the same round again with other noise)."""
        if not self.key_path.exists():
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            with agent_lock(self.directory, self.agent):  # once: not made by another caller meanwhile
                write_once(self.key_path, secure.new_key(), mode=stat.S_IRUSR | stat.S_IWUSR)
        key = self.key_path.read_bytes()
        if len(key) != secure.KEY_BYTES:
            raise ValueError(f"{self.key_path} holds {len(key)} bytes, not a {secure.KEY_BYTES}-byte secret; "
                             "restore it, or remove it to start over (a new secret cannot resume old runs)")
        return key

    def randomness(self, run_identity: str) -> Secret:
        """This agent's deployment randomness for one run (a request whose run identity the device would not
        store, :func:`~dpadmm.privacy.device.check_run_identity`, is refused before a secret is made)."""
        check_run_identity(run_identity)
        return Secret({self.agent: run_key(self.secret(), run_identity, self.agent)})

    def answer(self, run_identity: str, round_: int, digest: str) -> None:
        """Record that this agent answers ``round_`` of the run with the request of ``digest``; refuse a
        request for a (run, round) it answered with another request (its draws would be used twice). The
        record is read and appended under the agent's lock (:func:`~dpadmm.privacy.device.agent_lock`), so
        of two different requests for one (run, round) at once exactly one is recorded."""
        check_run_identity(run_identity)
        with agent_lock(self.directory, self.agent):
            for line in self._records():
                if line["run"] == run_identity and line["round"] == round_:
                    if line["request"] != digest:
                        raise ValueError(f"agent {self.agent} already answered round {round_} of this run "
                                         "for another request; answering again would reuse its noise on a "
                                         "different input, so it refuses")
                    return
            fd = os.open(self.record_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                         stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "a") as f:
                f.write(json.dumps({"run": run_identity, "round": int(round_), "request": digest}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def _records(self) -> list[dict]:
        return answered_records(self.record_path)
