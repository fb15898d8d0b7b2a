"""dpadmm.data.libsvm: paper 002's four data sets read from ../shared/data, and clear errors for bad files."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data.libsvm import (
    BINARY_SETS,
    DataFormatError,
    load_binary,
    normalise_rows,
    read_bio,
    read_libsvm,
)


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
    ("2 1:1", "label '2' is not -1 or +1"),
    ("abc 1:1", "label 'abc' is not a number"),
    ("+1 1-1", "'1-1' is not <index>:<value>"),
    ("+1 0:1", "'0:1' is not <index>:<value> with index >= 1"),
    ("+1 5:1", "index 5 is larger than the 3 features"),
    ("+1 2:1 1:1", "index 1 does not increase"),
    ("+1 1:x", "'1:x' is not <index>:<value>"),
])
def test_a_malformed_libsvm_line_is_named_with_its_number(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "bad"
    path.write_text(f"+1 1:1\n-1 2:1\n{line}\n")
    with pytest.raises(DataFormatError, match=re.escape(f"bad, line 3: {reason}")):
        read_libsvm(path, 3)


def test_a_malformed_bio_line_is_named_with_its_number(tmp_path: Path) -> None:
    good = "\t".join(["1", "2", "0"] + ["0.5"] * 4)
    for bad, reason in ((good + "\t1", "8 fields, expected 7"), (good.replace("\t0\t", "\t2\t", 1),
                                                               "label '2' is not 0 or 1")):
        path = tmp_path / "bio.dat"
        path.write_text(f"{good}\n{bad}\n")
        with pytest.raises(DataFormatError, match=f"line 2: {reason}"):
            read_bio(path, 4)
    path.write_text(f"{good}\n{good}\n")
    x, y = read_bio(path, 4)
    assert x.shape == (2, 4) and y.tolist() == [0, 0]


def test_missing_files_and_names_are_errors_that_say_what_to_do(tmp_path: Path, binary_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"neither .*a9a nor .*a9a\.gz exists"):
        load_binary("a9a", tmp_path)
    with pytest.raises(ValueError, match="dataset='gisette' is not a binary data set; choose one of a9a"):
        load_binary("gisette", tmp_path)
    with pytest.raises(ValueError, match="needs data-dir"):
        load_binary("a9a", "")
    shutil.copy(binary_dir / "a8a" / "a8a.gz", tmp_path / "a9a.gz")  # the wrong file under the right name
    shutil.copy(binary_dir / "a8a" / "a8a.t.gz", tmp_path / "a9a.t.gz")
    with pytest.raises(DataFormatError, match="22696 training and 9865 test rows, expected 32561 and 16281"):
        load_binary("a9a", tmp_path)


def test_normalised_rows_have_unit_norm_and_zero_rows_stay() -> None:
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]], dtype=torch.float64)
    out = normalise_rows(x)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
