"""dpadmm.data.vertical: column blocks, padding, MNIST 4 against 9, and a deployment's files.

The files are written from the real a9a of ../shared/data and read back: each party's file builds
exactly the party the simulation cuts from the whole data set, the labels are the data set's, and
every way a file can be wrong is refused with a message that names the file, the value and what is
allowed.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.cli import main
from dpadmm.data import Dataset
from dpadmm.data.checks import DataError
from dpadmm.data.libsvm import load_binary
from dpadmm.data.vertical import (
    MNIST_4V9_TRAIN,
    ids_digest,
    load_mnist_4v9,
    load_vertical,
    pad_blocks,
    read_labels_file,
    read_party_file,
    row_digest,
    split_columns,
    write_vertical_files,
)
from dpadmm.sharing import engine
from dpadmm.sharing.config import SharingConfig
from tests.corrupt import flipped, truncated

WIDTHS = (66, 57)


def test_blocks_are_contiguous_and_padding_adds_zero_columns() -> None:
    x = torch.arange(12.0).reshape(2, 6)
    blocks = split_columns(x, (4, 2))
    assert torch.equal(blocks[0], x[:, :4]) and torch.equal(blocks[1], x[:, 4:])
    padded, mask = pad_blocks(blocks)
    assert padded.shape == (2, 2, 4) and not padded[1, :, 2:].any()
    assert mask.tolist() == [[True] * 4, [True, True, False, False]]
    with pytest.raises(ValueError, match="cover 5 columns but the data set has 6"):
        split_columns(x, (3, 2))


def test_mnist_4v9_holds_the_4s_and_9s_in_file_order(mnist_dir: Path) -> None:
    data = load_mnist_4v9(mnist_dir)
    assert data.x_train.shape == (11791, 784) and data.x_test.shape == (1991, 784)  # 5842 + 5949, 982 + 1009
    assert int(data.y_train.sum()) == 5949 and int(data.y_test.sum()) == 1009
    assert len(data.y_train) == MNIST_4V9_TRAIN  # the count `dpadmm privacy` uses without reading the files
    with pytest.raises(ValueError, match="dataset='mnist' is not allowed; choose one of a9a, mnist-4v9"):
        load_vertical("mnist", mnist_dir)


def test_the_digest_is_of_the_ordered_ids_as_text() -> None:
    assert ids_digest(np.arange(3), np.arange(2)) == row_digest(3, 2)
    assert ids_digest(["0", "1", "2"], ["0", "1"]) == row_digest(3, 2)
    assert ids_digest([0, 2, 1], [0, 1]) != row_digest(3, 2)  # the order counts
    assert ids_digest([0, 1], [2, 0, 1]) != ids_digest([0, 1, 2], [0, 1])  # and which list an id is in
    assert ids_digest(["a,b"], ["c"]) != ids_digest(["a", "b"], ["c"])  # ids are not joined into one text
    assert len(row_digest(3, 2)) == 64


@pytest.fixture(scope="module")
def a9a_files(tmp_path_factory: pytest.TempPathFactory, binary_dir: Path) -> list[Path]:
    """The a9a files of 001's split, written once: party-0.npz, party-1.npz, labels.npz."""
    return write_vertical_files(load_binary("a9a", binary_dir / "a9a"), WIDTHS,
                                tmp_path_factory.mktemp("a9a-files"))


def test_a_party_file_builds_the_simulations_party(a9a_files: list[Path], binary_dir: Path) -> None:
    dataset = load_binary("a9a", binary_dir / "a9a")
    assert [p.name for p in a9a_files] == ["party-0.npz", "party-1.npz", "labels.npz"]
    for m, width in enumerate(WIDTHS):
        own = read_party_file(a9a_files[m], WIDTHS, m)
        assert own.x.shape == (32561, width) and own.x_test.shape == (16281, width)
        assert own.digest() == row_digest(32561, 16281)
        ours = engine.parties_from_blocks([own.x], [own.x_test], [m])
        theirs = engine.parties_of(dataset, WIDTHS, [m])
        for name in ("ids", "blocks", "test_blocks", "mask", "ridge"):
            assert torch.equal(getattr(ours, name), getattr(theirs, name)), (m, name)
        norms = torch.linalg.vector_norm(ours.blocks[0], dim=1)
        one = torch.ones((), dtype=norms.dtype)
        assert torch.allclose(norms[norms > 0], one, atol=1e-12)  # unit rows, as in simulation
    labels = read_labels_file(a9a_files[2])
    assert torch.equal(labels.y, dataset.y_train) and torch.equal(labels.y_test, dataset.y_test)
    assert labels.digest() == row_digest(32561, 16281)


def test_existing_files_are_refused_and_kept(a9a_files: list[Path], binary_dir: Path) -> None:
    before = a9a_files[0].read_bytes()
    with pytest.raises(FileExistsError, match="party-0.npz, .*party-1.npz, .*labels.npz already exist"):
        write_vertical_files(load_binary("a9a", binary_dir / "a9a"), WIDTHS, a9a_files[0].parent)
    assert a9a_files[0].read_bytes() == before


def _party(tmp_path: Path, **changes: object) -> Path:
    """A small valid party file of 3 training and 2 test samples, 2 columns, with ``changes`` (None drops)."""
    arrays: dict[str, object] = {"ids": np.array([10, 11, 12]), "x": np.ones((3, 2)),
                                 "test_ids": np.array(["t0", "t1"]), "x_test": np.ones((2, 2))}
    arrays.update(changes)
    path = tmp_path / "party.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


@pytest.mark.parametrize(("changes", "message"), [
    ({"x_test": None}, ": missing array(s) x_test (found: ids, x, test_ids); allowed: ids [N], x [N, d_m]"),
    ({"x": np.ones((3, 3))}, ": x has 3 columns but parties='4,2' gives party 1 2; allowed: this party's"),
    ({"x_test": np.ones((2, 1))}, ": x_test has 1 columns but parties='4,2' gives party 1 2"),
    ({"x": np.ones((2, 2))}, ": x has 2 rows but ids lists 3 samples; allowed: one row per id"),
    ({"x": np.ones(6)}, ": x is float64 of shape (6,); allowed: a 2-D array of real numbers [N, d_m]"),
    ({"ids": np.array([0.0, 1.0, 2.0])}, ": ids is float64 of shape (3,); allowed: a 1-D array of integers"),
    ({"ids": np.array([1, 2, 1])}, ": ids repeats 1; allowed: every sample with its own id"),
    ({"test_ids": np.array([], dtype=np.int64), "x_test": np.ones((0, 2))},
     ": holds no sample (test_ids is empty); allowed: at least one"),
    ({"ids": np.array([{"a": 1}, 2, 3], dtype=object)}, ": array ids cannot be read without pickle"),
])
def test_a_bad_party_file_is_named(tmp_path: Path, changes: dict, message: str) -> None:
    path = _party(tmp_path, **changes)
    with pytest.raises(DataError, match=re.escape(f"data-path {path}{message}")):
        read_party_file(path, (4, 2), 1)


def test_a_deployed_party_keeps_a_row_that_is_not_finite_as_a_zero_row(tmp_path: Path) -> None:
    """A refusal decided by one sample's value would tell the server about it: the party's reader keeps the
    row, and the party's row scaling (the one the simulation uses) makes it a zero row."""
    x = np.array([[1.0, 0.0], [np.nan, 1.0], [3.0, 4.0]])
    own = read_party_file(_party(tmp_path, x=x, x_test=np.array([[1.0, np.inf], [0.0, 2.0]])), (4, 2), 1)
    parties = engine.parties_from_blocks([own.x], [own.x_test], [1], torch.float64)
    assert parties.blocks[0].tolist() == [[1.0, 0.0], [0.0, 0.0], [0.6, 0.8]]
    assert parties.test_blocks[0].tolist() == [[0.0, 0.0], [0.0, 1.0]]


def test_a_party_file_that_is_missing_or_no_npz_or_of_no_party_is_named(tmp_path: Path) -> None:
    assert read_party_file(_party(tmp_path), (4, 2), 1).digest() == ids_digest([10, 11, 12], ["t0", "t1"])
    with pytest.raises(FileNotFoundError, match="data-path .*nowhere.npz is not a file; give the .npz with"):
        read_party_file(tmp_path / "nowhere.npz", (4, 2), 1)
    text = tmp_path / "party.csv"
    text.write_text("id,x\n1,0.5\n")
    with pytest.raises(DataError, match="party.csv: not a NumPy .npz file"):
        read_party_file(text, (4, 2), 1)
    single = tmp_path / "single.npy"
    np.save(single, np.ones(3))
    with pytest.raises(ValueError, match=r"single.npy: a single array \(.npy\), not an .npz"):
        read_party_file(single, (4, 2), 1)
    with pytest.raises(ValueError, match="partition-id=2 is not allowed; parties='4,2' has parties 0..1"):
        read_party_file(_party(tmp_path), (4, 2), 2)


@pytest.mark.parametrize(("changes", "message"), [
    ({"y": np.array([0, 1, -1])}, " row 2 (id 2): y holds the label -1; allowed: 0 or 1"),
    ({"y_test": np.array([0.5, 1.0])}, " row 0 (id 0): y_test holds the label 0.5; allowed: 0 or 1"),
    ({"y": np.array([0.0, np.nan, 1.0])}, " row 1 (id 1): y holds the label nan; allowed: 0 or 1"),
    ({"y": np.array([0, 1])}, ": y has 2 rows but ids lists 3 samples"),
    ({"y_test": None}, ": missing array(s) y_test (found: ids, y, test_ids)"),
])
def test_a_bad_labels_file_is_named(tmp_path: Path, changes: dict, message: str) -> None:
    arrays: dict[str, object] = {"ids": np.arange(3), "y": np.array([0, 1, 1]), "test_ids": np.arange(2),
                                 "y_test": np.array([True, False])}
    path = tmp_path / "labels.npz"
    np.savez(path, **{k: v for k, v in {**arrays, **changes}.items() if v is not None})
    with pytest.raises(DataError, match=re.escape(f"labels-path {path}{message}")):
        read_labels_file(path)


@pytest.mark.parametrize("fault", [truncated, flipped])
@pytest.mark.parametrize("index", [0, 2])
def test_a_damaged_copy_of_a_real_file_is_named(tmp_path: Path, a9a_files: list[Path], index: int,
                                                fault: object) -> None:
    """A party's or the server's real a9a file, cut short or with a byte flipped: one line naming it."""
    path = fault(Path(shutil.copy(a9a_files[index], tmp_path / a9a_files[index].name)))  # type: ignore[operator]
    key = "labels-path" if index == 2 else "data-path"
    with pytest.raises(DataError, match=re.escape(f"{key} {path}: ") + ".*damaged") as info:
        read_labels_file(path) if index == 2 else read_party_file(path, WIDTHS, 0)
    assert "\n" not in str(info.value)


def test_nothing_is_written_that_no_run_could_use(tmp_path: Path, binary_dir: Path) -> None:
    """The widths must cover the columns exactly, and the arrays pass the readers' checks, before any file is
    written: a data set with a NaN (which a Dataset built by hand may hold) leaves the folder untouched."""
    a9a = load_binary("a9a", binary_dir / "a9a")
    with pytest.raises(ValueError, match="parties='60,60' cover 120 columns but the data set has 123"):
        write_vertical_files(a9a, (60, 60), tmp_path / "widths")
    x = a9a.x_train[:200].clone()
    x[17, 70] = float("nan")
    bad = Dataset("a9a", x, a9a.y_train[:200], a9a.x_test[:50], a9a.y_test[:50], num_classes=2)
    message = f"{tmp_path / 'nan' / 'party-1.npz'} row 17 (id 17), column 4: x is nan; allowed: finite"
    with pytest.raises(DataError, match=re.escape(message)):
        write_vertical_files(bad, WIDTHS, tmp_path / "nan")
    assert not (tmp_path / "widths").exists() and not (tmp_path / "nan").exists()


def test_a_good_labels_file_reads_as_0_1(tmp_path: Path) -> None:
    path = tmp_path / "labels.npz"
    np.savez(path, ids=np.arange(3), y=np.array([0.0, 1.0, 1.0]), test_ids=np.arange(2),
             y_test=np.array([True, False]))
    labels = read_labels_file(path)
    assert labels.y.tolist() == [0, 1, 1] and labels.y_test.tolist() == [1, 0]
    assert labels.y.dtype == torch.int64 and labels.digest() == row_digest(3, 2)


def test_the_engine_refuses_a_labels_path(binary_dir: Path) -> None:
    """labels-path is the deployed server's file; the engine reads the whole data set and says so."""
    config = SharingConfig(data_dir=str(binary_dir / "a9a"), labels_path="/srv/labels.npz")
    with pytest.raises(ValueError, match="labels-path='/srv/labels.npz' is not allowed here; it is"):
        engine.load(config)


def test_cli_writes_the_files_and_says_where_they_go(tmp_path: Path, binary_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "files"
    assert main(["deploy", "vertical", "--dataset", "a9a", "--data-dir", str(binary_dir / "a9a"),
                 "--parties", "100,23", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"partition-id=1 data-path='{(out / 'party-1.npz').resolve()}'" in printed
    assert f"sharing.parties='100,23' sharing.labels-path='{(out / 'labels.npz').resolve()}'" in printed
    assert read_party_file(out / "party-1.npz", (100, 23), 1).x.shape == (32561, 23)
    assert main(["deploy", "vertical", "--data-dir", str(binary_dir / "a9a"), "--out", str(out)]) == 2
    assert "already exist" in capsys.readouterr().err
    assert main(["deploy", "vertical", "--data-dir", str(binary_dir / "a9a"), "--parties", "60,60",
                 "--out", str(tmp_path / "other")]) == 2
    assert "parties='60,60' cover 120 columns but the data set has 123" in capsys.readouterr().err
