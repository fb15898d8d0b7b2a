"""The task the three methods train, and the run config they read.

A 2-layer MLP (64 -> 32 -> 10, ReLU; 2,410 parameters) on scikit-learn's 8 x 8 digits: 1,437
training images cut into one contiguous block per client, 360 test images held by the server.
Everything here is the app's own (dpadmm knows neither the network nor the data); the methods' modules
(:mod:`digits_app.dpiadmm`, :mod:`digits_app.dpsgd`, :mod:`digits_app.dpfedavg`) hold only what differs
between them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Message, MetricRecord
from sklearn.datasets import load_digits
from torch import nn

from dpadmm.iadmm.config import RunConfig
from dpadmm.models.modules import logits_of

METHODS = ("dpiadmm", "dp-fedavg", "dp-sgd")


class Net(nn.Module):
    """64 -> 32 -> 10 with a ReLU: no buffers, so that per-sample gradients are well defined."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@lru_cache(maxsize=1)
def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): pixels / 16, shuffled once with seed 0, 1,437 / 360."""
    raw = load_digits()
    x = torch.tensor(raw.data, dtype=torch.float32) / 16.0
    y = torch.tensor(raw.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return x[:1437], y[:1437], x[1437:], y[1437:]


def client_block(node_config: Mapping[str, Any], config: RunConfig) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(partition id, x, y) of this client: its contiguous block of the shuffled training set.

    Flower's simulation gives each SuperNode ``partition-id`` and ``num-partitions``; the blocks must be
    the ``num-agents`` the server plans for, or every method would train and account for other clients.
    """
    partition_id, num_partitions = int(node_config["partition-id"]), int(node_config["num-partitions"])
    if num_partitions != config.num_agents:
        agents = config.num_agents
        raise ValueError(f"the federation has {num_partitions} SuperNodes but num-agents={agents}; run "
                         f"with --federation-config \"num-supernodes={agents}\"")
    x, y, _, _ = data()
    block = torch.tensor_split(torch.arange(len(y)), num_partitions)[partition_id]
    return partition_id, x[block], y[block]


def accuracy(arrays: ArrayRecord) -> float:
    """Test accuracy of the model ``arrays`` on the server's 360 images."""
    _, _, x_test, y_test = data()
    w = {name: torch.from_numpy(array.numpy()) for name, array in arrays.items()}
    with torch.no_grad():
        return (logits_of(Net(), w, x_test).argmax(dim=1) == y_test).float().mean().item()


@dataclass(frozen=True)
class AppSettings:
    """This app's own keys (the ``[tool.flwr.app.config]`` entries that are not dpadmm's)."""

    method: str = "dpiadmm"
    fedavg_clip: float = 1.0
    fedavg_lr: float = 0.1
    fedavg_epochs: int = 5
    fedavg_batch: int = 32
    dpsgd_lr: float = 1.0

    def __post_init__(self) -> None:
        """Refuse what no run can use, before any round: a negative step would make every client raise, and
        the run would end "completed" with the untrained model."""
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not one of {', '.join(METHODS)}")
        for key in ("fedavg-clip", "fedavg-lr", "dpsgd-lr"):
            value = getattr(self, key.replace("-", "_"))
            if not 0 < value < math.inf:
                raise ValueError(f"{key}={value!r} is not allowed: give a finite number > 0")
        for key in ("fedavg-epochs", "fedavg-batch"):
            value = getattr(self, key.replace("-", "_"))
            if value < 1:
                raise ValueError(f"{key}={value!r} is not allowed: give an integer >= 1")


APP_KEYS = {"method": str, "fedavg-clip": float, "fedavg-lr": float, "fedavg-epochs": int,
            "fedavg-batch": int, "dpsgd-lr": float}


def _typed(key: str, value: Any) -> Any:
    """``value`` as ``APP_KEYS[key]`` says: a float key takes an integer too (``fedavg-lr=1``); nothing else
    is converted (``fedavg-epochs=2.5`` would silently become 2)."""
    kind = APP_KEYS[key]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str and isinstance(value, str) or kind is int and number and isinstance(value, int) or \
            kind is float and number:
        return kind(value)
    wanted = {str: "a string", int: "an integer", float: "a number"}[kind]
    raise ValueError(f"{key}={value!r} is not allowed: give {wanted}")


class StopsWhenEveryReplyFails:
    """A strategy mixin (before Flower's strategy in the bases) that ends the run when every client's reply
    in a round is an error, naming the first: a fault all clients repeat (a setting none can train with)
    would otherwise leave the model untrained while the run ends "completed", as Flower's FedAvg and its
    DP wrappers go on past failed replies. dpadmm's strategy stops likewise."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        failed = [reply for reply in replies if reply.has_error()]
        if replies and len(failed) == len(replies):
            raise RuntimeError(f"round {server_round}: every client's reply failed ({len(failed)} of "
                               f"{len(replies)}; the first: {failed[0].error.reason}); the run stops")
        return super().aggregate_train(server_round, replies)  # type: ignore[misc]  (the strategy's)


def settings(run_config: Mapping[str, Any]) -> tuple[RunConfig, AppSettings]:
    """(dpadmm's RunConfig, this app's settings): RunConfig rejects keys it does not know, so ours go first.

    Every method reads the budget (``target-epsilon``, ``delta``), ``rounds``, ``num-agents`` and ``seed``
    from RunConfig, and DP-SGD also its local steps, sampling rate and clipping norm, so that they are held
    to the same figures as DP-IADMM.
    """
    own = {key.replace("-", "_"): _typed(key, run_config[key]) for key in APP_KEYS if key in run_config}
    config = RunConfig.from_mapping({k: v for k, v in run_config.items() if k not in APP_KEYS})
    return config, AppSettings(**own)


class Results:
    """The run's results file: the settings, per round the test accuracy and the seconds elapsed since the
    server started, and the privacy statement; rewritten after every round, so that an interrupted run
    keeps its rounds."""

    def __init__(self, config: RunConfig, own: AppSettings) -> None:
        self.path = Path(config.out or f"runs/digits_app/{own.method}-seed{config.seed}.json").resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.perf_counter()
        self.record: dict[str, Any] = {"method": own.method, "app": asdict(own),
                                       "config": config.to_mapping(), "rounds": []}

    def add_round(self, server_round: int, arrays: ArrayRecord, **extra: Any) -> float:
        """Evaluate the model after ``server_round`` and record it; returns its test accuracy."""
        value = accuracy(arrays)
        self.record["rounds"].append({"round": server_round, "accuracy": value,
                                      "elapsed": time.perf_counter() - self.started, **extra})
        self.write()
        return value

    def write(self, **fields: Any) -> None:
        self.record.update(fields)
        self.path.write_text(json.dumps(self.record, indent=1))
