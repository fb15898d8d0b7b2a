"""The device's gate (clients.gate) proven by a neighbour fuzzer: server messages drawn adversarially are
answered by the real node code (clients.runtime.answer, the path of `dpadmm node serve`) on a device holding
D and on devices holding each kind of neighbour D'; everything but the release's noisy values must be equal:
answered / refused / failed, the text, the arrays' names, dtypes and shapes (and the values of an array that
is no release), the metrics, the configs. And each release's value before its noise, as the grid mechanism
rounds and clamps it (dpadmm.privacy.secure._release, wrapped and called through), lies within the
sensitivity its family states for the relation between D and D', plus the grid's rounding. Mutants (a fix
undone) must be caught.

What is fuzzed, per family (each device deployed: its own state folder, policy and data file, fresh context
state for each case, as after a restart):

- DP-IADMM (iadmm, objp): D of 30 MNIST-like samples and 7 neighbours (one removed; one added: ordinary,
  all bright, a label outside the classes, a NaN pixel, pixels of 1e300; one replaced), under add-remove;
  train messages (the issue's overflow, range-edge and nine-classes attacks, then random draws over values,
  shapes, dtypes, arrays and config values) and queries.
- ADMM sharing (001, replace-one, as its guarantee): party 0's file as `dpadmm deploy vertical` writes it
  (40 samples), and 6 neighbours with one sample's features replaced (another sample's, 1e300 everywhere,
  zeros, subnormals, one entry of 1e308, whose norm overflows, a NaN: a zero row); train messages of any
  round (with ``own``) or own-round 0, evaluate messages after a round on the same context, and queries.
- 004 (decentral, replace-one, as its guarantee): agent 0's file as `dpadmm deploy agents` writes it (20
  samples of Adult's 14 columns, 4 agents), and 6 neighbours with one sample replaced (another's, all ones,
  zeros, its label flipped, a label 5 and values of 7 outside the domain: zero rows); exchange=plain train
  messages (iterations 1 and 2), the SecAgg+ form's sum (iteration 1: the legacy fit message that
  secaggplus_mod unwraps reaches sum_reply so, without its stages) and queries.

- DP-ADMM (002, central DP: the exact sums go to a server its operator trusts): client 0 of a9a, which a
  node reads from the run config's data-dir (a copy of a9a per node), and 3 neighbours with one row
  replaced (another row, entries whose norm overflows, all ones); train messages (the point x) under a
  policy that allows central DP, and queries under the default policy, which refuses the run alike.

Every family's queries also carry adversarial run configs (keys at their allowed extremes and past them),
refused or answered alike. A sample outside a 001 party's or a 004 agent's domain is kept as a zero row
(the sample count is public), so such a file is a neighbour like any other; only a file with no usable row
is refused.

Sizes: the not-slow set runs FUZZ_CASES (4) train cases per family and kind (DP-IADMM train, sharing
train, 004 plain and sum), 4 queries per family, 3 sharing evaluate sequences, and the sensitivity check on
4 + 4 + 6 cases; the slow test 200 train cases per family and kind (400 for DP-IADMM), 12 evaluate sequences,
40 queries per family; DP-ADMM's 4 train cases and 4 queries run in the full suite only (its nodes read four
copies of a9a). Neighbour kinds: DP-IADMM 7 (removed, added x5, replaced), sharing 6 replaced, 004 6
replaced, DP-ADMM 3 replaced.

Mutants caught (each test_the_fuzzer_catches_each_fix_undone): DP-IADMM's gate and total clipping, its
release clamp, its rows dropped (by what the server sees); sharing's x-step held to its ball (by the
releases' distance), its evaluate refusal (the test scores differ); 004's clamp of the SecAgg+ range (the
iterate at the range's edge answered by some nodes, refused by others). Sharing's final projection
onto_ball alone undone is not caught: the x-step's trust-region Newton already lands in the ball on every
input tried."""

from __future__ import annotations

import gzip
import itertools
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.compat.common import recorddict_compat

import clients.decentral
from clients import gate, runtime
from dpadmm import native, wire
from dpadmm.data import Dataset
from dpadmm.data.node import sound_rows
from dpadmm.data.vertical import write_vertical_files
from dpadmm.decentral import graphs
from dpadmm.decentral.config import DecentralConfig
from dpadmm.models import logistic
from dpadmm.models.modules import build_model
from dpadmm.privacy import secure
from dpadmm.privacy.device import DeviceRefused
from dpadmm.privacy.ledger import clipped_sensitivity
from dpadmm.sharing import updates as sharing_updates
from dpadmm.sharing.privacy import message_sensitivity

J, K, I_TOTAL, T = 784, 10, 400, 1000
P, BETA, EPSILON = 10, 1.0, 100.0  # eps-bar 100: the node's accountant answers in 0.2 s (eps-bar 1: 22 s)
RUN = {"algorithm": "objp", "iadmm.rounds": T, "iadmm.num-agents": P, "iadmm.local-steps": 1,
       "iadmm.target-epsilon": 0.0, "iadmm.epsilon": EPSILON, "iadmm.sampling-rate": 1.0, "iadmm.beta": BETA}
DARK = (100, 200)  # pixels no sample of D has bright: the attacks below single out a neighbour that has
POLICY = "max-run-epsilon = 1e12\nmax-run-delta = 0.5\nlifetime-epsilon = 1e15\nlifetime-delta = 1e9\n"
REPLACE_ONE = POLICY + 'neighbouring = "replace-one"\n'  # 001's and 004's guarantees (conftest.TEST_POLICY)
# magnitudes a malicious server sends: the edges of float64, of the gate's bound and of the release's range
VALUES = (0.0, 1.0, -3.5, 5e-324, 2.0**40, -(2.0**40), 2.0**40 * (1 + 2**-52), 1e20, 1e308, -1e308,
          float("nan"), float("inf"), float("-inf"))
# the arrays (or array records) of a reply that are releases (noisy, or central DP's exact sums): compared
# by dtype and shape; every other array is compared by value too
RELEASED = frozenset({wire.MESSAGE_KEY, wire.EXCHANGED_KEY, wire.GRADIENT_KEY, "fitres.parameters"})
RELEASED_ROLES = frozenset({"z", "z-last"})  # DP-IADMM's released parameters, "z.<name>" for every model
FUZZ_CASES = int(os.environ.get("DPADMM_FUZZ_CASES", "4"))
pytestmark = pytest.mark.usefixtures("server_process")  # replies are built as a node's runtime builds them


# ------------------------------------------------------------------------------------------ the nodes
class Node:
    """A deployed device (its own state folder, policy and data file) answered through the runtime's path;
    ``run`` holds the run-config keys that locate its data where its family reads them from there."""

    def __init__(self, folder: Path, data: dict[str, np.ndarray] | Path, policy: str = POLICY,
                 run: dict[str, Any] | None = None, **node_config: Any) -> None:
        folder.mkdir(parents=True)
        path = folder / "data.npz"
        if isinstance(data, Path):
            shutil.copy(data, path)
        else:
            np.savez(path, **data)
        self.state = folder / "state"
        self.state.mkdir()
        (self.state / "policy.toml").write_text(policy)
        self.run = run or {}
        self.node_config = {"partition-id": 0, "data-path": str(path), "num-samples-total": I_TOTAL,
                            "randomness": "deployment", "state-dir": str(self.state), **node_config}

    def answer(self, messages: Sequence[Message], run_config: dict[str, Any]) -> tuple[Any, ...]:
        """What the server sees of the answers to ``messages``, asked in turn of one fresh context."""
        context = Context(run_id=1, node_id=1, node_config=self.node_config, state=RecordDict(),
                          run_config=run_config | self.run)
        seen_ = []
        for message in messages:
            reply, status, details = runtime.answer(message, context, runtime.APP_ID,
                                                    runtime.installed_version())
            seen_.append(_unnamed(seen(reply, status, details), self.node_config["data-path"]))
        return tuple(seen_)


def _unnamed(value: Any, path: str) -> Any:
    """``value`` with this test node's data path replaced by one name: a device's path is the same whether
    it holds D or D' (only the test's folders differ)."""
    if isinstance(value, str):
        return value.replace(path, "<data-path>")
    if isinstance(value, tuple | list):
        return type(value)(_unnamed(v, path) for v in value)
    if isinstance(value, dict):
        return {k: _unnamed(v, path) for k, v in value.items()}
    return value


def seen(reply: Message, status: str, details: str) -> tuple[Any, ...]:
    """What the server sees of a reply, but the release's noisy values."""
    if reply.has_error():
        return ("error", status, details, reply.error.reason)
    content = reply.content
    arrays = {name: (a.dtype, tuple(a.shape),
                     None if {name, kind} & RELEASED or name.partition(".")[0] in RELEASED_ROLES
                     else bytes(a.data))
              for kind, record in content.array_records.items() for name, a in record.items()}
    metrics = {k: dict(v) for k, v in content.metric_records.items()}
    configs = {k: dict(v) for k, v in content.config_records.items()}
    return ("reply", status, details, sorted(arrays.items()), metrics, configs)


Case = tuple[str, list[Message], dict[str, Any]]  # a name, the messages asked in turn, run-config changes


def released(answer: tuple[Any, ...]) -> bool:
    """Whether an answer (:func:`seen`) is a reply with the release, not a refusal or a failure."""
    return answer[0] == "reply" and all(wire.REFUSED_KEY not in config for config in answer[5].values())


class Releases:
    """Each release's value before its noise, as the grid mechanism receives it (secure._release wrapped,
    called through): (kind, spread, the value as float64)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[tuple[str, float, np.ndarray]] = []
        real = secure._release

        def recording(value: torch.Tensor, kind: str, spread: float, stream: Any) -> torch.Tensor:
            self.made.append((kind, float(spread), value.detach().to("cpu", torch.float64).reshape(-1).numpy()
                              .copy()))
            return real(value, kind, spread, stream)

        monkeypatch.setattr(secure, "_release", recording)

    def take(self) -> list[tuple[str, float, np.ndarray]]:
        made, self.made = self.made, []
        return made


def on_grid(kind: str, spread: float, value: np.ndarray) -> tuple[np.ndarray, float]:
    """(the value as the release rounds and clamps it, in grid steps; the grid step g), as _release does."""
    g = secure.grid(kind, spread, value.size)
    noise = float(math.ceil(spread / g)) if kind == "laplace" else spread / g
    limit = float(secure._INT_LIMIT) - secure._RANGE_SIGMAS * noise
    with np.errstate(over="ignore", invalid="ignore"):
        return np.rint(np.clip(value / g, -limit, limit)), g


def beyond_sensitivity(mine: list[tuple[str, float, np.ndarray]], theirs: list[tuple[str, float, np.ndarray]],
                       sensitivity: float) -> str | None:
    """Why two answers' releases (D's and a neighbour's, to one message) are not within ``sensitivity`` of
    each other on the grid (L1 for Laplace, L2 for Gaussian), the rounding's d g or sqrt(d) g allowed; None
    when they are."""
    if [(k, s, v.size) for k, s, v in mine] != [(k, s, v.size) for k, s, v in theirs]:
        return "the releases differ in kind, spread or size"
    for (kind, spread, a), (_, _, b) in zip(mine, theirs, strict=True):
        (qa, g), (qb, _) = on_grid(kind, spread, a), on_grid(kind, spread, b)
        order, slack = (1, a.size * g) if kind == "laplace" else (2, math.sqrt(a.size) * g)
        distance = float(np.linalg.norm(qa - qb, ord=order)) * g
        if not distance <= sensitivity + slack:
            return f"a {kind} release {distance:.6g} apart, above {sensitivity:.6g} + {slack:.3g}"
    return None


def fuzz(nodes: dict[str, Node], cases: Iterator[Case], run_config: dict[str, Any],
         releases: Releases | None = None, sensitivity: Callable[[str, dict[str, Any]], float] | None = None,
         answered: list[str] | None = None) -> list[str]:
    """Each case answered by every node; the names of the cases where a neighbour's answer differs from D's
    in anything but the release's values, or (given ``releases`` and ``sensitivity``, a function of the
    neighbour's name and the case's run config) where its releases are farther from D's than the
    sensitivity. ``answered`` collects the names of the cases D answered with a release (neither refused nor
    failed): the cases that reached the data, without which the check says nothing."""
    differing = []
    for name, messages, changes in cases:
        answers, made = {}, {}
        for who, node in nodes.items():
            answers[who] = node.answer(messages, run_config | changes)
            made[who] = releases.take() if releases is not None else []
        if answered is not None and all(released(a) for a in answers["D"]):
            answered.append(name)
        for who in nodes:
            if answers[who] != answers["D"]:
                differing.append(f"{name}: {who} {str(answers[who])[:300]}; D {str(answers['D'])[:300]}")
            elif sensitivity is not None:
                why = beyond_sensitivity(made["D"], made[who], sensitivity(who, run_config | changes))
                if why is not None:
                    differing.append(f"{name}: {who}: {why}")
    return differing


def identity(name: str) -> str:
    """A run identity a device stores (64 characters at most, of [0-9A-Za-z_.-])."""
    return "fuzz-" + "".join(c if c.isalnum() or c in "_.-" else "-" for c in name)[-59:]


def message(arrays: dict[str, np.ndarray] | None, settings: dict[str, Any],
            kind: str = MessageType.TRAIN) -> Message:
    records: dict[str, Any] = {"config": ConfigRecord(settings)}
    if arrays is not None:
        records["arrays"] = ArrayRecord({name: Array(value) for name, value in arrays.items()})
    return Message(RecordDict(records), dst_node_id=1, message_type=kind)


def train_message(arrays: dict[str, np.ndarray], settings: dict[str, Any]) -> Message:
    return message(arrays, settings)


ADMITTED = tuple(v for v in VALUES if abs(v) <= 2.0**40)  # the values the gate lets through


def spoiled(rng: np.random.Generator, arrays: dict[str, np.ndarray]) -> None:
    """Four entries of each array set to magnitudes of :data:`VALUES`, and noise of a random size added; half
    the time the values are those the gate admits only, and the noise keeps every entry within its bound (so
    that these messages reach the data)."""
    admitted = rng.random() >= 0.5
    values = np.array(ADMITTED if admitted else VALUES)
    for name in arrays:
        flat = arrays[name].reshape(-1)
        flat[rng.integers(0, flat.size, size=4)] = values[rng.integers(0, len(values), size=4)]
        flat += rng.normal(size=flat.size) * 10.0 ** rng.integers(-3, 3)
        if admitted:
            np.clip(flat, -(2.0**40), 2.0**40, out=flat)


def faulted(rng: np.random.Generator, arrays: dict[str, np.ndarray], config: dict[str, Any],
            rounds: int) -> int:
    """One fault of the message's form, drawn (0: none): a wrong shape, dtype, a missing or an extra array,
    a round outside the run, another partition, a bad run identity. Returns the fault's number."""
    fault = int(rng.integers(0, 9))
    name = sorted(arrays)[int(rng.integers(0, len(arrays)))]
    if fault == 1:
        shape = arrays[name].shape
        arrays[name] = np.zeros(tuple(s + int(rng.choice([-1, 1])) for s in shape) or (2,))
    elif fault == 2:
        arrays[name] = arrays[name].astype(rng.choice(["float16", "int64", "float32", "complex128"]))
    elif fault == 3:
        del arrays[name]
    elif fault == 4:
        arrays["extra"] = np.zeros(3)
    elif fault == 5:
        config["server-round"] = int(rng.choice([0, -1, rounds + 1, 2**62]))
    elif fault == 6:
        config["partition-id"] = int(rng.choice([1, -1, 9]))
    elif fault == 7:
        config[wire.IDENTITY_KEY] = str(rng.choice(["", "x" * 65, "run\x1b[2J", "a b"]))
    return fault


# ------------------------------------------------------------------------------------------ DP-IADMM
def edged_or_faulted(rng: np.random.Generator, case: int, arrays: dict[str, np.ndarray],
                     config: dict[str, Any], rounds: int) -> int:
    """Cases 0 and 1: every entry at +2**40 and -2**40, the gate's edges; later ones :func:`spoiled` with a
    fault of form (:func:`faulted`). Returns the fault's number (0: none)."""
    if case < 2:
        for value in arrays.values():
            value[...] = (-1) ** case * 2.0**40
        return 0
    spoiled(rng, arrays)
    return faulted(rng, arrays, config, rounds)


def _samples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = ((rng.random((n, J)) > 0.8) * 255).astype(np.uint8)
    x[:, DARK] = 0
    return x, rng.integers(0, K - 1, n)


def _range_edge() -> float:
    """The largest magnitude a Gaussian release of one agent's gradient holds under RUN (std = Delta / eps,
    Delta = C / I): the edge of its int64 range (dpadmm.privacy.secure)."""
    std = 1.0 / (I_TOTAL * EPSILON)
    g = secure.grid("gaussian", std, J * K)
    return (2**62 - 60 * std / g) * g


def _neighbours(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """D and its neighbours: one sample removed, added (ordinary, all bright, an out-of-range label, a
    float row with a NaN, a row far outside [0, 1]) or replaced."""
    bright = np.full((1, J), 255, np.uint8)
    floats = x.astype(np.float64) / 255
    nan_row = np.zeros((1, J))
    nan_row[0, 3] = np.nan
    huge_row = np.full((1, J), 1e300)
    return {
        "D": (x, y),
        "removed": (x[1:], y[1:]),
        "added": (np.vstack([x, x[:1]]), np.append(y, (y[0] + 1) % K)),
        "added-bright": (np.vstack([x, bright]), np.append(y, 9)),
        "added-label-12": (np.vstack([x, bright]), np.append(y, 12)),
        "added-nan": (np.vstack([floats, nan_row]), np.append(y, 0)),
        "added-huge": (np.vstack([floats, huge_row]), np.append(y, 0)),
        "replaced": (np.vstack([bright, x[1:]]), np.append(3, y[1:])),
    }


def iadmm_cases(count: int, seed: int, run: str = "") -> Iterator[Case]:
    """``count`` adversarial train messages: the fixed attacks first, then random draws over values, shapes,
    dtypes, arrays and config values. Each asks its own round of one run, ``run`` (else one named after the
    seed): a device answers a run's round once, and admits a run under one configuration only, so a call
    that asked another call's run would be refused before its data."""
    rng = np.random.default_rng(seed)
    rounds = itertools.count(1)
    names = wire.pack({role: {"weight": None} for role in wire.DOWN})

    def settings(round_: int) -> dict[str, Any]:
        return {"partition-id": 0, "server-round": round_, wire.IDENTITY_KEY: run or f"fuzz-run-{seed}"}

    def zeros() -> dict[str, np.ndarray]:
        return {name: np.zeros((J, K)) for name in names}

    overflow = zeros()  # two pixels of z at 1e308: a sample's logit overflows iff both are bright
    overflow["z.weight"][[100, 200], 0] = 1e308
    overflow["w.weight"][[100, 200], 0] = 1e308
    yield "overflow", [train_message(overflow, settings(next(rounds)))], {}
    edge = zeros()  # the regulariser 2 beta/P z exactly at the edge of the release's range on a dark pixel:
    edge["z.weight"][DARK[0], 0] = _range_edge() * (1 - 1e-12) * P / (2 * BETA)  # a bright sample crosses
    edge["w.weight"][DARK[0], 0] = edge["z.weight"][DARK[0], 0]  # (steps start at z, or at w: local-start)
    yield "range-edge", [train_message(edge, settings(next(rounds)))], {}
    nine = {name: np.zeros((J, K - 1)) for name in names}  # fewer classes than the device's largest label
    yield "nine-classes", [train_message(nine, settings(next(rounds)))], {}
    for case in range(max(0, count - 3)):
        arrays = zeros()
        spoiled(rng, arrays)
        config = settings(next(rounds))
        fault = faulted(rng, arrays, config, T)
        yield f"random-{case}-fault-{fault}", [train_message(arrays, config)], {}


def mlp_cases(count: int, seed: int, run: str = "") -> Iterator[Case]:
    """``count`` adversarial train messages for the MLP (``per-sample=auto``: the factorised clipping of the
    built-in networks): a first layer at the gate's largest admitted magnitude on the pixels only a
    neighbour has bright (its hidden units saturate), then the module's own initialisation with random
    values and faults of form, as above. Each call asks rounds of its own run (``run``, else one named after
    the seed): a device answers a run's round once."""
    rng = np.random.default_rng(seed)
    rounds = itertools.count(1)
    initial = {k: v.double().numpy() for k, v in build_model("mlp", J, K).state_dict().items()}

    def settings(round_: int) -> dict[str, Any]:
        return {"partition-id": 0, "server-round": round_, wire.IDENTITY_KEY: run or f"fuzz-mlp-{seed}"}

    def start() -> dict[str, np.ndarray]:
        return wire.pack({role: {k: v.copy() for k, v in initial.items()} for role in wire.DOWN})

    overflow = start()  # the largest weight the gate admits, on the pixels only a neighbour has bright
    for role in ("z", "w"):
        overflow[f"{role}.fc1.weight"][:, list(DARK)] = 2.0**40
    yield "mlp-overflow", [train_message(overflow, settings(next(rounds)))], {}
    for case in range(count):
        arrays = start()
        spoiled(rng, arrays)
        config = settings(next(rounds))
        fault = faulted(rng, arrays, config, T)
        yield f"mlp-random-{case}-fault-{fault}", [train_message(arrays, config)], {}


@pytest.fixture(scope="module")
def iadmm_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Node]:
    root = tmp_path_factory.mktemp("gate")
    x, y = _samples(30, 0)
    return {name: Node(root / name, {"x": x, "y": y}) for name, (x, y) in _neighbours(x, y).items()}


def iadmm_sensitivity(who: str, run: dict[str, Any]) -> float:
    """The clipped sensitivity of the run's gradient for the relation between D and ``who`` (sampling rate 1:
    a Poisson sample at q < 1 would be drawn from each device's own secret, so D's and D''s releases would
    take different samples, a difference the sampling's randomness prices, not the sensitivity)."""
    relation = "replace-one" if who == "replaced" else "add-remove"
    return clipped_sensitivity(1.0, I_TOTAL, relation, run["iadmm.sampling-rate"])


# ------------------------------------------------------------------------------------------ queries
# run configs past or at their keys' extremes, per family (cheap for the node's accountant)
RUN_EXTREMES: dict[str, list[dict[str, Any]]] = {
    "iadmm": [{"iadmm.rounds": 1}, {"iadmm.rounds": 0}, {"iadmm.rounds": 2**62}, {"iadmm.epsilon": 1e300},
              {"iadmm.epsilon": -1.0}, {"iadmm.epsilon": float("nan")}, {"iadmm.clip-norm": 5e-324},
              {"iadmm.clip-norm": 1e308}, {"iadmm.beta": 0.0}, {"iadmm.beta": 1e308},
              {"iadmm.sampling-rate": 5e-324}, {"iadmm.sampling-rate": 1.5}, {"iadmm.num-agents": 2**62},
              {"iadmm.delta": 1.0}, {"iadmm.neighbouring": "replace-one"}, {"iadmm.mechanism": "laplace"},
              {"iadmm.model": "mlp"}, {"iadmm.epsilon": 0.0, "iadmm.target-epsilon": 0.0}],
    "sharing": [{"sharing.rounds": 1}, {"sharing.rounds": 0}, {"sharing.epsilon": 1.0},
                {"sharing.epsilon": 1e-300}, {"sharing.epsilon": float("inf")}, {"sharing.epsilon": 1.5},
                {"sharing.x-bound": 1e308}, {"sharing.x-bound": 5e-324}, {"sharing.delta": 1e-300},
                {"sharing.noise": "paper"}, {"sharing.parties": "2,0"}, {"sharing.parties": "1" + ",1" * 99},
                {"sharing.l2": 1e308}, {"sharing.rho": 1e308}],
    "linadmm": [{"linadmm.rounds": 0}, {"linadmm.rounds": 2**62}, {"linadmm.eta": 1e308},
                {"linadmm.grad-bound": 5e-324}, {"linadmm.target-epsilon": float("inf")},
                {"linadmm.num-agents": 1}],
    "decentral": [{"decentral.rounds": 1}, {"decentral.rounds": 0}, {"decentral.samples": 19},
                  {"decentral.sensitivity": 1e-300}, {"decentral.sensitivity": 1e300},
                  {"decentral.noise": "none"}, {"decentral.secagg-range": 5e-324},
                  {"decentral.secagg-range": 1e308}, {"decentral.penalty": 5e-324},
                  {"decentral.noise-growth": 1e308}, {"decentral.target-epsilon": 1e-300},
                  {"decentral.exchange": "secret"}, {"decentral.agents": 2**20}, {"decentral.edges": 0}],
}


def query_cases(count: int, seed: int, family: str) -> Iterator[Case]:
    """``count`` adversarial queries: the run's own first, then config records drawn (another question,
    extra keys, arrays, run identities no device stores) with run configs at their keys' extremes."""
    rng = np.random.default_rng(seed)
    extremes = RUN_EXTREMES[family]
    for case in range(count):
        settings: dict[str, Any] = {"query": "partition-id", wire.IDENTITY_KEY: f"fuzz-query-{seed}-{case}"}
        arrays, changes = None, {}
        fault = 0 if case == 0 else int(rng.integers(0, 7))
        if fault == 1:
            settings["query"] = str(rng.choice(["data", "", "partition-id "]))
        elif fault == 2:
            settings["extra"] = float(rng.choice(VALUES))
        elif fault == 3:
            arrays = {"x": np.zeros(int(rng.integers(1, 5)))}
        elif fault == 4:
            settings[wire.IDENTITY_KEY] = str(rng.choice(["", "y" * 65, "id\x1b[31m", "a/b"]))
        elif fault == 5:
            del settings["query"]
        if case and rng.random() < 0.7:
            changes = extremes[int(rng.integers(0, len(extremes)))]
        yield f"query-{case}-fault-{fault}-{changes}", [message(arrays, settings, MessageType.QUERY)], changes


# ------------------------------------------------------------------------------------------ ADMM sharing
WIDTHS, N_SHARED = (3, 4, 2), 40
SHARING_RUN = {"algorithm": "admm-sharing", "sharing.parties": "3,4,2", "sharing.rounds": T,
               "sharing.epsilon": 1.0, "sharing.x-bound": 10.0, "sharing.rho": 1e-3}


def parties_in(root: Path) -> dict[str, Node]:
    """Party 0's file as `dpadmm deploy vertical` writes it (write_vertical_files), and its neighbours: one
    sample's features replaced (001's relation; the sample count and ids are public)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(N_SHARED + 10, sum(WIDTHS), generator=gen, dtype=torch.float64)
    y = (x.sum(dim=1) > 0).to(torch.int64)
    dataset = Dataset(name="synthetic", x_train=x[:N_SHARED], y_train=y[:N_SHARED], x_test=x[N_SHARED:],
                      y_test=y[N_SHARED:], num_classes=2)
    party = dict(np.load(write_vertical_files(dataset, WIDTHS, root / "written")[0]))
    rows = {"D": party["x"][0], "replaced": party["x"][1], "replaced-huge": np.full(WIDTHS[0], 1e300),
            "replaced-zero": np.zeros(WIDTHS[0]), "replaced-subnormal": np.full(WIDTHS[0], 5e-324),
            "replaced-overflowing": np.array([1e308, 1e308, 0.0]),
            "replaced-nan": np.array([np.nan, 0.5, 0.5])}
    nodes = {}
    for name, row in rows.items():
        x0 = party["x"].copy()
        x0[0] = row
        nodes[name] = Node(root / name, party | {"x": x0}, REPLACE_ONE)
    return nodes


@pytest.fixture(scope="module")
def sharing_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Node]:
    return parties_in(tmp_path_factory.mktemp("sharing"))


def sharing_cases(count: int, seed: int) -> Iterator[Case]:
    """Train messages of one run: each its own round t, with the party's own last message (``own``) or
    at own-round 0; the 2**40 edges first, then random draws, each with at most one fault of form."""
    rng = np.random.default_rng(seed)
    keys = (wire.PULLED_KEY, wire.DUAL_KEY, wire.OWN_KEY)
    rounds = itertools.count(1)
    for case in range(count):
        t = next(rounds)
        arrays = {key: np.zeros(N_SHARED) for key in keys}
        config = {"partition-id": 0, "server-round": t, "own-round": 0 if case % 2 else t - 1,
                  wire.IDENTITY_KEY: f"fuzz-sharing-{seed}"}
        if case < 2:  # every entry at the gate's bound, of either sign
            for key in keys:
                arrays[key][:] = (-1) ** np.arange(N_SHARED) * 2.0**40
            fault = 0
        else:
            spoiled(rng, arrays)
            fault = faulted(rng, arrays, config, T)
            if fault == 0 and rng.random() < 0.3:
                config["own-round"] = int(rng.choice([-1, t, 2**40]))
        if case % 2 and wire.OWN_KEY in arrays:
            del arrays[wire.OWN_KEY]
        yield f"sharing-{case}-fault-{fault}", [train_message(arrays, config)], {}


def sharing_evaluations(count: int, seed: int) -> Iterator[Case]:
    """A round answered, then an evaluate message on the same context (its test scores would be a
    noise-free function of the training rows)."""
    for case in range(count):
        arrays = {wire.PULLED_KEY: np.full(N_SHARED, -1.0 - case), wire.DUAL_KEY: np.ones(N_SHARED)}
        config = {"partition-id": 0, "server-round": 1, "own-round": 0,
                  wire.IDENTITY_KEY: f"fuzz-evaluate-{seed}-{case}"}
        asked = message(None, {"partition-id": 0, "server-round": [1, 0, T + 1][case % 3]},
                        MessageType.EVALUATE)
        yield f"evaluate-{case}", [train_message(arrays, config), asked], {}


def sharing_sensitivity(who: str, run: dict[str, Any]) -> float:
    """001's message sensitivity 2 b sqrt(N), for one sample replaced."""
    return message_sensitivity(N_SHARED, run["sharing.x-bound"])


# ------------------------------------------------------------------------------------------ 004
AGENTS, EDGES, SAMPLES, FEATURES = 4, 4, 20, 14
DECENTRAL_RUN = {"algorithm": "ldp-admm", "decentral.agents": AGENTS, "decentral.edges": EDGES,
                 "decentral.samples": SAMPLES, "decentral.rounds": 10, "decentral.seed": 2}


def agents_in(root: Path) -> dict[str, Node]:
    """Agent 0's file as `dpadmm deploy agents` writes it (x [b, 14] in [0, 1], y int64 0/1), and its
    neighbours: one sample replaced (004's relation; b is public)."""
    rng = np.random.default_rng(4)
    x, y = rng.random((SAMPLES, FEATURES)), rng.integers(0, 2, SAMPLES).astype(np.int64)
    rows = {"D": (x[0], y[0]), "replaced": (x[1], y[1]), "replaced-ones": (np.ones(FEATURES), 1),
            "replaced-zero": (np.zeros(FEATURES), 0), "replaced-label": (x[0], 1 - y[0]),
            "replaced-label-5": (x[1], 5), "replaced-outside": (np.full(FEATURES, 7.0), 0)}
    nodes = {}
    for name, (row, label) in rows.items():
        x0, y0 = x.copy(), y.copy()
        x0[0], y0[0] = row, label
        nodes[name] = Node(root / name, {"x": x0, "y": y0}, REPLACE_ONE)
    return nodes


@pytest.fixture(scope="module")
def decentral_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Node]:
    return agents_in(tmp_path_factory.mktemp("decentral"))


def _closed_neighbourhood() -> list[int]:
    adjacency = graphs.build("random", AGENTS, EDGES, DECENTRAL_RUN["decentral.seed"]).adjacency
    return [0, *(int(j) for j in torch.nonzero(adjacency[0]).flatten())]


def decentral_cases(count: int, seed: int) -> Iterator[Case]:
    """exchange=plain: iteration 1 or 2 of a run of its own per case, the iterates of agent 0's closed
    neighbourhood; the 2**40 edges first, then random draws with a fault of form or of the neighbours."""
    rng = np.random.default_rng(seed)
    ids = _closed_neighbourhood()
    for case in range(count):
        arrays = {wire.EXCHANGED_KEY: np.zeros((len(ids), FEATURES))}
        config: dict[str, Any] = {"partition-id": 0, "server-round": 1 + case % 2, wire.NEIGHBOURS_KEY: ids,
                                  wire.IDENTITY_KEY: f"fuzz-decentral-{seed}-{case}"}
        fault = edged_or_faulted(rng, case, arrays, config, DECENTRAL_RUN["decentral.rounds"])
        if fault == 8:
            config[wire.NEIGHBOURS_KEY] = [[0], ids[::-1], [*ids, 3], [0, 0, 0]][int(rng.integers(0, 4))]
        yield f"decentral-{case}-fault-{fault}", [train_message(arrays, config)], {}


def sum_message(total: np.ndarray | list[np.ndarray], settings: dict[str, Any]) -> Message:
    """The SecAgg+ form's fit message carrying S^{k-1}, as secaggplus_mod hands it on."""
    arrays = total if isinstance(total, list) else [total]
    content = recorddict_compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays), settings), True)
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


SECRET = {"decentral.exchange": "secret", "decentral.graph": "complete", "decentral.edges": 20}  # its default


def decentral_sums(count: int, seed: int) -> Iterator[Case]:
    """The SecAgg+ form's iteration 1: sums at SecAgg+'s range edge (a neighbour mean of twice the range in
    coordinate 0: the noisy iterate crosses it about half the time), then random draws."""
    rng = np.random.default_rng(seed)
    edge = 2 * 32.0 * (AGENTS - 1)  # secagg-range 32: the mean of the other agents' iterates at 64
    for case in range(count):
        total: np.ndarray | list[np.ndarray] = np.zeros(FEATURES)
        config = {"server-round": 1, wire.IDENTITY_KEY: f"fuzz-sum-{seed}-{case}"}
        fault = 0
        if case < 4:
            total[0] = (-1) ** case * edge
        else:
            spoiled(rng, {"sum": total})
            fault = int(rng.integers(0, 5))
            if fault == 1:
                total = np.zeros(int(rng.choice([FEATURES - 1, FEATURES + 1])))
            elif fault == 2:
                total = total.astype(rng.choice(["int64", "float16"]))
            elif fault == 3:
                total = [total, total]
            elif fault == 4:
                config["server-round"] = int(rng.choice([0, 2, 11]))
        yield f"sum-{case}-fault-{fault}", [sum_message(total, config)], SECRET


def decentral_sensitivity(who: str, run: dict[str, Any]) -> float:
    """004's: each coordinate of the update moves by at most alpha_k B_inf (B_inf = 2/b_i, one sample
    replaced; alpha_k = 1/D for Algorithm 1), d coordinates in L1 (the Laplace release), for the same
    aggregation weights: with weights=fixed (w = 1/2) in this check, since random weights come from each
    device's own secret, and Term A's randomness, not the sensitivity, prices their difference."""
    config = DecentralConfig(agents=AGENTS, edges=EDGES, samples=SAMPLES)
    return FEATURES * config.alpha(1) * config.bound


# ------------------------------------------------------------------------------------------ the tests
def test_a_neighbour_never_changes_what_the_server_sees(iadmm_nodes: dict[str, Node]) -> None:
    """DP-IADMM train messages, the issue's attacks and random ones: D and its seven neighbours answer alike
    (each answered, refused with the same text, or failed alike); the range-edge case reaches the data."""
    answered: list[str] = []
    assert fuzz(iadmm_nodes, iadmm_cases(FUZZ_CASES, 0), RUN, answered=answered) == []
    assert "range-edge" in answered


def test_a_neighbour_never_changes_what_the_server_sees_of_an_mlp(iadmm_nodes: dict[str, Node]) -> None:
    """The same for a network's train messages (the factorised per-sample clipping, per-sample=auto): D and
    its neighbours answer alike; the saturating case reaches the data and is answered."""
    run = RUN | {"iadmm.model": "mlp"}
    assert fuzz(iadmm_nodes, mlp_cases(FUZZ_CASES, 0), run) == []
    name, messages, _ = next(mlp_cases(0, 0, "fuzz-mlp-answered"))
    assert name == "mlp-overflow" and iadmm_nodes["D"].answer(messages, run)[0][1] == "completed"


def test_every_familys_query_is_answered_alike(iadmm_nodes: dict[str, Node], sharing_nodes: dict[str, Node],
                                               decentral_nodes: dict[str, Node]) -> None:
    """The query (the partition question, the run identity, the device's admission of the run) of every
    family, with adversarial config records and run configs: the same answer or refusal on D and D'."""
    for nodes, run, family in ((iadmm_nodes, RUN, "iadmm"), (sharing_nodes, SHARING_RUN, "sharing"),
                               (decentral_nodes, DECENTRAL_RUN, "decentral")):
        assert fuzz(nodes, query_cases(FUZZ_CASES, 0, family), run) == [], family


def test_sharing_parties_answer_alike(sharing_nodes: dict[str, Node]) -> None:
    """ADMM sharing's train messages (any round with its own message, or own-round 0) and evaluate messages
    after a round: answered or refused alike on D and its replace-one neighbours (a deployed party refuses
    evaluate)."""
    assert fuzz(sharing_nodes, sharing_cases(FUZZ_CASES, 0), SHARING_RUN) == []
    assert fuzz(sharing_nodes, sharing_evaluations(3, 0), SHARING_RUN) == []


def test_004_agents_answer_alike(decentral_nodes: dict[str, Node]) -> None:
    """004's exchange=plain iterations and the SecAgg+ form's sums, the range edge included: answered alike
    (a noisy iterate beyond secagg-range clamped, never refused)."""
    assert fuzz(decentral_nodes, decentral_cases(FUZZ_CASES, 0), DECENTRAL_RUN) == []
    assert fuzz(decentral_nodes, decentral_sums(FUZZ_CASES, 0), DECENTRAL_RUN) == []


# ------------------------------------------------------------------------------------------ DP-ADMM (002)
LINADMM_RUN = {"algorithm": "dp-admm", "linadmm.num-agents": 4, "linadmm.rounds": T, "linadmm.eta": 0.05}
A9A_FEATURES = 123


def _a9a_folder(source: Path, folder: Path, first: str | None) -> Path:
    """A copy of a9a's two files in ``folder`` (uncompressed), the first training row now ``first``."""
    folder.mkdir(parents=True)
    for name in ("a9a", "a9a.t"):
        with gzip.open(source / f"{name}.gz", "rt") if (source / f"{name}.gz").exists() \
                else open(source / name) as f:
            lines = f.read().splitlines()
        if name == "a9a" and first is not None:
            lines[0] = first
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def linadmm_nodes(tmp_path_factory: pytest.TempPathFactory, binary_dir: Path) -> dict[str, Node]:
    """Client 0 of DP-ADMM, which reads its rows of the configured data set (the run config's data-dir,
    here a copy per node), with one row replaced: by another row, by one whose entries overflow its norm
    (a zero row once scaled), by an all-ones row. Its operator allows central DP, so the exact sums leave."""
    root = tmp_path_factory.mktemp("linadmm")
    rows = {"D": None, "replaced": "+1 3:1 11:1 14:1 19:1 39:1 42:1 55:1 64:1 67:1 73:1 75:1 76:1 80:1 83:1",
            "replaced-huge": "-1 1:1e300 2:1e300", "replaced-ones": "+1 " + " ".join(
                f"{j}:1" for j in range(1, A9A_FEATURES + 1))}
    return {name: Node(root / name / "node", {"x": np.zeros((1, 1)), "y": np.zeros(1)},
                       POLICY + "allow-central-dp = true\n",
                       run={"linadmm.data-dir": str(_a9a_folder(binary_dir / "a9a", root / name / "a9a",
                                                                row))},
                       **{"num-partitions": LINADMM_RUN["linadmm.num-agents"]})
            for name, row in rows.items()}


def linadmm_cases(count: int, seed: int) -> Iterator[Case]:
    """DP-ADMM's train messages: the point x of each iteration, the 2**40 edges first, then random draws
    with a fault of form."""
    rng = np.random.default_rng(seed)
    for case in range(count):
        arrays = {wire.POINT_KEY: np.zeros(A9A_FEATURES)}
        config: dict[str, Any] = {"partition-id": 0, "server-round": 1 + case,
                                  wire.IDENTITY_KEY: f"fuzz-linadmm-{seed}"}
        fault = edged_or_faulted(rng, case, arrays, config, T)
        yield f"linadmm-{case}-fault-{fault}", [train_message(arrays, config)], {}


@pytest.mark.slow  # 7 s: four copies of a9a read
def test_dp_admm_clients_answer_alike(linadmm_nodes: dict[str, Node]) -> None:
    """DP-ADMM sends exact clipped gradient sums to a server its operator trusts (central DP): the values
    differ by design, but whether and what the client answers (answered, refused or failed, its text,
    shapes and metrics) does not, for any point the server sends; and by default the device refuses the run
    at its query, alike on every node."""
    assert fuzz(linadmm_nodes, linadmm_cases(FUZZ_CASES, 0), LINADMM_RUN) == []
    default = {name: Node(node.state.parent.parent / "default", {"x": np.zeros((1, 1)), "y": np.zeros(1)},
                          POLICY, run=node.run, **{"num-partitions": 4})
               for name, node in linadmm_nodes.items()}
    assert fuzz(default, query_cases(FUZZ_CASES, 0, "linadmm"), LINADMM_RUN) == []


def test_releases_stay_within_the_stated_sensitivity(iadmm_nodes: dict[str, Node],
                                                     sharing_nodes: dict[str, Node],
                                                     decentral_nodes: dict[str, Node],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """For the same message, D's and each neighbour's value before the noise (as the grid rounds and clamps
    it) are within the family's sensitivity for their relation, plus the grid's rounding: DP-IADMM's clipped
    sensitivity (sampling rate 1, see iadmm_sensitivity), 001's 2 b sqrt(N), 004's d alpha_k B_inf."""
    releases = Releases(monkeypatch)
    answered: list[str] = []
    assert fuzz(iadmm_nodes, iadmm_cases(FUZZ_CASES, 4), RUN | {"iadmm.seed": 4}, releases,
                iadmm_sensitivity, answered) == []
    assert "range-edge" in answered  # releases were made and compared
    assert fuzz(sharing_nodes, sharing_cases(FUZZ_CASES, 4), SHARING_RUN | {"sharing.seed": 4}, releases,
                sharing_sensitivity) == []
    fixed = DECENTRAL_RUN | {"decentral.weights": "fixed"}  # see decentral_sensitivity
    assert fuzz(decentral_nodes, itertools.chain(decentral_cases(FUZZ_CASES, 4), decentral_sums(2, 4)), fixed,
                releases, decentral_sensitivity) == []


@pytest.mark.slow
def test_a_long_fuzz_finds_no_difference_in_dpiadmm(iadmm_nodes: dict[str, Node]) -> None:
    answered: list[str] = []
    assert fuzz(iadmm_nodes, iadmm_cases(400, 1), RUN | {"iadmm.seed": 1}, answered=answered) == []
    assert sum(name.endswith("-fault-0") for name in answered) >= 20  # random messages reached the data
    assert fuzz(iadmm_nodes, query_cases(40, 1, "iadmm"), RUN) == []


@pytest.mark.slow
def test_a_long_fuzz_finds_no_difference_for_an_mlp(iadmm_nodes: dict[str, Node]) -> None:
    assert fuzz(iadmm_nodes, mlp_cases(100, 1), RUN | {"iadmm.model": "mlp", "iadmm.seed": 1}) == []


@pytest.mark.slow
def test_a_long_fuzz_finds_no_difference_in_sharing(sharing_nodes: dict[str, Node]) -> None:
    assert fuzz(sharing_nodes, sharing_cases(200, 1), SHARING_RUN | {"sharing.seed": 1}) == []
    assert fuzz(sharing_nodes, sharing_evaluations(12, 1), SHARING_RUN) == []
    assert fuzz(sharing_nodes, query_cases(40, 1, "sharing"), SHARING_RUN) == []


@pytest.mark.slow
def test_a_long_fuzz_finds_no_difference_in_004(decentral_nodes: dict[str, Node]) -> None:
    assert fuzz(decentral_nodes, decentral_cases(200, 1), DECENTRAL_RUN) == []
    assert fuzz(decentral_nodes, decentral_sums(200, 1), DECENTRAL_RUN) == []
    assert fuzz(decentral_nodes, query_cases(40, 1, "decentral"), DECENTRAL_RUN) == []


def test_the_fixed_attacks_are_answered_or_refused_by_the_gate(iadmm_nodes: dict[str, Node]) -> None:
    """The overflow message (entries of 1e308) is refused by the gate, which admits magnitudes up to 2**40
    (with the gate undone, total clipping answers it: test_the_fuzzer_catches_each_fix_undone); the
    range-edge message is answered (a clamped release); a w of nine classes is refused naming the server's
    shape and the run's."""
    node = iadmm_nodes["D"]
    answers = {name: node.answer(asked, RUN | {"iadmm.seed": 2})[0] for name, asked, _ in iadmm_cases(3, 2)}
    assert "magnitude 1e+308" in answers["overflow"][5]["config"][wire.REFUSED_KEY]
    assert released(answers["range-edge"])
    refused = answers["nine-classes"][5]["config"][wire.REFUSED_KEY]
    assert "[784, 9]" in refused and "[784, 10]" in refused


def _unguarded(mp: pytest.MonkeyPatch) -> None:
    """The gate lets any value through and clipping is not total (on the torch path, as on a machine
    without a C compiler: the fused kernel's total clipping is compiled in)."""
    mp.setattr(gate, "MAX_ABS", float("inf"))
    mp.setattr(gate, "MAX_RELEASE", float("inf"))
    mp.setattr(logistic, "total_clip_factors", lambda clip, norms: (clip / norms).clamp(max=1.0))
    mp.setattr(logistic, "clipped_terms", lambda residual, factors: residual * factors.unsqueeze(-1))
    mp.setattr(native, "column_blocks", lambda *args, **kwargs: None)


def _refusing_clip(values: np.ndarray, low: float, high: float) -> np.ndarray:
    if np.abs(values).max() > high:
        raise ValueError("value is too large for a release")
    return values


def _refusing_range(mp: pytest.MonkeyPatch) -> None:
    """004's deployed agent refuses (as a simulated one) an iterate beyond secagg-range instead of clamping
    it (the simulation kind's rule): whether it answers is then decided by its noisy iterate."""
    mp.setattr(clients.decentral, "DEPLOYMENT", "no kind")


def _unbounded_x_step(mp: pytest.MonkeyPatch) -> None:
    """001's x-step minimised over all x_m, not over the ball of x-bound (its trust region and the
    projection onto_ball after it undone)."""
    real = sharing_updates.x_step
    mp.setattr(sharing_updates, "x_step", lambda geo, target, y, rho, l2, bound:
               real(geo, target, y, rho, l2, math.inf))


@dataclass(frozen=True)
class Mutant:
    """A fix undone, and the fuzz that must catch it."""

    undo: Callable[[pytest.MonkeyPatch], None]
    family: str
    sensitivity: bool = False  # caught by the releases' distance (else by what the server sees)


MUTANTS: dict[str, Mutant] = {
    "gate and clipping": Mutant(_unguarded, "iadmm"),
    # the release refuses a value for its size
    "release range": Mutant(lambda mp: mp.setattr(secure.np, "clip", _refusing_clip), "iadmm"),
    # rows outside the classes refused, not dropped
    "rows": Mutant(lambda mp: mp.setattr("dpadmm.data.node.sound_rows",
                                         lambda x, y, k: np.ones(len(y), bool)), "iadmm"),
    # a sharing party's x-step not held to its ball ||x_m|| <= b: its message beyond 2 b sqrt(N)
    "sharing ball": Mutant(_unbounded_x_step, "sharing", sensitivity=True),
    # a deployed party answers evaluate: its test scores, noise-free
    "sharing evaluate": Mutant(lambda mp: mp.setattr(gate, "node_kind", lambda node_config: "simulation"),
                               "sharing-evaluate"),
    # 004's SecAgg+ range refused on the noisy iterate, not clamped
    "004 range": Mutant(_refusing_range, "decentral-sum"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_fuzzer_catches_each_fix_undone(mutant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """Undo one fix: the fuzzer finds a message on which D and a neighbour differ, or releases farther apart
    than the sensitivity."""
    chosen = MUTANTS[mutant]
    releases = Releases(monkeypatch) if chosen.sensitivity else None
    if chosen.family == "iadmm":
        x, y = _samples(30, 0)
        nodes = {name: Node(tmp_path / name, {"x": a, "y": b}) for name, (a, b) in _neighbours(x, y).items()}
        runs: tuple[Any, ...] = (nodes, iadmm_cases(3, 0), RUN | {"iadmm.seed": 3})
    elif chosen.family.startswith("sharing"):
        nodes = parties_in(tmp_path)
        cases = sharing_evaluations(3, 3) if chosen.family == "sharing-evaluate" else sharing_cases(2, 3)
        runs = (nodes, cases, SHARING_RUN | {"sharing.seed": 3})
    else:
        nodes = agents_in(tmp_path)
        runs = (nodes, decentral_sums(4, 3), DECENTRAL_RUN)
    chosen.undo(monkeypatch)
    sensitivity = {"iadmm": iadmm_sensitivity, "sharing": sharing_sensitivity}.get(chosen.family)
    assert fuzz(*runs, releases, sensitivity if chosen.sensitivity else None) != []


def test_sound_rows_judge_each_row_alone() -> None:
    x = np.array([[0.0, 1.0], [np.nan, 0.0], [0.5, 2.0], [0.2, 0.2]])
    y = np.array([1, 0, 0, 12])
    assert sound_rows(x, y, 10).tolist() == [True, False, False, False]
    assert sound_rows(x[:1], np.array([1.5]), 10).tolist() == [False]


def test_the_gate_refuses_by_what_the_server_sent() -> None:
    shapes = {"a": (2,)}
    for bad, said in ((np.array([np.nan, 0.0]), "non-finite"), (np.array([2.0**41, 0.0]), r"2\*\*40"),
                      (np.zeros(3), r"shape \[3\]"), (np.zeros(2, np.int64), "int64")):
        with pytest.raises(DeviceRefused, match=said):
            gate.arrays(ArrayRecord({"a": Array(bad)}), shapes)
    with pytest.raises(DeviceRefused, match="carries \\['a'\\]"):
        gate.arrays(ArrayRecord({"b": Array(np.zeros(2))}), shapes)
    assert gate.arrays(ArrayRecord({"a": Array(np.ones(2))}), shapes)["a"].tolist() == [1.0, 1.0]
    with pytest.raises(DeviceRefused, match="server-round=0 is not allowed"):
        gate.integer({"server-round": 0}, "server-round", 1, 5)
    with pytest.raises(DeviceRefused, match="an integer in 1..5"):
        gate.integer({"server-round": True}, "server-round", 1, 5)


def test_a_deployed_party_refuses_evaluate_before_it_reads_anything() -> None:
    asked = Message(RecordDict({"config": ConfigRecord({"server-round": 1, "partition-id": 0})}),
                    dst_node_id=1, message_type=MessageType.EVALUATE)
    with pytest.raises(DeviceRefused, match="noise-free function of its training rows"):
        gate.check_evaluate(asked, {"randomness": "deployment"}, object())


def test_total_clipping_keeps_a_gradient_finite_on_extreme_inputs() -> None:
    """The overflow attack on the oracle itself, both kernels: finite, each term within C."""
    x, y = _samples(20, 1)
    for fused in (True, False):
        data = logistic.AgentData.from_blocks([torch.from_numpy(x / 255.0)], [torch.from_numpy(y)],
                                              num_classes=K, total=20, agents=[0])
        if not fused:
            data.__dict__["blocks"] = None  # the torch definition instead of the fused kernel
        z = torch.zeros(1, J, K, dtype=torch.float64)
        z[0, [100, 200], 0] = 1e308
        g = logistic.gradient(data, z, scale=1 / 20, reg=0.0, clip=1.0, norm="l1")
        assert torch.isfinite(g).all() and float(g.abs().sum()) <= 1.0 + 1e-12
