"""UCI Adult (``adult.data``, ``adult.test``, plain or ``.gz``): 14 attributes, income above 50K or not.

Paper 004's data set. It says only "remove individuals with missing values, normalise columns and
rows" and that a sample is a point of R^14, so every attribute is one column (the paper does not say how it
encodes the categorical ones):

- rows with a missing value (``?``) are dropped: 30,162 training and 15,060 test rows remain;
- a categorical attribute becomes the index of its value among the training file's values in sorted
  order (ordinal codes: one column each, as R^14 needs; one-hot columns would change d, and with it
  the d-dependent privacy cost);
- every column is scaled to [0, 1] by the training rows' minimum and maximum (test values are
  clipped into [0, 1]). These statistics come from the data and no guarantee covers them; they are
  public here as the UCI's own documented ranges would be.

Labels: 1 for ``>50K``, 0 for ``<=50K`` (the test file writes ``>50K.`` and ``<=50K.``). Scaling rows to
unit norm is the family's step (:func:`dpadmm.data.libsvm.normalise_rows`).

A file that is cut off, damaged or not text, a line with another number of fields, a numeric
attribute that is not a finite number and an income that is neither label are refused with a
:class:`~dpadmm.data.checks.DataError` naming the file and line.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dpadmm.data import Dataset
from dpadmm.data.checks import DataError, open_text, require_finite, require_nonempty, require_width

COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
           "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country")
CATEGORICAL = frozenset({"workclass", "education", "marital-status", "occupation", "relationship", "race",
                         "sex", "native-country"})
LABELS = {"<=50K": 0, ">50K": 1}  # the income column; the test file ends each with a dot
ROWS = (30_162, 15_060)  # (train, test) rows without a missing value, checked after reading
_LAYOUT = f"{', '.join(COLUMNS)}, income (<=50K or >50K)"


def _file(directory: Path, name: str) -> Path:
    for path in (directory / name, directory / f"{name}.gz"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"data-dir {directory} has no {name} or {name}.gz (UCI Adult's files)")


def _records(path: Path) -> tuple[list[list[str]], list[int]]:
    """The complete rows of ``path`` (15 fields, none missing; comment and empty lines skipped) and the
    line of each."""
    with open_text(path) as fh:
        lines = fh.read().splitlines()
    rows, numbers = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("|"):
            continue
        fields = [f.strip() for f in line.split(",")]
        require_width(len(fields), len(COLUMNS) + 1, path, "fields", _LAYOUT, f"line {number}")
        if "?" not in fields:
            rows.append(fields)
            numbers.append(number)
    require_nonempty(len(rows), path, f"complete row ({_LAYOUT})")
    return rows, numbers


def _numbers(path: Path, rows: list[list[str]], lines: list[int], j: int) -> np.ndarray:
    """Column ``j`` of ``rows`` as finite numbers."""
    values = []
    for fields, line in zip(rows, lines, strict=True):
        try:
            values.append(float(fields[j]))
        except ValueError:
            raise DataError(path, f"{COLUMNS[j]} {fields[j]!r} is not a number; allowed: numbers",
                            f"line {line}") from None
    array = np.array(values)
    require_finite(array, path, COLUMNS[j], lambda i: f"line {lines[i[0]]}")
    return array


def _labels(path: Path, rows: list[list[str]], lines: list[int]) -> np.ndarray:
    """The income column as 0/1; anything but <=50K and >50K (with or without the test file's dot) is refused
    rather than read as class 0."""
    labels = [LABELS.get(fields[-1].removesuffix("."), -1) for fields in rows]
    if -1 in labels:
        i = labels.index(-1)
        raise DataError(path, f"income {rows[i][-1]!r} is not a label; allowed: <=50K or >50K",
                        f"line {lines[i]}")
    return np.array(labels, dtype=np.int64)


def load_adult(data_dir: str | os.PathLike | None) -> Dataset:
    """The Adult training and test sets from ``data_dir`` (empty: the cache, where
    :func:`dpadmm.data.download.fetch` puts them on first use), encoded as the module docstring says."""
    import torch

    from dpadmm.data.download import data_folder

    directory = data_folder("adult", data_dir)
    paths = [_file(directory, name) for name in ("adult.data", "adult.test")]
    (train, train_lines), (test, test_lines) = (_records(path) for path in paths)
    parts = [(paths[0], train, train_lines), (paths[1], test, test_lines)]
    numeric = {j: [_numbers(path, rows, lines, j) for path, rows, lines in parts]
               for j, name in enumerate(COLUMNS) if name not in CATEGORICAL}
    y_train, y_test = (_labels(path, rows, lines) for path, rows, lines in parts)
    if (len(train), len(test)) != ROWS:
        raise DataError(directory, f"{len(train)} and {len(test)} complete rows, expected {ROWS[0]} and "
                                   f"{ROWS[1]} (UCI Adult's files)")
    columns = []
    for j, name in enumerate(COLUMNS):
        if name in CATEGORICAL:
            values = sorted({r[j] for r in train})
            code = {v: float(i) for i, v in enumerate(values)}
            pair = [np.array([code.get(r[j], np.nan) for r in rows]) for rows in (train, test)]
            if np.isnan(pair[1]).any():  # a value the training file never has: at its nearest end, 0
                pair[1] = np.nan_to_num(pair[1], nan=0.0)
        else:
            pair = numeric[j]
        low, high = pair[0].min(), pair[0].max()
        if low == high:  # scaling by the range would divide by zero
            raise DataError(paths[0], f"{name} is {low:g} in every complete row; allowed: a column with at "
                                      "least two values")
        columns.append([np.clip((p - low) / (high - low), 0.0, 1.0) for p in pair])
    x_train, x_test = (np.stack([c[i] for c in columns], axis=1) for i in (0, 1))
    return Dataset(name="adult", x_train=torch.from_numpy(x_train), y_train=torch.from_numpy(y_train),
                   x_test=torch.from_numpy(x_test), y_test=torch.from_numpy(y_test), num_classes=2)
