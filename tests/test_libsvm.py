"""dpadmm.data.libsvm: paper 002's four data sets read from ../shared/data, and clear errors for bad files."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data.checks import DataError
from dpadmm.data.download import DownloadError
from dpadmm.data.libsvm import (
    BINARY_SETS,
    load_binary,
    normalise_rows,
    read_bio,
    read_libsvm,
)
from tests.corrupt import flipped, head, not_utf8, truncated, write_gz


@pytest.mark.parametrize("name", sorted(BINARY_SETS))
def test_the_papers_data_sets_have_table_1s_sizes(binary_dir: Path, name: str) -> None:
    data = load_binary(name, binary_dir / name)
    spec = BINARY_SETS[name]
    assert (data.num_train, data.num_test, data.num_features) == (*spec.rows, spec.features)
    assert data.num_classes == 2 and set(data.y_train.unique().tolist()) == {0, 1}
    assert torch.isfinite(data.x_train).all() and torch.isfinite(data.x_test).all()
    if name == "bio_train":  # 1,296 positives in all (the data README); split by a fixed permutation
        assert int(data.y_train.sum() + data.y_test.sum()) == 1296
        again = load_binary(name, binary_dir / name)
        assert torch.equal(again.x_train, data.x_train) and torch.equal(again.y_test, data.y_test)


def test_a8a_is_an_order_preserving_subset_of_a9a(binary_dir: Path) -> None:
    """The data README's fact, a check that sparse rows are placed where their indices say."""
    a9a, a8a = load_binary("a9a", binary_dir / "a9a"), load_binary("a8a", binary_dir / "a8a")
    rows = {tuple(r.nonzero().flatten().tolist()) + (int(y),) for r, y in zip(a9a.x_train, a9a.y_train,
                                                                           strict=True)}
    assert all(tuple(r.nonzero().flatten().tolist()) + (int(y),) in rows
               for r, y in zip(a8a.x_train[:500], a8a.y_train[:500], strict=True))


def test_plain_and_gzip_files_read_the_same(tmp_path: Path) -> None:
    text = "+1 1:0.5 3:2\n-1 2:1\n\n1.0 3:-1.5\n"
    (tmp_path / "plain").write_text(text)
    with gzip.open(tmp_path / "packed.gz", "wt") as fh:
        fh.write(text)
    x, y = read_libsvm(tmp_path / "plain", 3)
    np.testing.assert_array_equal(x, [[0.5, 0, 2], [0, 1, 0], [0, 0, -1.5]])
    np.testing.assert_array_equal(y, [1, 0, 1])
    x2, y2 = read_libsvm(tmp_path / "packed.gz", 3)
    np.testing.assert_array_equal(x, x2) and np.testing.assert_array_equal(y, y2)


@pytest.mark.parametrize(("line", "reason"), [
    ("2 1:1", "label '2' is not -1 or +1 (allowed: -1 or +1)"),
    ("abc 1:1", "label 'abc' is not -1 or +1"),
    ("nan 1:1", "label 'nan' is not -1 or +1"),
    ("+1 1-1", "'1-1' is not <index>:<value>"),
    ("+1 0:1", "'0:1' is not <index>:<value> with index >= 1"),
    ("+1 5:1", "feature index 5 is beyond the declared width 3 (allowed: 1..3)"),
    ("+1 2:1 1:1", "index 1 does not increase"),
    ("+1 1:x", "'1:x' is not <index>:<value>"),
    ("+1 1:0.5 3:nan", "feature 3: the value is nan; allowed: finite numbers"),
    ("-1 2:-inf", "feature 2: the value is -inf; allowed: finite numbers"),
    ("-1 2:1e999", "feature 2: the value is inf"),
])
def test_a_malformed_libsvm_line_is_named_with_its_number(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "bad"
    path.write_text(f"+1 1:1\n-1 2:1\n\n{line}\n")
    with pytest.raises(DataError, match=re.escape(f"{path} line 4") + "[:,] " + re.escape(reason)):
        read_libsvm(path, 3)


@pytest.fixture(scope="module")
def a9a_head(binary_dir: Path) -> list[bytes]:
    """The first 200 lines of the real a9a."""
    return head(binary_dir / "a9a" / "a9a.gz", 200)


def _line(lines: list[bytes], number: int, old: bytes, new: bytes) -> list[bytes]:
    """``lines`` with ``old`` replaced by ``new`` in line ``number`` (1-based)."""
    assert old in lines[number - 1], (old, lines[number - 1])
    return [*lines[:number - 1], lines[number - 1].replace(old, new, 1), *lines[number:]]


@pytest.mark.parametrize(("fault", "message"), [
    ("truncated", "cannot decompress the gzip data (it ends early)"),
    ("flipped", ""),
    ("value", "line 17, feature 5: the value is nan; allowed: finite numbers"),
    ("infinite", "line 17, feature 5: the value is inf; allowed: finite numbers"),
    ("label", "line 17: label '+2' is not -1 or +1 (allowed: -1 or +1)"),
    ("index", "line 17: feature index 130 is beyond the declared width 123 (allowed: 1..123)"),
    ("utf8", "line 17: byte 0xff at column 1 is not UTF-8 text"),
    ("empty", "the file is empty (0 bytes)"),
    ("blank", "holds no sample"),
])
def test_a_corrupted_a9a_is_refused_naming_the_file_and_line(tmp_path: Path, binary_dir: Path,
                                                            a9a_head: list[bytes], fault: str, message: str
                                                            ) -> None:
    """A copy of the real a9a's first 200 lines, damaged one way each: refused with one line that names the
    file, the line where that applies, the value and what is allowed, by read_libsvm and load_binary."""
    lines = a9a_head
    label = lines[16].split()[0]
    first = lines[16].split()[1]
    changed = {
        "value": lambda: _line(lines, 17, first, b"5:nan"),
        "infinite": lambda: _line(lines, 17, first, b"5:inf"),
        "label": lambda: _line(lines, 17, label + b" ", b"+2 "),
        "index": lambda: _line(lines, 17, b"\n", b" 130:1\n"),
        "utf8": lambda: not_utf8(lines, 17),
        "blank": lambda: [b"\n", b"  \n"],
    }.get(fault, lambda: lines)()
    path = write_gz(tmp_path / "a9a" / "a9a.gz", changed)
    shutil.copy(binary_dir / "a9a" / "a9a.t.gz", tmp_path / "a9a" / "a9a.t.gz")
    if fault == "truncated":
        truncated(path)
    elif fault == "flipped":
        flipped(path)
    elif fault == "empty":
        path.write_bytes(b"")
    for read in (lambda: read_libsvm(path, 123), lambda: load_binary("a9a", tmp_path / "a9a")):
        with pytest.raises(DataError, match=re.escape(f"{path}") + r"[ :]") as info:
            read()
        assert message in str(info.value) and "\n" not in str(info.value)


@pytest.fixture(scope="module")
def bio_head(binary_dir: Path) -> list[bytes]:
    """The first 50 rows of the real bio_train."""
    return head(binary_dir / "bio_train" / "bio_train.dat.gz", 50)


@pytest.mark.parametrize(("fault", "message"), [
    ("fields", "line 7: 76 fields, expected 77 (block id, example id, label, 74 features)"),
    ("label", "line 7: label '2' is not 0 or 1"),
    ("value", "line 7, field 10: the value is nan; allowed: finite numbers"),
    ("word", "line 7: a field is not a number"),
    ("utf8", "line 7: byte 0xff"),
    ("truncated", "cannot decompress the gzip data"),
    ("blank", "holds no row"),
])
def test_a_corrupted_bio_train_is_refused_naming_the_file_and_line(tmp_path: Path, bio_head: list[bytes],
                                                                  fault: str, message: str) -> None:
    rows = [line.split(b"\t") for line in bio_head]
    bad = list(rows[6])
    if fault == "fields":
        bad = [*bad[:-2], bad[-1]]  # one feature dropped
    elif fault == "label":
        bad[2] = b"2"
    elif fault == "value":
        bad[9] = b"nan"
    elif fault == "word":
        bad[9] = b"abc"
    lines = [b"\t".join(r) for r in rows[:6]] + [b"\t".join(bad)] + [b"\t".join(r) for r in rows[7:]]
    if fault == "utf8":
        lines = not_utf8(lines, 7)
    elif fault == "blank":
        lines = [b"\n"]
    path = write_gz(tmp_path / "bio_train.dat.gz", lines)
    if fault == "truncated":
        truncated(path)
    with pytest.raises(DataError, match=re.escape(f"{path}") + r"[ :]") as info:
        read_bio(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    x, y = read_bio(write_gz(tmp_path / "good.gz", bio_head))
    assert x.shape == (50, 74) and set(y.tolist()) <= {0, 1}


def test_missing_files_and_names_are_errors_that_say_what_to_do(tmp_path: Path, binary_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"neither .*a9a nor .*a9a\.gz exists"):
        load_binary("a9a", tmp_path)
    (tmp_path / "shared" / "a9a").mkdir(parents=True)  # the parent of the data set's folder given
    with pytest.raises(FileNotFoundError, match=r"exists; .*shared/a9a is a folder: give it as the data-dir"):
        load_binary("a9a", tmp_path / "shared")
    with pytest.raises(ValueError, match="dataset='gisette' is not a binary data set; choose one of a9a"):
        load_binary("gisette", tmp_path)
    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "cache"))  # without data-dir: the cache, fetched
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", (tmp_path / "offline").as_uri())
    with pytest.raises(DownloadError, match=r"could not download a9a file a9a\.gz into .*cache/a9a"):
        load_binary("a9a", "")
    shutil.copy(binary_dir / "a8a" / "a8a.gz", tmp_path / "a9a.gz")  # the wrong file under the right name
    shutil.copy(binary_dir / "a8a" / "a8a.t.gz", tmp_path / "a9a.t.gz")
    with pytest.raises(DataError, match="22696 training and 9865 test rows of a9a, expected 32561 and 16281"):
        load_binary("a9a", tmp_path)


def test_normalised_rows_have_unit_norm_and_zero_rows_stay() -> None:
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]], dtype=torch.float64)
    out = normalise_rows(x)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
