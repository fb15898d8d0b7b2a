"""dpadmm.data.checks: the shared checks, on real files of ../shared/data and corrupted copies of them.

Every refusal is one line that names the file (and the line or record where that applies); good data
passes unchanged.
"""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpadmm.data.checks import (
    DataError,
    load_npz,
    open_text,
    read_bytes,
    require_array,
    require_finite,
    require_keys,
    require_labels,
    require_nonempty,
    require_width,
)
from tests.conftest import data_root
from tests.corrupt import flipped, head, not_utf8, truncated, write_gz


@pytest.fixture
def a9a_head() -> list[bytes]:
    return head(data_root(("a9a", "a9a/a9a.gz")) / "a9a" / "a9a.gz", 200)


def _refused(call: object, *args: object, match: str) -> DataError:
    """The DataError that ``call(*args)`` raises; its message is one line and matches ``match``."""
    with pytest.raises(DataError, match=match) as info:
        call(*args)  # type: ignore[operator]
    assert "\n" not in str(info.value)
    return info.value


def _read_text(path: Path) -> str:
    with open_text(path) as fh:
        return fh.read()


def test_a_data_error_is_one_line_naming_the_source_and_the_record() -> None:
    problem = "feature index 130 is beyond the declared width 123 (allowed: 1..123)"
    error = DataError("a9a.gz", problem, "line 17")
    assert str(error) == f"a9a.gz line 17: {problem}"
    assert (error.source, error.where) == ("a9a.gz", "line 17") and isinstance(error, ValueError)
    assert str(DataError(Path("/d/x.npz"), "empty")) == "/d/x.npz: empty"


def test_text_reads_plain_and_gzip_alike(tmp_path: Path, a9a_head: list[bytes]) -> None:
    packed = write_gz(tmp_path / "a9a.gz", a9a_head)
    plain = tmp_path / "a9a"
    plain.write_bytes(b"".join(a9a_head))
    assert _read_text(packed) == _read_text(plain) == b"".join(a9a_head).decode()
    # gzip is recognised by its first bytes, not by the name's suffix
    shutil.copy(packed, tmp_path / "renamed")
    assert _read_text(tmp_path / "renamed") == _read_text(plain)
    assert read_bytes(packed) == read_bytes(plain) == b"".join(a9a_head)


@pytest.mark.parametrize("fault", ["truncated", "flipped"])
def test_a_damaged_gzip_file_is_named(tmp_path: Path, a9a_head: list[bytes], fault: str) -> None:
    path = write_gz(tmp_path / "a9a.gz", a9a_head)
    {"truncated": truncated, "flipped": flipped}[fault](path)
    message = re.escape(f"{path}: cannot decompress the gzip data") + r".*allowed: a complete gzip file"
    _refused(_read_text, path, match=message)
    _refused(read_bytes, path, match=message)


def test_a_real_truncated_download_is_named(tmp_path: Path, mnist_dir: Path) -> None:
    labels = mnist_dir / "t10k-labels-idx1-ubyte.gz"
    path = truncated(Path(shutil.copy(labels, tmp_path / labels.name)))
    _refused(read_bytes, path, match=re.escape(f"{path}: cannot decompress the gzip data (it ends early)"))


@pytest.mark.parametrize("packed", [True, False])
def test_bytes_that_are_not_text_are_named_with_their_line(tmp_path: Path, a9a_head: list[bytes],
                                                          packed: bool) -> None:
    lines = not_utf8(a9a_head, 150)
    path = tmp_path / "a9a"
    if packed:
        write_gz(path, lines)
    else:
        path.write_bytes(b"".join(lines))
    _refused(_read_text, path, match=re.escape(f"{path} line 150: byte 0xff at column 1 is not UTF-8 text; "
                                               "allowed: a UTF-8 (or ASCII) text file"))


def test_empty_files_are_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    packed_empty = tmp_path / "empty.gz"
    packed_empty.write_bytes(gzip.compress(b""))
    for path in (empty, packed_empty):
        _refused(read_bytes, path, match=re.escape(f"{path}: the file is empty (0 bytes)"))
    _refused(_read_text, empty, match=re.escape(f"{empty}: the file is empty (0 bytes)"))
    _refused(load_npz, empty, ["x"], "x [n]", match=re.escape(f"{empty}: the file is empty"))


@pytest.fixture
def npz(tmp_path: Path, a9a_head: list[bytes]) -> Path:
    """An .npz of real rows: 200 a9a labels and a dense block of their first features."""
    rows = [line.split() for line in a9a_head]
    y = np.array([float(r[0]) for r in rows])
    x = np.zeros((len(rows), 10))
    for i, r in enumerate(rows):
        for item in r[1:]:
            index, value = item.split(b":")
            if int(index) <= 10:
                x[i, int(index) - 1] = float(value)
    path = tmp_path / "rows.npz"
    np.savez_compressed(path, x=x, y=y)
    return path


def test_npz_arrays_are_read_and_a_bad_npz_is_named(tmp_path: Path, npz: Path) -> None:
    arrays = load_npz(npz, ("x", "y"), "x [n, 10] and y [n]")
    assert arrays["x"].shape == (200, 10) and set(arrays["y"].tolist()) == {-1.0, 1.0}
    _refused(load_npz, npz, ("x", "z"), "x [n, 10] and z",
             match=re.escape(f"{npz}: missing array(s) z (found: x, y); allowed: x [n, 10] and z"))
    assert "data-path" in str(_refused(load_npz, npz, ("w",), "w", "data-path /dev/x.npz", match="missing"))
    for fault in (truncated, flipped):
        damaged = fault(Path(shutil.copy(npz, tmp_path / f"{fault.__name__}.npz")))
        _refused(load_npz, damaged, ("x", "y"), "x and y", match=re.escape(str(damaged)) + r": .*damaged")
    text = tmp_path / "rows.csv"
    text.write_text("x,y\n1,2\n")
    _refused(load_npz, text, ("x",), "x", match=re.escape(f"{text}: not a NumPy .npz file"))
    single = tmp_path / "single.npy"
    np.save(single, np.ones(3))
    _refused(load_npz, single, ("x",), "x", match=re.escape(f"{single}: a single array (.npy), not an .npz"))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x=np.array([{"a": 1}, 2], dtype=object))
    _refused(load_npz, pickled, ("x",), "x", match="array x cannot be read without pickle")
    with pytest.raises(FileNotFoundError, match="nowhere.npz is not a file"):
        load_npz(tmp_path / "nowhere.npz", ("x",), "x")


def test_finite_values_pass_and_the_first_bad_one_is_named(npz: Path) -> None:
    x = load_npz(npz, ("x",), "x")["x"]
    require_finite(x, "rows.npz", "x")
    require_finite(np.array([1e308, 1e308]), "big", "x")  # the sum overflows, every value is finite
    require_finite(np.arange(5), "ints", "x")
    for value in (np.nan, np.inf, -np.inf):
        bad = x.copy()
        bad[17, 4] = value
        bad[30, 0] = np.nan  # a later one is not the one named
        _refused(require_finite, bad, "rows.npz", "x",
                 match=re.escape(f"rows.npz row 17, column 4: x is {value!r}; allowed: finite numbers"))
    _refused(require_finite, np.array([1.0, np.nan]), "v", "the value", lambda i: f"line {i[0] + 1}",
             match=re.escape("v line 2: the value is nan"))


def test_labels_inside_the_classes_pass_and_others_are_named(npz: Path) -> None:
    y = load_npz(npz, ("y",), "y")["y"]
    binary = require_labels((y + 1) / 2, 2, "rows.npz")  # whole floats are labels
    assert binary.dtype == np.int64 and set(binary.tolist()) == {0, 1}
    assert require_labels(np.array([True, False]), 2, "b").tolist() == [1, 0]
    assert require_labels(np.array([7, 0]), None, "any").tolist() == [7, 0]
    assert require_labels(np.zeros(0), 10, "none").shape == (0,)
    cases = [
        (y, 2, r"row 0: y holds the label -?1\.0; allowed: 0 or 1"),  # -1/+1 are not 0/1
        (np.array([0, 9, 10]), 10, re.escape("row 2: y holds the label 10; allowed: 0..9 (the 10 classes)")),
        (np.array([0, -1]), None, re.escape("row 1: y holds the label -1; allowed: integers >= 0")),
        (np.array([0.0, 0.5]), 2, re.escape("row 1: y holds the label 0.5; allowed: 0 or 1")),
        (np.array([np.nan, 0.0]), 2, re.escape("row 0: y holds the label nan")),
        (np.array([np.inf]), None, re.escape("row 0: y holds the label inf")),
        (np.array(["1", "0"]), 2, re.escape("y holds <U1 values; allowed: labels 0 or 1")),
    ]
    for labels, classes, message in cases:
        _refused(require_labels, labels, classes, "rows.npz", match=message)


def test_layout_checks_name_what_is_missing_and_what_is_allowed() -> None:
    require_keys({"users": 1, "user_data": 2}, ("users",), "f.json", "users and user_data")
    _refused(require_keys, {"users": 1}, ("users", "user_data"), "f.json", "users and user_data", "key(s)",
             "writer w", match=re.escape("f.json writer w: missing key(s) user_data (found: users); allowed: "
                                         "users and user_data"))
    require_width(15, 15, "adult.data", "fields", "age, ..., income")
    _refused(require_width, 2, 15, "adult.data", "fields", "age, ..., income", "line 3",
             match=re.escape("adult.data line 3: 2 fields, expected 15 (age, ..., income)"))
    require_array(np.ones((2, 3)), 2, "x.npz", "x", "x [n, J]")
    require_array(np.ones((2, 3, 3)), (2, 3), "x.npz", "x", "x [n, J]")
    _refused(require_array, np.ones(3), 2, "x.npz", "x", "x [n, J]",
             match=re.escape("x.npz: x is float64 of shape (3,); allowed: x [n, J]"))
    _refused(require_array, np.array(["a"]), 1, "x.npz", "ids", "ints", "iu", match="ids is <U1 of shape")
    require_nonempty(1, "f", "sample")
    _refused(require_nonempty, 0, "f", "sample", match="f: holds no sample; allowed: at least one")
