"""dpadmm.data.adult: UCI Adult from the original files, 14 columns in [0, 1], rows with a gap dropped."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from dpadmm.data.adult import COLUMNS, ROWS, load_adult


def test_the_real_files_give_the_complete_rows_in_fourteen_columns(binary_dir: Path) -> None:
    data = load_adult(binary_dir / "adult")
    assert tuple(data.x_train.shape) == (ROWS[0], 14) and tuple(data.x_test.shape) == (ROWS[1], 14)
    assert len(COLUMNS) == 14 and data.num_classes == 2
    # each column spans [0, 1] on the training rows; test values are clipped into it
    assert torch.equal(data.x_train.amin(dim=0), torch.zeros(14, dtype=torch.float64))
    assert torch.equal(data.x_train.amax(dim=0), torch.ones(14, dtype=torch.float64))
    assert float(data.x_test.min()) >= 0 and float(data.x_test.max()) <= 1
    # about a quarter earn more than 50K, in both files (the test file writes ">50K.")
    for labels in (data.y_train, data.y_test):
        assert 0.24 < float(labels.double().mean()) < 0.25
    sex = COLUMNS.index("sex")  # two values, sorted: Female 0, Male 1
    assert set(data.x_train[:, sex].tolist()) == {0.0, 1.0}


def _write(folder: Path, train: list[str], test: list[str]) -> None:
    folder.mkdir()
    (folder / "adult.data").write_text("\n".join(train) + "\n")
    with gzip.open(folder / "adult.test.gz", "wt") as fh:
        fh.write("|1x3 Cross validator\n" + "\n".join(test) + "\n")


def test_missing_and_malformed_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="has no adult.data or adult.data.gz"):
        load_adult(tmp_path)
    row = ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
           "2174, 0, 40, United-States, <=50K")
    _write(tmp_path / "short", [row, "39, State-gov"], [row + "."])
    with pytest.raises(ValueError, match="adult.data line 2: 2 fields, expected 15"):
        load_adult(tmp_path / "short")
    _write(tmp_path / "few", [row, row.replace("State-gov", "?")], [row + "."])
    with pytest.raises(ValueError, match="1 and 1 complete rows, expected 30162 and 15060"):
        load_adult(tmp_path / "few")
