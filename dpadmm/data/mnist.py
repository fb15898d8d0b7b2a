"""MNIST from the four standard IDX files (raw or gzip-compressed).

:func:`read_idx` reads any IDX file; :func:`load_mnist` finds and reads the four MNIST
files in a folder and returns a :class:`~dpadmm.data.Dataset` named ``"mnist"``, keeping
the training order of the file (the papers' split into agents depends on it).

Files are looked up by :func:`find_mnist_files`, which raises :class:`MnistFilesMissing`
(a ``FileNotFoundError`` carrying the list of missing names). This module never touches
the network; that is the seam the download uses: :func:`dpadmm.data.download.ensure_mnist`
catches ``MnistFilesMissing``, fetches ``e.missing`` (as ``<name>.gz``) into the folder,
checks their MD5 and renames them into place, after which :func:`load_mnist` finds all four.
``load_dataset("mnist", data_dir)`` chooses the folder with
:func:`dpadmm.data.download.mnist_folder`.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from dpadmm.data import Dataset, _dataset_from_pixels

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

_GZIP_MAGIC = b"\x1f\x8b"


class IdxFormatError(ValueError):
    """A file is not a well-formed IDX file (bad magic number, truncated, trailing bytes, bad gzip)."""


class MnistFilesMissing(FileNotFoundError):
    """Some of the four MNIST files are not in the folder; ``missing`` lists their base names."""

    def __init__(self, message: str, data_dir: Path, missing: list[str]) -> None:
        super().__init__(message)
        self.data_dir = data_dir
        self.missing = missing


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it starts with the gzip magic bytes 1f 8b."""
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != _GZIP_MAGIC:
            return f.read()
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                return g.read()
        except (EOFError, OSError, zlib.error) as e:
            # EOFError: the gzip stream is cut short; BadGzipFile (an OSError) / zlib.error: corrupt.
            raise IdxFormatError(
                f"{path}: cannot decompress the gzip data ({e}); the file is damaged or truncated"
            ) from e


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip-compressed, detected by its first bytes) into a numpy array.

    The format: two zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), the number of dimensions; then each dimension as a
    big-endian int32; then the data, big-endian, in C order. The result has the file's
    shape and the type in native byte order, and is a fresh, writable array.

    Raises :class:`IdxFormatError` (a ``ValueError``) naming the path and what was expected
    for a bad magic number, an unknown type code, a truncated file or trailing bytes.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise IdxFormatError(
            f"{path}: truncated IDX file: {len(data)} bytes, expected at least the 4-byte magic number"
        )
    magic = data[:4]
    if magic[0] != 0 or magic[1] != 0:
        raise IdxFormatError(
            f"{path}: not an IDX file: magic number 0x{magic.hex()} does not start with two zero bytes "
            "(expected 0x0000TTDD: type code TT, number of dimensions DD)"
        )
    code, ndim = magic[2], magic[3]
    dtype = _IDX_DTYPES.get(code)
    if dtype is None:
        known = ", ".join(f"0x{c:02X} {d.name}" for c, d in _IDX_DTYPES.items())
        raise IdxFormatError(
            f"{path}: not an IDX file: magic number 0x{magic.hex()} has unknown type code 0x{code:02X} "
            f"(expected one of {known})"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxFormatError(
            f"{path}: truncated IDX file: {len(data)} bytes, expected a header of {header} bytes "
            f"(magic number and {ndim} dimensions)"
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    if any(d < 0 for d in shape):
        raise IdxFormatError(f"{path}: IDX header has a negative dimension: {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    expected = header + count * dtype.itemsize
    if len(data) < expected:
        raise IdxFormatError(
            f"{path}: truncated IDX file: {len(data)} bytes, expected {expected} "
            f"(header {header} + {count} values of {dtype.name} for shape {shape})"
        )
    if len(data) > expected:
        raise IdxFormatError(
            f"{path}: {len(data) - expected} unexpected trailing bytes after the IDX data "
            f"(expected {expected} bytes in all for shape {shape} of {dtype.name})"
        )
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
        raise IdxFormatError(
            f"{image_path}: expected uint8 images of shape [N, rows, cols], got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise IdxFormatError(
            f"{label_path}: expected uint8 labels of shape [N], got {labels.dtype} {labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{image_path} has {images.shape[0]} images but {label_path} has {labels.shape[0]} labels"
        )
    if labels.size and int(labels.max()) >= MNIST_NUM_CLASSES:
        raise ValueError(
            f"{label_path}: label {int(labels.max())} is out of range 0..{MNIST_NUM_CLASSES - 1}"
        )


def load_mnist(data_dir: str | os.PathLike) -> Dataset:
    """Load MNIST from the four IDX files in ``data_dir`` (each raw or ``.gz``).

    Returns a :class:`~dpadmm.data.Dataset` named ``"mnist"``: 60,000 training and 10,000
    test images flattened to 784 float64 values ``x / 255.0`` (as the papers' reference
    code), int64 labels 0..9. The training order is the file's order, unchanged.

    Raises :class:`MnistFilesMissing` when files are missing, :class:`IdxFormatError` for a
    malformed file, ``ValueError`` when images and labels do not match.
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
        raise ValueError(
            f"{train_images_path} has images of {train_images.shape[1:]} but "
            f"{test_images_path} has {test_images.shape[1:]}"
        )
    return _dataset_from_pixels(
        "mnist", train_images, train_labels, test_images, test_labels, MNIST_NUM_CLASSES
    )
