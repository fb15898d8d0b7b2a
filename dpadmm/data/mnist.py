"""MNIST from the four standard IDX files (raw or gzip-compressed).

:func:`read_idx` reads any IDX file; :func:`load_mnist` finds and reads the four MNIST
files in a folder and returns a :class:`~dpadmm.data.Dataset` named ``"mnist"``, keeping
the training order of the file (the papers' split into agents depends on it).

Files are looked up by :func:`find_mnist_files`, which raises :class:`MnistFilesMissing`
(a ``FileNotFoundError`` carrying the list of missing names). This module never touches
the network; :func:`dpadmm.data.download.fetch` fetches the files a folder lacks (as
``<name>.gz``), checked by SHA-256, after which :func:`load_mnist` finds all four.
``load_dataset("mnist", data_dir)`` chooses the folder with
:func:`dpadmm.data.download.mnist_folder`, which asks :func:`find_mnist_files` first.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dpadmm.data import Dataset, _dataset_from_pixels
from dpadmm.data.checks import DataError, read_bytes, require_labels, require_nonempty

__all__ = ["MNIST_FILES", "IdxFormatError", "MnistFilesMissing", "find_mnist_files", "load_mnist", "read_idx"]

# The four files, in the order train images, train labels, test images, test labels.
MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

MNIST_NUM_CLASSES = 10

# IDX type codes -> big-endian numpy dtypes.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}



class IdxFormatError(DataError):
    """A file is not a well-formed IDX file (bad magic number, truncated, trailing bytes)."""


class MnistFilesMissing(FileNotFoundError):
    """Some of the four MNIST files are not in the folder; ``missing`` lists their base names."""

    def __init__(self, message: str, data_dir: Path, missing: list[str]) -> None:
        super().__init__(message)
        self.data_dir = data_dir
        self.missing = missing


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed, detected by its first bytes) into a numpy array.

    The format: two zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), the number of dimensions; then each dimension as a
    big-endian int32; then the data, big-endian, in C order. The result has the file's
    shape and the type in native byte order, and is a fresh, writable array.

    Raises :class:`IdxFormatError` (a :class:`~dpadmm.data.checks.DataError`) naming the path
    and what was expected for a bad magic number, an unknown type code, a truncated file or
    trailing bytes; a ``DataError`` for an empty file or a cut-off or damaged gzip stream.
    """
    path = Path(path)
    data = read_bytes(path)
    if len(data) < 4:
        raise IdxFormatError(path, f"truncated IDX file: {len(data)} bytes, expected at least the 4-byte "
                                   "magic number")
    magic = data[:4]
    if magic[0] != 0 or magic[1] != 0:
        raise IdxFormatError(path, f"not an IDX file: magic number 0x{magic.hex()} does not start with two "
                                   "zero bytes (expected 0x0000TTDD: type code TT, number of dimensions DD)")
    code, ndim = magic[2], magic[3]
    dtype = _IDX_DTYPES.get(code)
    if dtype is None:
        known = ", ".join(f"0x{c:02X} {d.name}" for c, d in _IDX_DTYPES.items())
        raise IdxFormatError(path, f"not an IDX file: magic number 0x{magic.hex()} has unknown type code "
                                   f"0x{code:02X} (expected one of {known})")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxFormatError(path, f"truncated IDX file: {len(data)} bytes, expected a header of {header} "
                                   f"bytes (magic number and {ndim} dimensions)")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    if any(d < 0 for d in shape):
        raise IdxFormatError(path, f"IDX header has a negative dimension: {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    expected = header + count * dtype.itemsize
    if len(data) < expected:
        raise IdxFormatError(path, f"truncated IDX file: {len(data)} bytes, expected {expected} (header "
                                   f"{header} + {count} values of {dtype.name} for shape {shape})")
    if len(data) > expected:
        raise IdxFormatError(path, f"{len(data) - expected} unexpected trailing bytes after the IDX data "
                                   f"(expected {expected} bytes in all for shape {shape} of {dtype.name})")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def find_mnist_files(data_dir: str | os.PathLike) -> dict[str, Path]:
    """Map each name of :data:`MNIST_FILES` to its file in ``data_dir``, raw or ``.gz``.

    When both exist the raw file is taken (no decompression). Raises
    :class:`MnistFilesMissing` listing exactly the missing files and the folder searched,
    ``NotADirectoryError``/``FileNotFoundError`` if ``data_dir`` is not a folder.
    """
    folder = Path(data_dir).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"MNIST folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"MNIST folder {folder} is not a folder")
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in MNIST_FILES:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                found[name] = candidate
                break
        else:
            missing.append(name)
    if missing:
        listed = ", ".join(f"{name}[.gz]" for name in missing)
        raise MnistFilesMissing(
            f"MNIST file(s) missing in {folder.resolve()}: {listed} "
            f"(need all of {', '.join(MNIST_FILES)}, each raw or .gz)",
            folder,
            missing,
        )
    return found


def _check_pair(images: np.ndarray, labels: np.ndarray, image_path: Path, label_path: Path) -> None:
    if images.ndim != 3 or images.dtype != np.uint8:
        raise IdxFormatError(image_path, "expected uint8 images of shape [N, rows, cols], got "
                                         f"{images.dtype} {images.shape}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise IdxFormatError(label_path, f"expected uint8 labels of shape [N], got {labels.dtype} "
                                         f"{labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(image_path, f"{images.shape[0]} images but {label_path} has {labels.shape[0]} "
                                    "labels; allowed: one label per image")
    require_nonempty(labels.shape[0], label_path, "labels")
    require_labels(labels, MNIST_NUM_CLASSES, label_path, "the file", lambda i: f"record {i[0]}")


def load_mnist(data_dir: str | os.PathLike) -> Dataset:
    """Load MNIST from the four IDX files in ``data_dir`` (each raw or ``.gz``).

    Returns a :class:`~dpadmm.data.Dataset` named ``"mnist"``: 60,000 training and 10,000
    test images flattened to 784 float64 values ``x / 255.0`` (as the papers' reference
    code), int64 labels 0..9. The training order is the file's order, unchanged.

    Raises :class:`MnistFilesMissing` when files are missing, :class:`IdxFormatError` for a
    malformed file, :class:`~dpadmm.data.checks.DataError` for a damaged or empty one, images and
    labels that do not match, and labels outside 0..9.
    """
    paths = find_mnist_files(data_dir)
    train_images_path, train_labels_path, test_images_path, test_labels_path = (paths[n] for n in MNIST_FILES)
    train_images = read_idx(train_images_path)
    train_labels = read_idx(train_labels_path)
    test_images = read_idx(test_images_path)
    test_labels = read_idx(test_labels_path)
    _check_pair(train_images, train_labels, train_images_path, train_labels_path)
    _check_pair(test_images, test_labels, test_images_path, test_labels_path)
    if train_images.shape[1:] != test_images.shape[1:]:
        raise DataError(test_images_path, f"images of {test_images.shape[1:]} but {train_images_path} has "
                                          f"{train_images.shape[1:]}; allowed: the training images' size")
    return _dataset_from_pixels(
        "mnist", train_images, train_labels, test_images, test_labels, MNIST_NUM_CLASSES
    )
