"""The device's gate (clients.gate) proven by a neighbour fuzzer: server messages drawn adversarially are
answered by the real node code (clients.runtime.answer, the path of `dpadmm node serve`) on a device holding
D and on devices holding each kind of neighbour D'; everything but the release's noisy values must be equal:
answered / refused / failed, the text, the arrays' names, dtypes and shapes, the metrics. Mutants (a fix
undone) must be caught.

The not-slow set runs a short fuzz; the full suite a long one (FUZZ_CASES)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from clients import gate, runtime
from dpadmm import native, wire
from dpadmm.data.node import sound_rows
from dpadmm.models import logistic
from dpadmm.privacy import secure
from dpadmm.privacy.device import DeviceRefused

J, K, I_TOTAL, T = 784, 10, 400, 1000
P, BETA = 10, 1.0
RUN = {"algorithm": "objp", "iadmm.rounds": T, "iadmm.num-agents": P, "iadmm.local-steps": 1,
       "iadmm.target-epsilon": 0.0, "iadmm.epsilon": 1.0, "iadmm.sampling-rate": 1.0, "iadmm.beta": BETA}
DARK = (100, 200)  # pixels no sample of D has bright: the attacks below single out a neighbour that has
POLICY = "max-run-epsilon = 1e12\nmax-run-delta = 0.5\nlifetime-epsilon = 1e15\nlifetime-delta = 1e9\n"
# magnitudes a malicious server sends: the edges of float64, of the gate's bound and of the release's range
VALUES = (0.0, 1.0, -3.5, 5e-324, 2.0**40, -(2.0**40), 2.0**40 * (1 + 2**-52), 1e20, 1e308, -1e308,
          float("nan"), float("inf"), float("-inf"))


def _samples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = ((rng.random((n, J)) > 0.8) * 255).astype(np.uint8)
    x[:, DARK] = 0
    return x, rng.integers(0, K - 1, n)


def _range_edge() -> float:
    """The largest magnitude a Gaussian release of one agent's gradient holds under RUN (std = Delta / eps,
    Delta = C / I): the edge of its int64 range (dpadmm.privacy.secure)."""
    std = 1.0 / I_TOTAL
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


class Node:
    """A deployed device (its own state folder, policy and data file) answered through the runtime's path."""

    def __init__(self, folder: Path, x: np.ndarray, y: np.ndarray) -> None:
        folder.mkdir(parents=True)
        np.savez(folder / "data.npz", x=x, y=y)
        state = folder / "state"
        state.mkdir()
        (state / "policy.toml").write_text(POLICY)
        self.node_config = {"partition-id": 0, "data-path": str(folder / "data.npz"),
                            "num-samples-total": I_TOTAL, "randomness": "deployment", "state-dir": str(state)}

    def answer(self, message: Message, run_config: dict[str, Any]) -> tuple[Any, ...]:
        context = Context(run_id=1, node_id=1, node_config=self.node_config, state=RecordDict(),
                          run_config=run_config)
        reply, status, details = runtime.answer(message, context, runtime.APP_ID, runtime.installed_version())
        return seen(reply, status, details)


def seen(reply: Message, status: str, details: str) -> tuple[Any, ...]:
    """What the server sees of a reply, but the release's noisy values."""
    if reply.has_error():
        return ("error", status, details, reply.error.reason)
    content = reply.content
    arrays = {name: (a.dtype, tuple(a.shape)) for name, record in content.array_records.items()
              for name, a in record.items()}
    metrics = {k: dict(v) for k, v in content.metric_records.items()}
    configs = {k: dict(v) for k, v in content.config_records.items()}
    return ("reply", status, details, sorted(arrays.items()), metrics, configs)


def train_message(arrays: dict[str, np.ndarray], settings: dict[str, Any]) -> Message:
    record = ArrayRecord({name: Array(value) for name, value in arrays.items()})
    return Message(RecordDict({"arrays": record, "config": ConfigRecord(settings)}), dst_node_id=1,
                   message_type=MessageType.TRAIN)


def iadmm_cases(count: int, seed: int) -> Iterator[tuple[str, Message]]:
    """``count`` adversarial train messages: the fixed attacks first, then random draws over values, shapes,
    dtypes, arrays and config values. Each asks its own round of one run (a round answered once)."""
    rng = np.random.default_rng(seed)
    rounds = itertools.count(1)
    names = wire.pack({role: {"weight": None} for role in wire.DOWN})

    def settings(round_: int) -> dict[str, Any]:
        return {"partition-id": 0, "server-round": round_, wire.IDENTITY_KEY: "fuzz-run"}

    def zeros() -> dict[str, np.ndarray]:
        return {name: np.zeros((J, K)) for name in names}

    overflow = zeros()  # two pixels of z at 1e308: a sample's logit overflows iff both are bright
    overflow["z.weight"][[100, 200], 0] = 1e308
    overflow["w.weight"][[100, 200], 0] = 1e308
    yield "overflow", train_message(overflow, settings(next(rounds)))
    edge = zeros()  # the regulariser 2 beta/P z exactly at the edge of the release's range on a dark pixel:
    edge["z.weight"][DARK[0], 0] = _range_edge() * P / (2 * BETA)  # a sample with it bright crosses it
    yield "range-edge", train_message(edge, settings(next(rounds)))
    nine = {name: np.zeros((J, K - 1)) for name in names}  # fewer classes than the device's largest label
    yield "nine-classes", train_message(nine, settings(next(rounds)))
    for case in range(max(0, count - 3)):
        arrays = zeros()
        for name in arrays:
            picks = rng.integers(0, len(VALUES), size=4)
            flat = arrays[name].reshape(-1)
            flat[rng.integers(0, flat.size, size=4)] = np.array(VALUES)[picks]
            flat += rng.normal(size=flat.size) * 10.0 ** rng.integers(-3, 3)
        fault = rng.integers(0, 8)
        round_ = next(rounds)
        config = settings(round_)
        if fault == 1:
            arrays["w.weight"] = arrays["w.weight"][:, : int(rng.integers(1, K))]
        elif fault == 2:
            dtype = rng.choice(["float16", "int64", "float32"])
            arrays["lambda.weight"] = arrays["lambda.weight"].astype(dtype)
        elif fault == 3:
            del arrays["z.weight"]
        elif fault == 4:
            arrays["extra.weight"] = np.zeros(3)
        elif fault == 5:
            config["server-round"] = int(rng.choice([0, -1, T + 1, 2**62]))
        elif fault == 6:
            config["partition-id"] = int(rng.choice([1, -1, 9]))
        yield f"random-{case}-fault-{fault}", train_message(arrays, config)


@pytest.fixture(scope="module")
def iadmm_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Node]:
    root = tmp_path_factory.mktemp("gate")
    x, y = _samples(30, 0)
    return {name: Node(root / name, *data) for name, data in _neighbours(x, y).items()}


def fuzz(nodes: dict[str, Node], cases: Iterator[tuple[str, Message]], run_config: dict[str, Any]
         ) -> list[str]:
    """Each case answered by every node; the names of the cases where a neighbour's answer differs from D's
    in anything but the release's values."""
    differing = []
    for name, message in cases:
        answers = {who: node.answer(message, run_config) for who, node in nodes.items()}
        if any(answer != answers["D"] for answer in answers.values()):
            differing.append(f"{name}: " + "; ".join(f"{who} {str(a)[:160]}" for who, a in answers.items()
                                                     if a != answers["D"])
                             + f"; D {str(answers['D'])[:160]}")
    return differing


FUZZ_CASES = int(os.environ.get("DPADMM_FUZZ_CASES", "6"))
pytestmark = pytest.mark.usefixtures("server_process")  # replies are built as a node's runtime builds them


def test_a_neighbour_never_changes_what_the_server_sees(iadmm_nodes: dict[str, Node]) -> None:
    """DP-IADMM train messages, the issue's attacks and random ones: D and its seven neighbours answer alike
    (each answered, refused with the same text, or failed alike)."""
    assert fuzz(iadmm_nodes, iadmm_cases(FUZZ_CASES, 0), RUN) == []


@pytest.mark.slow
def test_a_long_fuzz_finds_no_difference(iadmm_nodes: dict[str, Node]) -> None:
    assert fuzz(iadmm_nodes, iadmm_cases(400, 1), RUN | {"iadmm.seed": 1}) == []


def test_the_fixed_attacks_are_answered_or_refused_by_the_gate(iadmm_nodes: dict[str, Node]) -> None:
    """The overflow and range-edge messages are answered (total clipping, a clamped release); a w of nine
    classes is refused naming the server's shape and the run's."""
    node = iadmm_nodes["D"]
    answers = {name: node.answer(message, RUN | {"iadmm.seed": 2}) for name, message in iadmm_cases(3, 2)}
    assert answers["overflow"][0] == "reply" and answers["range-edge"][0] == "reply"
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


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "gate and clipping": _unguarded,
    # the release refuses a value for its size
    "release range": lambda mp: mp.setattr(secure.np, "clip", _refusing_clip),
    # rows outside the classes refused, not dropped
    "rows": lambda mp: mp.setattr("dpadmm.data.node.sound_rows", lambda x, y, k: np.ones(len(y), bool)),
}


def _refusing_clip(values: np.ndarray, low: float, high: float) -> np.ndarray:
    if np.abs(values).max() > high:
        raise ValueError("value is too large for a release")
    return values


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_fuzzer_catches_each_fix_undone(mutant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """Undo one fix: the fuzzer finds a message on which D and a neighbour differ."""
    x, y = _samples(30, 0)
    nodes = {name: Node(tmp_path / name, *data) for name, data in _neighbours(x, y).items()}
    MUTANTS[mutant](monkeypatch)
    assert fuzz(nodes, iadmm_cases(3, 0), RUN | {"iadmm.seed": 3}) != []


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
    message = Message(RecordDict({"config": ConfigRecord({"server-round": 1, "partition-id": 0})}),
                      dst_node_id=1, message_type=MessageType.EVALUATE)
    with pytest.raises(DeviceRefused, match="noise-free function of its training rows"):
        gate.check_evaluate(message, {"randomness": "deployment"}, object())


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
