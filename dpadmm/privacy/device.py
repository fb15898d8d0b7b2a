"""The device's own privacy: its policy, and its budget across every run (a privacy filter).

A deployed node answers a server it does not trust. The run config is the server's, so nothing in it may
decide what the device leaks: this module is the one node-side place that does. Each family describes a
run to it as a :class:`RunRequest` (its algorithm, its planned rounds, whether it is private, covered by a
proven bound, or central DP that trusts the server, and the node's own accountant for the whole run) before
the node releases anything, and the device:

- checks the run against its operator's :class:`Policy` (``<state-dir>/policy.toml``, which no run config
  reaches): the largest (epsilon, delta) of one run, computed by the node's accountant from the request and
  the node's own data; the algorithms it accepts; the neighbouring relation every run's guarantee must be
  stated for; non-private, not-covered and central-DP runs refused unless the operator opts in;
- charges the run's whole (epsilon, delta) once, at its first release, to the agent's budget file, and
  refuses a run that would cross the lifetime budget (decided first at the partition query, which names the
  run, before any node releases): the budget is spent by everything the device ever
  released, across runs and run identities. Runs compose by basic composition (the sums of epsilon and of
  delta), which stays valid when each run's parameters are chosen after the last one's output: basic
  composition is a privacy filter (Rogers, Roth, Ullman & Vadhan, "Privacy Odometers and Filters:
  Pay-as-you-Go Composition", NeurIPS 2016);
- binds the charge to the run: the digest of its configuration as the server sent it, the digest of the
  node's data, its planned rounds. A second configuration under one run identity, changed data under a
  reused identity, and a round beyond the run's rounds are refused. A request repeated exactly costs nothing
  more: its draws are fixed by (node secret, run identity, round), so the repeat is the same release. A run
  identity the device would not store (empty, over 64 characters, or not of ``[0-9A-Za-z_.-]``) is refused
  before anything is written (:func:`check_run_identity`).

The budget is written and fsynced before the release leaves the device. A missing or damaged budget file
fails closed: the node refuses and says why, it never starts again from zero by itself.

Refusals name only what the server sent and the operator set, never a number computed from the data, so a
refusal reads the same for neighbouring data sets.

It knows no family; it imports neither torch nor the accountants.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from dpadmm.files import write_once

POLICY_FILE = "policy.toml"
STATE_ENV = "DPADMM_NODE_STATE"  # the node's state folder (default ~/.dpadmm/node)
BUDGET_SUFFIX = ".budget.jsonl"
# a run's epsilon may exceed a cap by this relative slack: a calibration that meets its target to the
# accountant's precision (8 within 1e-9) is the target
SLACK = 1e-6
# The longest run identity a device stores: a dpadmm server draws 32 hex characters (new_run_identity)
IDENTITY_LIMIT = 64
_IDENTITY = re.compile(r"[0-9A-Za-z_.-]*")
# The neighbouring relations a guarantee is stated for: one sample added or removed, or one replaced. Which
# one a device's runs are held to is its policy's (a guarantee under one does not give the same (eps, delta)
# under the other: a replacement is a removal and an addition, so add-remove (eps, delta) gives replace-one
# (2 eps, (1 + e^eps) delta) only)
NEIGHBOURING = ("add-remove", "replace-one")


class DeviceRefused(ValueError):
    """The device refuses the request; the message says why, from the request and the policy only."""


@dataclass(frozen=True)
class Policy:
    """What this device accepts, set by its operator in ``<state-dir>/policy.toml`` (keys with dashes).

    The defaults are private: one run may spend at most the main job's (8, 1e-5), the device's whole life
    (64, 1e-4), eight such runs; only private runs whose sensitivity is a proven bound, with the noise added
    on the device. The least noise is set as the largest epsilon of one release (``max-release-epsilon``);
    a budget per period (``period-days`` > 0) caps what the runs admitted in the last so many days spend,
    beside the lifetime budget, which always holds. The neighbouring relation every run's guarantee must be
    stated for is the operator's too (``neighbouring``, the main job's add-remove by default), never the
    run config's.
    """

    max_run_epsilon: float = 8.0
    max_run_delta: float = 1e-5
    lifetime_epsilon: float = 64.0
    lifetime_delta: float = 1e-4
    max_release_epsilon: float = math.inf  # the least noise: the largest epsilon of one release
    period_days: float = 0.0  # 0: no budget per period
    period_epsilon: float = math.inf
    period_delta: float = 1.0
    algorithms: tuple[str, ...] = ()  # the algorithms accepted; empty: any
    allow_non_private: bool = False  # a run that releases without noise
    allow_not_covered: bool = False  # a run whose guarantee rests on a data-dependent or unproven bound
    allow_central_dp: bool = False  # a run that sends exact values and trusts the server to add the noise
    neighbouring: str = "add-remove"  # the relation a run's guarantee must be stated for (NEIGHBOURING)
    # The largest message the device's runtime pulls (clients.runtime); a larger one is refused before it is
    # pulled whole. 256 MiB: 1.7 times the largest message a family legitimately sends, DP-IADMM's train
    # message for the LEAF CNN in float64 (w, lambda and z, 3 x 6,603,710 parameters: 158,502,882 bytes as
    # Flower's objects).
    max_message_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        for name in _NUMBERS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{_key(name)}={value!r} is not allowed; it must be a number >= 0")
        if isinstance(self.max_message_bytes, bool) or not isinstance(self.max_message_bytes, int) \
                or self.max_message_bytes < 1:
            raise ValueError(f"max-message-bytes={self.max_message_bytes!r} is not allowed; it must be a "
                             "whole number of bytes >= 1")
        for name in ("allow_non_private", "allow_not_covered", "allow_central_dp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{_key(name)}={getattr(self, name)!r} is not allowed; it must be true or "
                                 "false")
        if self.neighbouring not in NEIGHBOURING:
            raise ValueError(f"neighbouring={self.neighbouring!r} is not allowed; choose one of "
                             f"{', '.join(NEIGHBOURING)}")
        if not all(isinstance(a, str) for a in self.algorithms):
            raise ValueError(f"algorithms={list(self.algorithms)!r} is not allowed; it must be a list of "
                             "names")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Policy:
        """The policy of a TOML table; an unknown key is refused with the known ones."""
        known = {_key(f.name): f.name for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown policy key {unknown[0]!r}; known keys: {', '.join(known)}")
        kwargs = {known[k]: v for k, v in values.items()}
        if "algorithms" in kwargs:
            if not isinstance(kwargs["algorithms"], list):
                raise ValueError(f"algorithms={kwargs['algorithms']!r} is not allowed; it must be a list "
                                 "of names")
            kwargs["algorithms"] = tuple(kwargs["algorithms"])
        for name in _NUMBERS:
            if isinstance(kwargs.get(name), int) and not isinstance(kwargs.get(name), bool):
                kwargs[name] = float(kwargs[name])
        return cls(**kwargs)

    def to_toml(self) -> str:
        """The policy as the TOML an operator edits."""
        lines = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                shown = "true" if value else "false"
            elif isinstance(value, tuple):
                shown = "[" + ", ".join(json.dumps(v) for v in value) + "]"
            elif isinstance(value, str):
                shown = json.dumps(value)
            elif isinstance(value, int):
                shown = str(value)
            else:
                shown = repr(float(value))
            lines.append(f"{_key(f.name)} = {shown}")
        return "\n".join(lines) + "\n"


_NUMBERS = ("max_run_epsilon", "max_run_delta", "lifetime_epsilon", "lifetime_delta", "max_release_epsilon",
            "period_days", "period_epsilon", "period_delta")


def _key(name: str) -> str:
    return name.replace("_", "-")


def node_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The node's state folder by its environment: $DPADMM_NODE_STATE, else ~/.dpadmm/node (a node config's
    ``state-dir`` comes first where the node has one: :func:`dpadmm.privacy.randomness.state_dir`)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(STATE_ENV)
    return Path(chosen) if chosen else Path.home() / ".dpadmm" / "node"


def answered_before(directory: str | Path) -> list[Path]:
    """The files in the node's state folder that show its agents have answered before (their budgets and
    their secrets), sorted."""
    directory = Path(directory)
    patterns = (f"agent-*{BUDGET_SUFFIX}", "agent-*.key")
    return sorted(p for pattern in patterns for p in directory.glob(pattern))


def _missing_policy(directory: Path, answered: list[Path]) -> str:
    """Why a device that has answered before refuses without its policy file."""
    return (f"the device's policy {directory / POLICY_FILE} is missing but this device has answered before "
            f"({answered[0].name} exists); it does not fall back to the defaults, which may be looser than "
            "its operator's policy, and refuses every run until its operator restores the file or writes the "
            f"defaults with `dpadmm node policy --write --state-dir {directory}`")


def read_policy(directory: str | Path) -> Policy:
    """The operator's policy in ``directory`` (the node's state folder). Without a policy file: the defaults
    on a device that has never answered (its first charge writes them to the file, :meth:`Device.admit`),
    refused on one that has (:func:`answered_before`: the file was lost or removed, and the device never
    runs silently looser than its operator set, as a missing budget file fails closed). A policy file that
    cannot be read is refused (the node does not fall back to anything)."""
    directory = Path(directory)
    path = directory / POLICY_FILE
    if not path.exists():
        answered = answered_before(directory)
        if answered:
            raise DeviceRefused(_missing_policy(directory, answered))
        return Policy()
    try:
        return Policy.from_mapping(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, TypeError) as error:
        raise DeviceRefused(f"the device's policy {path} cannot be read ({error}); its operator must fix it "
                            "before this node answers") from None


@dataclass(frozen=True)
class RunCost:
    """What one whole run costs this agent, by the node's own accountant: (epsilon, delta) for the run,
    the mechanism, and settings the accountant fixed for it (a calibrated noise parameter, kept so that
    later messages of the run need no accountant)."""

    epsilon: float
    delta: float
    mechanism: str
    settings: Mapping[str, float] = field(default_factory=dict)
    release_epsilon: float | None = None  # the epsilon of one release (its noise); None: the whole run's


@dataclass(frozen=True)
class RunRequest:
    """A family's description of one run to the device, before its first release (a ledger event).

    ``config`` is the digest of the run's configuration as the server sent it, ``data`` that of the node's
    data (:func:`digest`); ``cost`` is the node's accountant, called once, when the run is first seen.

    ``neighbouring`` is the relation (one of :data:`NEIGHBOURING`) the guarantee that ``cost`` states is
    proven for: DP-IADMM's and DP-ADMM's configured one (their run configs choose); replace-one for ADMM
    sharing, whose guarantee (001 Theorem 3) holds for a party's whole block of features replaced, so a
    fortiori for one sample's features replaced, its sample count and ids being public; replace-one for 004,
    whose guarantee holds for an agent's loss replaced by any loss whose gradient is within B_inf in every
    coordinate, one sample replaced when B_inf >= 2/b_i (its sample count b_i is public). The device refuses
    a run whose relation is not its policy's (:func:`check_policy`)."""

    algorithm: str
    rounds: int
    config: str
    data: str
    private: bool
    covered: bool
    cost: Callable[[], RunCost]
    neighbouring: str
    central: bool = False


class Charge(NamedTuple):
    """A run the device admitted: what it was charged, and the settings its accountant fixed. (A named tuple:
    a device with 10^5 runs reads them all at each admission, and a tuple is built fastest.)"""

    run: str
    algorithm: str
    rounds: int
    epsilon: float
    delta: float
    mechanism: str
    settings: Mapping[str, float]
    config: str
    data: str
    at: str


def digest(*parts: bytes | str) -> str:
    """SHA-256 over ``parts``, each length-prefixed (what binds a charge to a configuration or to data)."""
    h = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def config_digest(values: Mapping[str, Any]) -> str:
    """The digest of a configuration's keys and values, in key order."""
    return digest(repr(sorted((str(k), repr(v)) for k, v in values.items())))


class Device:
    """One agent's budget on this device: ``agent-<id>.budget.jsonl`` in the node's state folder, beside its
    secret (``agent-<id>.key``), under the operator's :class:`Policy`."""

    def __init__(self, directory: str | Path, agent: int) -> None:
        self.directory = Path(directory)
        self.agent = int(agent)
        self.path = self.directory / f"agent-{self.agent}{BUDGET_SUFFIX}"
        self.key_path = self.directory / f"agent-{self.agent}.key"

    def policy(self) -> Policy:
        return read_policy(self.directory)

    def admit(self, run: str, request: RunRequest, *, charge: bool = True) -> Charge:
        """Admit ``request`` under the run identity ``run`` and return its charge, or refuse it
        (:class:`DeviceRefused`). The first time a run is seen its cost is computed and, with ``charge``,
        appended to the budget and fsynced; ``charge=False`` checks without writing (the partition query,
        before any release)."""
        check_run_identity(run)
        policy = self.policy()  # without a policy file, a device that never answered takes the defaults
        check_policy(policy, request)  # the kind of run first: refused before its cost is computed
        with agent_lock(self.directory, self.agent):
            charges = self._charges()
            known = charges.get(run)
            if known is not None:
                if known.config != request.config:
                    raise DeviceRefused(f"run {run} was admitted with another configuration; one run "
                                        "identity has one configuration on this device, so it refuses this "
                                        "one")
                if known.data != request.data:
                    raise DeviceRefused(f"run {run} was admitted on other data; this device's data changed "
                                        "since, and answering the same run again would reveal the difference")
                return known
            cost = self.cost(policy, request)
            spent_epsilon = math.fsum(c.epsilon for c in charges.values())
            spent_delta = math.fsum(c.delta for c in charges.values())
            if request.private and (spent_epsilon + cost.epsilon > policy.lifetime_epsilon * (1 + SLACK)
                                    or spent_delta + cost.delta > policy.lifetime_delta * (1 + SLACK)):
                raise DeviceRefused(
                    "the device's lifetime budget would be crossed: it has spent "
                    f"(eps = {spent_epsilon:.6g}, delta = {spent_delta:.3g}) over {len(charges)} run(s), "
                    f"this run costs (eps = {cost.epsilon:.6g}, delta = {cost.delta:.3g}), and its operator "
                    "allows (eps = "
                    f"{policy.lifetime_epsilon:g}, delta = {policy.lifetime_delta:g}) in all")
            if request.private and policy.period_days > 0:
                now = datetime.datetime.now(datetime.UTC)
                since = now - datetime.timedelta(days=policy.period_days)
                recent = [c for c in charges.values() if datetime.datetime.fromisoformat(c.at) >= since]
                recent_epsilon = math.fsum(c.epsilon for c in recent) + cost.epsilon
                recent_delta = math.fsum(c.delta for c in recent) + cost.delta
                if (recent_epsilon > policy.period_epsilon * (1 + SLACK)
                        or recent_delta > policy.period_delta * (1 + SLACK)):
                    raise DeviceRefused(
                        f"the device's budget of {policy.period_days:g} day(s) would be crossed: with this "
                        "run, the runs admitted since {since.isoformat(timespec='seconds')} cost (eps = "
                        f"{recent_epsilon:.6g}, delta = {recent_delta:.3g}), and its operator allows (eps = "
                        f"{policy.period_epsilon:g}, delta = {policy.period_delta:g}) per period")
            admitted = Charge(run=run, algorithm=request.algorithm, rounds=int(request.rounds),
                              epsilon=float(cost.epsilon), delta=float(cost.delta), mechanism=cost.mechanism,
                              settings=dict(cost.settings), config=request.config, data=request.data,
                              at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
            if charge:  # the defaults, when the first charge was made under them, become the device's file
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                write_once(self.directory / POLICY_FILE, policy.to_toml().encode())
                self._append(admitted)
            return admitted

    @staticmethod
    def cost(policy: Policy, request: RunRequest) -> RunCost:
        """The run's cost by the node's accountant, within the policy's cap for one run (else refused). A
        non-private run the operator allowed is charged (inf, 1): no guarantee holds after it, and the
        lifetime budget refuses every later run."""
        check_policy(policy, request)
        if not request.private:
            return RunCost(math.inf, 1.0, "none")
        try:
            cost = request.cost()
        except ValueError as error:  # the accountant has no guarantee for it: said from the configuration
            raise DeviceRefused(f"algorithm={request.algorithm!r} as configured has no guarantee the "
                                f"device's accountant can state ({error}); this device refuses it") from None
        check_cost(policy, request.algorithm, cost)
        return cost

    def preview(self, request: RunRequest) -> RunCost:
        """What :meth:`admit` would charge a new run, or its refusal by the policy, without writing anything
        and without a run identity: the partition query of a server that names no run. Given the identity,
        the query checks :meth:`admit` with ``charge=False`` instead, the budgets included."""
        return self.cost(self.policy(), request)

    @staticmethod
    def check_round(charge: Charge, round_: int) -> None:
        """Refuse a round outside 1..rounds of the admitted run: its cost covers those rounds only."""
        if not 1 <= int(round_) <= charge.rounds:
            raise DeviceRefused(f"round {int(round_)} is not allowed; run {charge.run} was admitted for "
                                "rounds "
                                f"1..{charge.rounds}, and the device was charged for those only")

    def charges(self) -> dict[str, Charge]:
        """Every run charged so far, by run identity (the budget file; see :meth:`_charges`)."""
        with agent_lock(self.directory, self.agent):
            return self._charges()

    def _charges(self) -> dict[str, Charge]:
        """The budget file's charges. Missing while the agent has a secret, or holding a line that is not a
        charge: refused (fail closed). A last line without its newline is a write a crash cut short, before
        its fsync returned and so before any release it was to allow: not a charge."""
        if not self.path.exists():
            if self.key_path.exists():
                raise DeviceRefused(f"the budget file {self.path} is missing but agent {self.agent} has "
                                    "answered "
                                    "before (its secret exists); the device does not start its budget again "
                                    "from zero: restore the file, or remove the secret too to start over "
                                    "as a "
                                    "new device")
            return {}
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise DeviceRefused(f"the budget file {self.path} cannot be read ({error}); the device refuses "
                                "until its operator restores it") from None
        lines = text.split("\n")
        if lines and lines[-1]:
            lines = lines[:-1]  # cut short by a crash: never fsynced, so nothing was released on it
        try:  # one parse of the whole file (10^5 runs in a fraction of a second); line by line to say where
            records = json.loads("[" + ",".join(line for line in lines if line) + "]")
        except json.JSONDecodeError:
            records = None
        out: dict[str, Charge] = {}
        for number, line in enumerate(lines if records is None else records, 1):
            if not line:
                continue
            try:
                charge = Charge(**(json.loads(line) if records is None else line))
                if math.isnan(charge.epsilon) or not 0 <= charge.delta <= 1 or charge.epsilon < 0:
                    raise ValueError("a charge must have epsilon >= 0 and delta in [0, 1]")
            except (json.JSONDecodeError, TypeError, ValueError) as error:
                raise DeviceRefused(f"the budget file {self.path} is damaged at line {number} "
                                    f"({printable(error)}); the device refuses until its operator restores "
                                    "it") from None
            out[charge.run] = charge
        return out

    def _append(self, charge: Charge) -> None:
        """Append one charge and fsync it (and the folder, when the file is new) before returning."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        new = not self.path.exists()
        line = json.dumps(charge._asdict()) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            folder = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

@contextlib.contextmanager
def agent_lock(directory: Path, agent: int) -> Iterator[None]:
    """An exclusive lock over one agent's files in the node's state folder: its budget, its record of answered
    requests and the creation of its secret (:class:`~dpadmm.privacy.randomness.NodeSecret`). Two messages
    of one agent at once, in threads or processes, take turns: each reads and appends with nobody writing
    in between. Not reentrant (each call opens the lock file anew, and ``flock`` locks of two open files
    exclude each other also within one process): a holder must not take it again."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(directory / f"agent-{int(agent)}.budget.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_run_identity(run: str) -> None:
    """Refuse a run identity the device would not store, before anything is written: empty, longer than
    :data:`IDENTITY_LIMIT` characters, or holding characters outside ``[0-9A-Za-z_.-]``. The identity is kept
    in the budget and answered files and printed by ``dpadmm node status``, so a server must neither grow
    those files at will (100 identities of 1 MB made a 100 MiB budget, read at every admission) nor put
    control characters in them. The refusal names the rule and the identity's length, never its value."""
    if not run:
        raise DeviceRefused("the server sent no run identity; the device charges every release to one")
    if len(run) > IDENTITY_LIMIT:
        raise DeviceRefused(f"the server's run identity is {len(run)} characters long; this device accepts "
                            f"at most {IDENTITY_LIMIT} (a dpadmm server draws 32)")
    if not _IDENTITY.fullmatch(run):
        raise DeviceRefused(f"the server's run identity ({len(run)} characters) holds characters other than "
                            "0-9, A-Z, a-z, '_', '.' and '-'; this device accepts only those")


def check_policy(policy: Policy, request: RunRequest) -> None:
    """Refuse a run the policy rules out by its kind alone (before any accountant runs)."""
    if policy.algorithms and request.algorithm not in policy.algorithms:
        raise DeviceRefused(f"algorithm={request.algorithm!r} is not accepted by this device; its operator "
                            f"accepts {', '.join(policy.algorithms)}")
    if not request.private and not policy.allow_non_private:
        raise DeviceRefused(f"algorithm={request.algorithm!r} as configured releases without noise; "
                            "this device refuses non-private runs (its operator may allow them: "
                            "allow-non-private)")
    if request.private and not request.covered and not policy.allow_not_covered:
        raise DeviceRefused(f"algorithm={request.algorithm!r} as configured is covered by no guarantee (its "
                            "sensitivity is computed from the data or below the proven bound); this device "
                            "refuses it (its operator may allow it: allow-not-covered)")
    if request.central and not policy.allow_central_dp:
        raise DeviceRefused(f"algorithm={request.algorithm!r} sends exact values and trusts the server "
                            "to add the noise (central DP); this device refuses that (its operator may "
                            "allow it: allow-central-dp)")
    if request.private and request.neighbouring != policy.neighbouring:
        raise DeviceRefused(f"algorithm={request.algorithm!r} as configured states its guarantee for "
                            f"neighbouring={request.neighbouring!r}; this device's operator holds every run "
                            f"to neighbouring={policy.neighbouring!r} (the policy key neighbouring)")
    if int(request.rounds) < 1:
        raise DeviceRefused(f"rounds={request.rounds} is not allowed; a run has at least one round")


def check_cost(policy: Policy, algorithm: str, cost: RunCost) -> None:
    """Refuse a run whose whole-run (epsilon, delta) exceeds the policy's cap for one run. A non-private
    run (opted in) costs nothing it can count; one with no finite epsilon is refused."""
    if math.isnan(cost.epsilon) or cost.epsilon < 0 or not 0 <= cost.delta <= 1:
        raise DeviceRefused(f"algorithm={algorithm!r}: the node's accountant gave no valid (epsilon, delta)")
    if not math.isfinite(cost.epsilon):
        raise DeviceRefused(f"algorithm={algorithm!r} as configured has no finite epsilon for the whole run; "
                            "this device refuses it")
    if cost.epsilon > policy.max_run_epsilon * (1 + SLACK) or cost.delta > policy.max_run_delta * (1 + SLACK):
        raise DeviceRefused(f"algorithm={algorithm!r} as configured costs (eps = {cost.epsilon:.6g}, delta = "
                            f"{cost.delta:.3g}) for the whole run on this device; its operator allows "
                            f"at most (eps = {policy.max_run_epsilon:g}, delta = {policy.max_run_delta:g}) "
                            "per run")
    release = cost.epsilon if cost.release_epsilon is None else cost.release_epsilon
    if release > policy.max_release_epsilon * (1 + SLACK):
        raise DeviceRefused(f"algorithm={algorithm!r} as configured adds noise of eps = {release:.6g} per "
                            f"release; this device's operator wants at least the noise of eps = "
                            f"{policy.max_release_epsilon:g} per release (max-release-epsilon)")


def answered_records(path: str | Path) -> list[dict[str, Any]]:
    """The (run, round, request) lines of an agent's ``answered.jsonl`` (:class:`NodeSecret
    <dpadmm.privacy.randomness.NodeSecret>`); a line a crash cut short is no answer."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    with contextlib.suppress(json.JSONDecodeError):  # one parse of the whole file: fast
        return json.loads("[" + ",".join(lines) + "]")
    out = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):  # a line cut short by a crash: nothing was sent
            out.append(json.loads(line))
    return out


def policy_in_force(directory: str | Path) -> str:
    """One line on the policy the device in ``directory`` answers under (what ``dpadmm node serve`` says at
    its start): its file, or the defaults on a device that has never answered. Refused as
    :func:`read_policy` refuses (a damaged file; a missing one on a device that has answered)."""
    directory = Path(directory)
    path = directory / POLICY_FILE
    policy = read_policy(directory)
    if path.exists():
        return f"the device's policy is {path}"
    return (f"no policy file {path}: the defaults are in force (one run at most (eps = "
            f"{policy.max_run_epsilon:g}, delta = {policy.max_run_delta:g}), all runs (eps = "
            f"{policy.lifetime_epsilon:g}, delta = {policy.lifetime_delta:g}), private runs with a proven "
            "bound only); the first run charged writes them to that file, and `dpadmm node policy --write "
            f"--state-dir {directory}` writes them now, to edit")


def status(directory: str | Path) -> str:
    """What the device in ``directory`` has spent, per agent and run, against its lifetime budget, and how
    many rounds of each run it answered; a missing policy file on a device that has answered is said, as
    the refusal it causes (:func:`read_policy`)."""
    directory = Path(directory)
    found = answered_before(directory)
    policy = None if not (directory / POLICY_FILE).exists() and found else read_policy(directory)
    if policy is None:
        lines = [f"device {directory}: no policy: {_missing_policy(directory, found)}"]
    else:
        lines = [f"device {directory}: {policy_in_force(directory)}"]
        lines += [f"  {line}" for line in policy.to_toml().splitlines()]
    agents = sorted({int(p.name.split("-")[1].split(".")[0]) for p in found})
    if not agents and not directory.is_dir():  # a device's first answer makes it; or the path is mistyped
        lines.append(f"no agent has answered on this device: nothing spent ({directory} does not exist yet: "
                     "check the path if this device has answered runs)")
    elif not agents:
        lines.append("no agent has answered on this device: nothing spent")
    for agent in agents:
        charges = Device(directory, agent).charges()
        eps = math.fsum(c.epsilon for c in charges.values())
        delta = math.fsum(c.delta for c in charges.values())
        of = "" if policy is None else (f" of (eps = {policy.lifetime_epsilon:g}, delta = "
                                        f"{policy.lifetime_delta:g})")
        lines.append(f"agent {agent}: spent (eps = {eps:.6g}, delta = {delta:.3g}){of} over "
                     f"{len(charges)} run(s) (basic composition across runs)")
        answered: dict[str, int] = {}
        for record in answered_records(directory / f"agent-{agent}.answered.jsonl"):
            answered[record["run"]] = answered.get(record["run"], 0) + 1
        for charge in charges.values():
            done = f", {answered.get(charge.run, 0)} answered"
            lines.append(f"  run {printable(charge.run)}: {printable(charge.algorithm)}, "
                         f"{printable(charge.mechanism)}, (eps = {charge.epsilon:.6g}, delta = "
                         f"{charge.delta:.3g}) for {printable(charge.rounds)} rounds{done}; admitted "
                         f"{printable(charge.at)}")
    return "\n".join(lines)


def printable(value: object) -> str:
    """``value`` as text a terminal shows as it is: its non-printable characters escaped as Python writes
    them in a string literal (an ESC as ``\\x1b``, a newline as ``\\n``). What ``dpadmm node status`` prints
    from the budget file: a run identity stored before identities were checked, or a field of a hand-edited
    file, must not move the operator's cursor or forge a line."""
    text = str(value)
    if text.isprintable():  # every field of a device's own charges: no copy, 10^4 runs stay fast
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
