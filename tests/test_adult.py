"""dpadmm.data.adult: UCI Adult from the original files, 14 columns in [0, 1], rows with a gap dropped."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import pytest
import torch

from dpadmm.data.adult import COLUMNS, ROWS, load_adult
from dpadmm.data.checks import DataError
from tests.corrupt import flipped, head, not_utf8, truncated, write_gz


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
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'short' / 'adult.data'} line 2: 2 fields, "
                                                  "expected 15 (age, workclass")):
        load_adult(tmp_path / "short")
    _write(tmp_path / "few", [row, row.replace("State-gov", "?")], [row + "."])
    with pytest.raises(ValueError, match="1 and 1 complete rows, expected 30162 and 15060"):
        load_adult(tmp_path / "few")


def _field(line: bytes, column: str, value: bytes | None) -> bytes:
    """``line`` of adult.data with the field of ``column`` ("income": the label) set to ``value`` (None:
    dropped)."""
    fields = line.rstrip(b"\n").split(b", ")
    j = len(COLUMNS) if column == "income" else COLUMNS.index(column)
    fields[j:j + 1] = [] if value is None else [value]
    return b", ".join(fields) + b"\n"


FAULTS = {  # how each fault changes the 17th line
    "nan": lambda line: _field(line, "age", b"nan"),
    "inf": lambda line: _field(line, "capital-gain", b"inf"),
    "word": lambda line: _field(line, "hours-per-week", b"forty"),
    "label": lambda line: _field(line, "income", b"maybe"),
    "column": lambda line: _field(line, "workclass", None),
}


@pytest.mark.parametrize(("fault", "message"), [
    ("nan", "line 17: age is nan; allowed: finite numbers"),
    ("inf", "line 17: capital-gain is inf; allowed: finite numbers"),
    ("word", "line 17: hours-per-week 'forty' is not a number; allowed: numbers"),
    ("label", "line 17: income 'maybe' is not a label; allowed: <=50K or >50K"),
    ("column", "line 17: 14 fields, expected 15 (age, workclass"),
    ("utf8", "line 17: byte 0xff at column 1 is not UTF-8 text"),
    ("truncated", "cannot decompress the gzip data (it ends early)"),
    ("flipped", ""),
    ("empty", "the file is empty (0 bytes)"),
    ("comments", "holds no complete row"),
])
def test_a_corrupted_adult_file_is_refused_naming_the_file_and_line(tmp_path: Path, binary_dir: Path,
                                                                   fault: str, message: str) -> None:
    """A copy of the real adult.data's first 200 lines (next to the real adult.test), damaged one way each:
    a bad income is refused, not read as class 0; a NaN never reaches the scaled columns."""
    lines = head(binary_dir / "adult" / "adult.data.gz", 200)
    lines[16] = FAULTS.get(fault, lambda line: line)(lines[16])
    if fault == "utf8":
        lines = not_utf8(lines, 17)
    elif fault == "comments":
        lines = [b"|1x3 Cross validator\n", b"\n"]
    folder = tmp_path / "adult"
    path = write_gz(folder / "adult.data.gz", lines)
    shutil.copy(binary_dir / "adult" / "adult.test.gz", folder / "adult.test.gz")
    {"truncated": truncated, "flipped": flipped}.get(fault, lambda p: p)(path)
    if fault == "empty":
        path.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(str(path)) + r"[ :]") as info:
        load_adult(folder)
    assert message in str(info.value) and "\n" not in str(info.value)
