"""UCI Adult (``adult.data``, ``adult.test``, plain or ``.gz``): 14 attributes, income above 50K or not.

Paper 004's data set. It says only "remove individuals with missing values, normalise columns and
rows" and that a sample is a point of R^14, so every attribute is one column (NOTES-004, G5):

- rows with a missing value (``?``) are dropped: 30,162 training and 15,060 test rows remain;
- a categorical attribute becomes the index of its value among the training file's values in sorted
  order (ordinal codes: one column each, as R^14 needs; one-hot columns would change d, and with it
  the d-dependent privacy cost);
- every column is scaled to [0, 1] by the training rows' minimum and maximum (test values are
  clipped into [0, 1]). These statistics come from the data and no guarantee covers them; they are
  public here as the UCI's own documented ranges would be.

Labels: 1 for ``>50K`` (the test file writes ``>50K.``), else 0. Scaling rows to unit norm is the
family's step (:func:`dpadmm.data.libsvm.normalise_rows`).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from dpadmm.data import Dataset

COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
           "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country")
CATEGORICAL = frozenset({"workclass", "education", "marital-status", "occupation", "relationship", "race",
                         "sex", "native-country"})
ROWS = (30_162, 15_060)  # (train, test) rows without a missing value, checked after reading


def _lines(directory: Path, name: str) -> list[str]:
    for path in (directory / name, directory / f"{name}.gz"):
        if path.is_file():
            if path.suffix == ".gz":
                with gzip.open(path, "rt", encoding="ascii") as fh:
                    return fh.read().splitlines()
            return path.read_text(encoding="ascii").splitlines()
    raise FileNotFoundError(f"data-dir {directory} has no {name} or {name}.gz (UCI Adult's files)")


def _records(lines: list[str], name: str) -> list[list[str]]:
    """The complete rows: 15 fields, none missing; comment and empty lines skipped."""
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("|"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(COLUMNS) + 1:
            raise ValueError(f"{name} line {number}: {len(fields)} fields, expected {len(COLUMNS) + 1}")
        if "?" not in fields:
            rows.append(fields)
    return rows


def load_adult(data_dir: str | os.PathLike) -> Dataset:
    """The Adult training and test sets, encoded as the module docstring says."""
    import torch

    directory = Path(data_dir).expanduser()
    train, test = (_records(_lines(directory, name), name) for name in ("adult.data", "adult.test"))
    if (len(train), len(test)) != ROWS:
        raise ValueError(f"{directory}: {len(train)} and {len(test)} complete rows, expected {ROWS[0]} and "
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
            pair = [np.array([float(r[j]) for r in rows]) for rows in (train, test)]
        low, high = pair[0].min(), pair[0].max()
        columns.append([np.clip((p - low) / (high - low), 0.0, 1.0) for p in pair])
    x_train, x_test = (np.stack([c[i] for c in columns], axis=1) for i in (0, 1))
    y_train, y_test = (np.array([r[-1].rstrip(".") == ">50K" for r in rows], dtype=np.int64)
                       for rows in (train, test))
    return Dataset(name="adult", x_train=torch.from_numpy(x_train), y_train=torch.from_numpy(y_train),
                   x_test=torch.from_numpy(x_test), y_test=torch.from_numpy(y_test), num_classes=2)
