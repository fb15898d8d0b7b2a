"""FEMNIST from Flower Datasets (``flwrlabs/femnist`` on the Hugging Face Hub), one agent per writer.

This is the path for users who are online and have no LEAF JSON files: Flower Datasets
downloads the data once (into the Hugging Face cache) and partitions it by writer. The
result has the layout of :func:`dpadmm.data.femnist.load_femnist`, so everything
downstream (the natural partition, the pooled test set) works unchanged:

- agents are writers; NaturalIdPartitioner numbers them by their sorted ``writer_id``
  and agent ``i`` is partition ``i``, so ``num_agents=P`` takes the first P writer ids;
- each writer's samples are split 90/10 into train and test, like LEAF's per-writer split;
- the training set is the writers' train parts one after another (``agent_sizes``,
  ``agent_names``), the test set the same writers' test parts, pooled;
- pixels are ``1 - pixel / 255`` (background 0), labels 0..61 (digits, upper, lower case).

``flwrlabs/femnist`` holds the whole of FEMNIST (814,277 images of 3,597 writers), not
LEAF's 5% sample that the papers used, so its first 195 writers are not the papers'
writers; results on it are a reconstruction of the papers' setting, not a replication.

``flwr-datasets`` (and ``datasets`` with it) is imported only inside :func:`load_flwr_femnist`, so
``import dpadmm.data`` stays light.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dpadmm.data import Dataset
from dpadmm.data.checks import DataError, require_keys, require_labels
from dpadmm.data.femnist import FEMNIST_NUM_CLASSES

__all__ = ["FLWR_FEMNIST", "load_flwr_femnist"]

FLWR_FEMNIST = "flwrlabs/femnist"
COLUMNS = ("image", "writer_id", "character")
_LAYOUT = "a train split with the columns image (28x28 grayscale), writer_id and character (labels 0..61)"

_SIDE = 28


def load_flwr_femnist(
    num_agents: int = 195,
    *,
    seed: int = 42,
    dataset: str = FLWR_FEMNIST,
    test_fraction: float = 0.1,
    **load_dataset_kwargs: Any,
) -> Dataset:
    """FEMNIST from Flower Datasets with one agent per writer: the first ``num_agents`` writer ids.

    The data come from ``flwr_datasets.FederatedDataset(dataset=dataset, partitioners=
    {"train": NaturalIdPartitioner(partition_by="writer_id")}, seed=seed,
    **load_dataset_kwargs)``; ``load_dataset_kwargs`` go on to ``datasets.load_dataset``
    (e.g. ``cache_dir=...``, or ``dataset="parquet", data_files={"train": ...}`` for a
    local copy). The data set needs one split ``"train"`` with the columns ``image``
    (28x28 grayscale), ``writer_id`` (str) and ``character`` (labels 0..61).

    Writers are numbered by sorted ``writer_id`` (as NaturalIdPartitioner does), and agent
    ``i`` is writer ``i``. Each writer's samples are split by
    ``partition.train_test_split(test_size=test_fraction, seed=seed)``: the test part has
    ``ceil(test_fraction * n)`` of the writer's ``n`` samples, as LEAF's per-writer 90/10
    split (LEAF's own cut of a writer is not reproduced: the Hub data has no split). A
    writer too small to keep a training sample that way (fewer than 2 samples at the
    default 0.1) keeps all its samples in train and adds none to the test set, so that
    every agent has data.

    The training set is the writers' train parts one after another (``agent_sizes`` their
    sizes, ``agent_names`` the writer ids, so the natural partition gives each agent its
    writer); the test set is the same writers' test parts, pooled, as the authors' code
    pools them. ``seed`` fixes both FederatedDataset's shuffle and the per-writer splits,
    so the result is the same for the same seed and data.

    Pixels: the images are stored as 0..255; this function assumes they keep LEAF's
    polarity (background white, 255 = LEAF's 1.0; the Hub card does not state it) and
    returns ``x = 1 - pixel / 255``, the authors' convention that
    :func:`dpadmm.data.femnist.load_femnist` also follows (background 0, as in MNIST).

    Raises ``ValueError`` for a ``num_agents`` outside 1..(number of writers) (naming that
    number) or a ``test_fraction`` outside (0, 1), and a
    :class:`~dpadmm.data.checks.DataError` naming the data set and the writer for a missing
    column, an image that is not 28x28 or a label outside 0..61.
    """
    if isinstance(num_agents, bool) or not isinstance(num_agents, int):
        raise ValueError(f"num_agents must be an int, got {num_agents!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} is not allowed; choose a value in (0, 1)")
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import NaturalIdPartitioner

    fds = FederatedDataset(
        dataset=dataset,
        partitioners={"train": NaturalIdPartitioner(partition_by="writer_id")},
        seed=seed,
        **load_dataset_kwargs,
    )
    partitioner = fds.partitioners["train"]  # loads (downloads once) and shuffles the data
    files = load_dataset_kwargs.get("data_files")
    source = dataset if files is None else f"{dataset} data_files={files!r}"  # how errors name the data
    require_keys(partitioner.dataset.column_names, COLUMNS, source, _LAYOUT, what="column(s)")
    available = partitioner.num_partitions
    if not 1 <= num_agents <= available:
        raise ValueError(f"num_agents={num_agents} is not allowed for {dataset}: it has {available} "
                         f"writers (1..{available})")
    writer_ids = partitioner.partition_id_to_natural_id

    names: list[str] = []
    train_x: list[np.ndarray] = []
    train_y: list[np.ndarray] = []
    test_x: list[np.ndarray] = []
    test_y: list[np.ndarray] = []
    for agent in range(num_agents):
        partition = fds.load_partition(agent, "train")
        n = len(partition)
        names.append(str(writer_ids[agent]))
        if n - math.ceil(test_fraction * n) < 1:  # train_test_split would leave train empty
            train, test = partition, None
        else:
            parts = partition.train_test_split(test_size=test_fraction, seed=seed)
            train, test = parts["train"], parts["test"]
        for part, xs, ys in ((train, train_x, train_y), (test, test_x, test_y)):
            if part is not None:
                xs.append(_pixels(part["image"], source, names[-1]))
                ys.append(require_labels(np.asarray(part["character"]), FEMNIST_NUM_CLASSES, source,
                                         "character", lambda i: f"writer {names[-1]}, sample {i[0]}"))

    def features(parts: list[np.ndarray]) -> torch.Tensor:
        if not parts:
            return torch.zeros((0, _SIDE * _SIDE), dtype=torch.float64)
        return torch.from_numpy(1.0 - np.concatenate(parts).astype(np.float64) / 255.0)

    def labels(parts: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))

    return Dataset(
        name="femnist",
        x_train=features(train_x),
        y_train=labels(train_y),
        x_test=features(test_x),
        y_test=labels(test_y),
        num_classes=FEMNIST_NUM_CLASSES,
        agent_sizes=tuple(int(y.shape[0]) for y in train_y),
        agent_names=tuple(names),
    )


def _pixels(images: Any, source: str, writer: str) -> np.ndarray:
    """The decoded images (PIL) as uint8 ``[n, 784]``, converted to grayscale where needed."""
    rows = []
    for i, image in enumerate(images):
        array = np.asarray(image if image.mode == "L" else image.convert("L"), dtype=np.uint8)
        if array.shape != (_SIDE, _SIDE):
            raise DataError(source, f"an image of shape {array.shape}; allowed: ({_SIDE}, {_SIDE}) as in "
                                    "FEMNIST", f"writer {writer}, sample {i}")
        rows.append(array.reshape(-1))
    return np.stack(rows) if rows else np.zeros((0, _SIDE * _SIDE), dtype=np.uint8)
