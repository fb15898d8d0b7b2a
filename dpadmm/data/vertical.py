"""Vertical (feature-partitioned) data: every party holds the same samples and a contiguous block of columns.

- :func:`split_columns` cuts a feature matrix into blocks of the given widths, in order (001's a9a
  split is 66 and 57 columns);
- :func:`pad_blocks` stacks blocks of different widths as [M, N, d_max] with zero columns, which
  the batched engine multiplies without changing any party's result, and a mask of the real ones;
- :func:`load_mnist_4v9` is MNIST's digits 4 (label 0) and 9 (label 1), 784 pixels: the stand-in for
  001's gisette, which was built from these two digits and cannot be obtained here;
  :func:`load_vertical` loads either vertical data set by name.

In a deployment no machine holds the whole data set: each party's SuperNode reads its own column
block from a file, and the server reads the labels from another (:func:`read_party_file`,
:func:`read_labels_file`; :func:`write_vertical_files` cuts a data set into such files). Vertical
learning assumes that row i is the same sample everywhere. Each file therefore lists its samples'
ids, in order, and :func:`ids_digest` condenses them into one string that a party can send and the
server can compare without either side revealing the ids themselves. In simulation the ids are the
row numbers 0..N-1 (:func:`row_digest`), which are also the ids the written files hold.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpadmm.data import Dataset
from dpadmm.data.checks import (
    DataError,
    Where,
    load_npz,
    require_array,
    require_finite,
    require_labels,
    require_nonempty,
    write_npz,
)

MNIST_4V9_DIGITS = (4, 9)
MNIST_4V9_TRAIN = 11791  # 5,842 fours and 5,949 nines in MNIST's training file (a public count)
VERTICAL_TRAIN = {"a9a": 32561, "mnist-4v9": MNIST_4V9_TRAIN}  # N of the vertical data sets
PARTY_ARRAYS = ("ids", "x", "test_ids", "x_test")
LABELS_ARRAYS = ("ids", "y", "test_ids", "y_test")
LABELS_FILE = "labels.npz"


def require_widths(widths: Sequence[int], columns: int) -> None:
    """A ValueError unless the parties' ``widths`` cover the data set's ``columns`` exactly."""
    if sum(widths) != columns:
        raise ValueError(f"parties={','.join(map(str, widths))!r} cover {sum(widths)} columns but the data "
                         f"set has {columns}; give widths that sum to {columns}")


def split_columns(x: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
    """The contiguous column blocks of ``x`` [N, J] with the given widths, which must sum to J."""
    require_widths(widths, x.shape[1])
    return list(torch.split(x, list(widths), dim=1))


def pad_blocks(blocks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [M, N, d_max], zero columns after each block's own; mask [M, d_max] of the real columns)."""
    width = max(b.shape[1] for b in blocks)
    padded = torch.zeros((len(blocks), blocks[0].shape[0], width), dtype=blocks[0].dtype,
                         device=blocks[0].device)
    mask = torch.zeros((len(blocks), width), dtype=torch.bool, device=blocks[0].device)
    for m, block in enumerate(blocks):
        padded[m, :, :block.shape[1]] = block
        mask[m, :block.shape[1]] = True
    return padded, mask


def load_mnist_4v9(data_dir: str | os.PathLike | None) -> Dataset:
    """MNIST's 4s and 9s from the IDX files in ``data_dir`` (empty: the cache), in the files' order; label 1
    for a 9."""
    from dpadmm.data.download import mnist_folder
    from dpadmm.data.mnist import load_mnist

    full = load_mnist(mnist_folder(data_dir))
    parts = []
    for x, y in ((full.x_train, full.y_train), (full.x_test, full.y_test)):
        keep = (y == MNIST_4V9_DIGITS[0]) | (y == MNIST_4V9_DIGITS[1])
        parts += [x[keep], (y[keep] == MNIST_4V9_DIGITS[1]).to(torch.int64)]
    return Dataset(name="mnist-4v9", x_train=parts[0], y_train=parts[1], x_test=parts[2], y_test=parts[3],
                   num_classes=2)


def load_vertical(name: str, data_dir: str | os.PathLike | None) -> Dataset:
    """The vertical data set ``name`` (a9a or mnist-4v9) from ``data_dir`` (empty: the cache), unsplit."""
    if name not in VERTICAL_TRAIN:
        raise ValueError(f"dataset={name!r} is not allowed; choose one of {', '.join(VERTICAL_TRAIN)}")
    if name == "mnist-4v9":
        return load_mnist_4v9(data_dir)
    from dpadmm.data.libsvm import load_binary

    return load_binary(name, data_dir)


# ----- sample ids and their digest -----

def ids_digest(ids: Sequence[object] | np.ndarray, test_ids: Sequence[object] | np.ndarray) -> str:
    """The SHA-256 (hex) of the ordered training and test ids.

    Two sides hold the same samples in the same order exactly when their digests agree (up to a hash
    collision), so a party proves its alignment with the labels by sending 64 characters rather than
    N ids. Ids compare as text: the integer 7 and the string "7" are the same sample, so a file of
    integer row numbers and one of the same numbers written as strings agree. Each list is hashed
    as a JSON array, which keeps the boundaries between ids (and between the two lists) unambiguous.
    """
    digest = hashlib.sha256()
    for part in (ids, test_ids):
        digest.update(json.dumps([str(i) for i in np.asarray(part).tolist()]).encode())
    return digest.hexdigest()


def row_digest(num_train: int, num_test: int) -> str:
    """The digest of the ids 0..N-1 and 0..N_test-1: the rows of a data set in its order, which a party
    and the server hold in simulation and which the files of :func:`write_vertical_files` list."""
    return ids_digest(np.arange(num_train), np.arange(num_test))


# ----- a party's file and the server's labels file -----

@dataclass(frozen=True, eq=False)
class PartyFile:
    """One party's own data in a deployment: its column block of the training and the test samples (float64,
    as stored: the rows are scaled where the parties are built), and those samples' ids in order."""

    ids: np.ndarray  # [N], integers or strings
    x: torch.Tensor  # [N, d_m]
    test_ids: np.ndarray  # [N_test]
    x_test: torch.Tensor  # [N_test, d_m]

    def digest(self) -> str:
        return ids_digest(self.ids, self.test_ids)


@dataclass(frozen=True, eq=False)
class LabelsFile:
    """The server's labels in a deployment: 0/1 labels (int64) of the training and the test samples, and
    those samples' ids in order."""

    ids: np.ndarray  # [N]
    y: torch.Tensor  # [N]
    test_ids: np.ndarray  # [N_test]
    y_test: torch.Tensor  # [N_test]

    def digest(self) -> str:
        return ids_digest(self.ids, self.test_ids)


_PARTY_LAYOUT = "ids [N], x [N, d_m], test_ids [N_test] and x_test [N_test, d_m]"
_LABELS_LAYOUT = "ids [N], y [N] (0/1), test_ids [N_test] and y_test [N_test] (0/1)"


def _by_id(ids: np.ndarray) -> Where:
    """Names a row by its number and its sample's id (and the column, in a block)."""
    def where(index: tuple[int, ...]) -> str:
        named = f"row {index[0]} (id {ids[index[0]].item()!r})"
        return named + (f", column {index[1]}" if len(index) > 1 else "")

    return where


def _check_ids(source: str, name: str, ids: np.ndarray) -> np.ndarray:
    """``ids`` as a 1-D array of integers or strings, each appearing once."""
    require_array(ids, 1, source, name, "a 1-D array of integers or strings, one per sample", kinds="iuU")
    require_nonempty(ids.size, source, f"sample ({name} is empty)")
    values, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise DataError(source, f"{name} repeats {values[counts > 1][0].item()!r}; allowed: every sample "
                                "with its own id")
    return ids


def _check_rows(source: str, name: str, values: np.ndarray, ids_name: str, ids: np.ndarray, ndim: int
                ) -> None:
    """``values``: real numbers of ``ndim`` dimensions, one row per id."""
    shape = "[N, d_m]" if ndim == 2 else "[N]"
    require_array(values, ndim, source, name, f"a {ndim}-D array of real numbers {shape}")
    if values.shape[0] != ids.shape[0]:
        raise DataError(source, f"{name} has {values.shape[0]} rows but {ids_name} lists {ids.shape[0]} "
                                "samples; allowed: one row per id, in the ids' order")


def _party(source: str, arrays: dict[str, np.ndarray], widths: Sequence[int], party: int,
           finite: bool = True) -> PartyFile:
    """The checked :class:`PartyFile` of ``arrays`` (:data:`PARTY_ARRAYS`): what a party reads, and what
    :func:`write_vertical_files` checks before it writes. ``finite=False`` (a deployed party's reader) keeps
    a row with a non-finite value, which the party's row scaling makes a zero row
    (:func:`dpadmm.data.libsvm.normalise_rows`): a refusal decided by one sample's value would tell the
    server about it."""
    ids, test_ids = (_check_ids(source, n, arrays[n]) for n in ("ids", "test_ids"))
    blocks = []
    for name, of_name, of in (("x", "ids", ids), ("x_test", "test_ids", test_ids)):
        values = arrays[name]
        _check_rows(source, name, values, of_name, of, 2)
        if values.shape[1] != widths[party]:
            raise DataError(source, f"{name} has {values.shape[1]} columns but parties="
                                    f"{','.join(map(str, widths))!r} gives party {party} {widths[party]}; "
                                    f"allowed: this party's block of {widths[party]} columns, or the parties "
                                    "that match the files")
        values = values.astype(np.float64)
        if finite:
            require_finite(values, source, name, _by_id(of))
        blocks.append(torch.from_numpy(values))
    return PartyFile(ids=ids, x=blocks[0], test_ids=test_ids, x_test=blocks[1])


def _labels(source: str, arrays: dict[str, np.ndarray]) -> LabelsFile:
    """The checked :class:`LabelsFile` of ``arrays`` (:data:`LABELS_ARRAYS`), as :func:`_party`."""
    ids, test_ids = (_check_ids(source, n, arrays[n]) for n in ("ids", "test_ids"))
    labels = []
    for name, of_name, of in (("y", "ids", ids), ("y_test", "test_ids", test_ids)):
        _check_rows(source, name, arrays[name], of_name, of, 1)
        labels.append(torch.from_numpy(require_labels(arrays[name], 2, source, name, _by_id(of))))
    return LabelsFile(ids=ids, y=labels[0], test_ids=test_ids, y_test=labels[1])


def read_party_file(path: str | os.PathLike, widths: Sequence[int], party: int) -> PartyFile:
    """Party ``party``'s file (node config ``data-path``) of a split into blocks of ``widths``.

    An .npz with ``ids`` [N] (integers or strings), ``x`` [N, d_m], ``test_ids`` [N_test] and ``x_test``
    [N_test, d_m], where d_m = ``widths[party]``. :class:`~dpadmm.data.checks.DataError`s (ValueErrors)
    name the file, the row and its id where that applies, the value and what is allowed
    (FileNotFoundError for a missing file). A value that is not finite is no error here: the device keeps
    its row, which becomes a zero row when the party scales its rows (``write_vertical_files`` refuses it).
    """
    if not 0 <= party < len(widths):
        raise ValueError(f"partition-id={party} is not allowed; parties={','.join(map(str, widths))!r} has "
                         f"parties 0..{len(widths) - 1}")
    source = f"data-path {Path(path).expanduser()}"
    return _party(source, load_npz(path, PARTY_ARRAYS, _PARTY_LAYOUT, source), widths, party, finite=False)


def read_labels_file(path: str | os.PathLike) -> LabelsFile:
    """The server's labels file (run config ``labels-path``): an .npz with ``ids`` [N], ``y`` [N] (0/1),
    ``test_ids`` [N_test] and ``y_test`` [N_test]. Errors as :func:`read_party_file`'s."""
    source = f"labels-path {Path(path).expanduser()}"
    return _labels(source, load_npz(path, LABELS_ARRAYS, _LABELS_LAYOUT, source))


def party_file_name(party: int) -> str:
    return f"party-{party}.npz"


def write_vertical_files(dataset: Dataset, widths: Sequence[int], out: str | os.PathLike) -> list[Path]:
    """Cut ``dataset`` into one file per party (``party-<m>.npz``, its raw column block) and the server's
    ``labels.npz``, with ids = the row numbers; returns their paths, the labels' last.

    These are the files a deployment starts from: each party's SuperNode gets only its own file, the
    server only the labels. Before anything is written, the widths must cover the data set's columns
    exactly and every file's arrays must pass the checks its reader applies (:func:`read_party_file`,
    :func:`read_labels_file`), so that no file is written that no run could use. Existing files are
    refused rather than overwritten, since a party keeping an older file would no longer be aligned
    with the new labels.
    """
    blocks = split_columns(dataset.x_train, widths)
    test_blocks = split_columns(dataset.x_test, widths)
    out = Path(out)
    paths = [out / party_file_name(m) for m in range(len(widths))] + [out / LABELS_FILE]
    ids, test_ids = np.arange(dataset.num_train), np.arange(len(dataset.y_test))
    contents = [{"ids": ids, "x": blocks[m].numpy(), "test_ids": test_ids, "x_test": test_blocks[m].numpy()}
                for m in range(len(widths))]
    contents.append({"ids": ids, "y": dataset.y_train.numpy(), "test_ids": test_ids,
                     "y_test": dataset.y_test.numpy()})
    for m, path in enumerate(paths[:-1]):
        _party(str(path), contents[m], widths, m)
    _labels(str(paths[-1]), contents[-1])
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise FileExistsError(f"{', '.join(existing)} already exist; remove them or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    for path, arrays in zip(paths, contents, strict=True):
        write_npz(path, **arrays)
    return paths

