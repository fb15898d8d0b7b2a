"""The binary classification sets of paper 002 (Xu et al., Table I): LIBSVM text files and KDD Cup 2004.

- ``a9a``, ``a8a``, ``ijcnn1``: LIBSVM's sparse text format, one sample per line,
  ``<label> <index>:<value> ...`` with 1-based indices, plain or gzip-compressed (``.gz``).
  The feature count is fixed per data set (a9a's test file never uses index 123, so it is
  read with the training file's 123). Labels -1/+1 (ijcnn1 writes -1.0/1.0).
- ``bio_train``: KDD Cup 2004 protein homology, tab-separated ``block id, example id, label
  (0/1), 74 features``, 145,751 rows. The paper splits it 72,876 / 72,875 without saying how;
  here the rows are permuted with a fixed public seed (:data:`BIO_SPLIT_SEED`) and the first
  72,876 are the training set, so the split is random, reproducible and independent of the
  data's values.

A :class:`~dpadmm.data.Dataset` holds the labels as 0/1 (``num_classes = 2``); paper 002's
+-1 labels are ``2 y - 1``. Features are kept as read: scaling rows to unit norm, which the
gradient bound of 002 needs, is :func:`normalise_rows`, applied by the family that needs it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dpadmm.data import Dataset
from dpadmm.data.checks import DataError, open_text, require_finite, require_nonempty, require_width

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BinarySet:
    """Where a binary data set's files are and what they must hold."""

    train: str  # file name, looked up plain and with .gz
    test: str | None  # None: split from the training file (bio_train)
    features: int
    rows: tuple[int, int]  # (train, test) rows, checked after reading


BINARY_SETS = {
    "a9a": BinarySet("a9a", "a9a.t", 123, (32_561, 16_281)),
    "a8a": BinarySet("a8a", "a8a.t", 123, (22_696, 9_865)),
    "ijcnn1": BinarySet("ijcnn1", "ijcnn1.t", 22, (49_990, 91_701)),
    "bio_train": BinarySet("bio_train.dat", None, 74, (72_876, 72_875)),
}
BIO_SPLIT_SEED = 2004  # the KDD Cup's year: a public constant, chosen before looking at any result


def find_file(folder: str | os.PathLike, name: str) -> Path:
    """``folder/name`` or ``folder/name.gz``; a FileNotFoundError naming both when neither exists."""
    base = Path(folder)
    for candidate in (base / name, base / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    inside = f"; {base / name} is a folder: give it as the data-dir" if (base / name).is_dir() else ""
    raise FileNotFoundError(f"neither {base / name} nor {base / name}.gz exists{inside}")


def read_libsvm(path: str | os.PathLike, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    """(x float64 [N, num_features] dense, y int64 [N] in {0, 1}) from a LIBSVM file, plain or .gz.

    Labels must be -1 or +1 (any numeric spelling: -1.0, +1); indices 1..num_features,
    increasing within a line; values finite. A malformed line raises
    :class:`~dpadmm.data.checks.DataError` naming the file, the line number, the value and
    what is allowed; so does a file that is empty, cut off, damaged or not text.
    """
    path = Path(path)
    labels: list[int] = []
    lines: list[int] = []  # the line of each sample, for the errors found after reading
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    with open_text(path) as fh:
        for number, line in enumerate(fh, start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"line {number}"
            try:
                label = float(fields[0])
            except ValueError:
                label = np.nan
            if label not in (-1.0, 1.0):
                raise DataError(path, f"label {fields[0]!r} is not -1 or +1 (allowed: -1 or +1)", where)
            previous = 0
            for item in fields[1:]:
                index_text, sep, value_text = item.partition(":")
                try:
                    index, value = int(index_text), float(value_text)
                except ValueError:
                    index, value = -1, 0.0
                if not sep or index < 1:
                    raise DataError(path, f"{item!r} is not <index>:<value> with index >= 1; allowed: "
                                          f"indices 1..{num_features} and numbers", where)
                if index > num_features:
                    raise DataError(path, f"feature index {index} is beyond the declared width "
                                          f"{num_features} (allowed: 1..{num_features})", where)
                if index <= previous:
                    raise DataError(path, f"index {index} does not increase (after {previous}); allowed: "
                                          "increasing indices within a line", where)
                previous = index
                rows.append(len(labels))
                cols.append(index - 1)
                vals.append(value)
            labels.append(1 if label > 0 else 0)
            lines.append(number)
    require_nonempty(len(labels), path, "sample (no line <label> <index>:<value> ...)")
    row_of, col_of = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    values = np.asarray(vals, dtype=np.float64)
    require_finite(values, path, "the value",
                   lambda k: f"line {lines[row_of[k[0]]]}, feature {col_of[k[0]] + 1}")
    x = np.zeros((len(labels), num_features), dtype=np.float64)
    x[row_of, col_of] = values
    return x, np.asarray(labels, dtype=np.int64)


def read_bio(path: str | os.PathLike, num_features: int = 74) -> tuple[np.ndarray, np.ndarray]:
    """(x float64 [N, 74], y int64 [N] in {0, 1}) from KDD Cup 2004's tab-separated protein homology file.

    numpy's C reader parses it; when it fails, or the table holds a wrong label or a value
    that is not finite, the file is scanned line by line for the first wrong line, so that
    the :class:`~dpadmm.data.checks.DataError` names it.
    """
    path = Path(path)
    width = 3 + num_features
    try:
        with open_text(path) as fh, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data", UserWarning)  # named below
            table = np.loadtxt(fh, dtype=np.float64, ndmin=2)
        if table.shape[1] != width or not np.isin(table[:, 2], (0.0, 1.0)).all():
            raise ValueError
        require_finite(table, path, "a value")
    except ValueError as err:
        _first_bad_bio_line(path, num_features)
        raise DataError(path, f"not a table of numbers ({err}); allowed: lines of block id, example id, "
                              f"label 0/1 and {num_features} features") from err
    return np.ascontiguousarray(table[:, 3:]), table[:, 2].astype(np.int64)


def _first_bad_bio_line(path: Path, num_features: int) -> None:
    """Raise :class:`~dpadmm.data.checks.DataError` for the first line of ``path`` that is not a bio_train
    row, and for a file with no row."""
    layout = f"block id, example id, label, {num_features} features"
    rows = 0
    with open_text(path) as fh:
        for number, line in enumerate(fh, start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"line {number}"
            require_width(len(fields), 3 + num_features, path, "fields", layout, where)
            if fields[2] not in ("0", "1"):
                raise DataError(path, f"label {fields[2]!r} is not 0 or 1; allowed: 0 or 1", where)
            try:
                values = np.array([float(v) for v in fields])
            except ValueError:
                raise DataError(path, f"a field is not a number; allowed: {layout}, all numbers",
                                where) from None
            require_finite(values, path, "the value", lambda k, where=where: f"{where}, field {k[0] + 1}")
            rows += 1
    require_nonempty(rows, path, f"row ({layout})")


def load_binary(name: str, data_dir: str | os.PathLike | None) -> Dataset:
    """One of :data:`BINARY_SETS` from ``data_dir`` (the folder holding its files; empty: the cache, where
    :func:`dpadmm.data.download.fetch` puts it on first use), labels 0/1."""
    import torch

    if name not in BINARY_SETS:
        raise ValueError(f"dataset={name!r} is not a binary data set; choose one of {', '.join(BINARY_SETS)}")
    from dpadmm.data.download import data_folder

    spec = BINARY_SETS[name]
    data_dir = data_folder(name, data_dir)  # without one: the cache, fetched on first use
    if spec.test is None:
        x, y = read_bio(find_file(data_dir, spec.train), spec.features)
        order = np.random.default_rng(BIO_SPLIT_SEED).permutation(len(y))
        train, test = order[:spec.rows[0]], order[spec.rows[0]:]
        parts = (x[train], y[train], x[test], y[test])
    else:
        parts = (*read_libsvm(find_file(data_dir, spec.train), spec.features),
                 *read_libsvm(find_file(data_dir, spec.test), spec.features))
    got = (len(parts[1]), len(parts[3]))
    if got != spec.rows:
        raise DataError(data_dir, f"{got[0]} training and {got[1]} test rows of {name}, expected "
                                  f"{spec.rows[0]} and {spec.rows[1]} (the data set's own files)")
    x_train, y_train, x_test, y_test = (torch.from_numpy(np.ascontiguousarray(a)) for a in parts)
    return Dataset(name=name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, num_classes=2)


def normalise_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its L2 norm (zero rows kept): ||l_i|| <= 1, so that the logistic loss's
    per-sample gradient has norm <= 1, the bound c = 1 of 002's Theorem 1. A row whose norm is not finite
    (an entry beyond float64's range, or its squares' sum) becomes a zero row: the bound is total, whatever a
    device's file holds."""
    import torch

    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    scaled = x / torch.where(norms > 0, norms, torch.ones_like(norms))
    return torch.where(torch.isfinite(norms), scaled, torch.zeros_like(scaled))
