"""One device's own data, for a deployed agent (a Flower SuperNode on the device).

In simulation every agent's data is a block of one central data set (``partition-id``).
On a real device the agent holds only its own samples, in one of three formats:

- a LEAF JSON file (``.json`` or ``.json.gz``, the layout of :mod:`dpadmm.data.femnist`):
  the writer named by ``writer``, or its only writer; pixels become ``1 - x`` as in the
  LEAF reader;
- an MNIST-style IDX pair: ``path`` the images (``[n, rows, cols]`` uint8), ``labels_path``
  the labels (raw or ``.gz``; :func:`dpadmm.data.mnist.read_idx`); pixels ``x / 255``;
- a NumPy ``.npz`` with arrays ``x`` (``[n, J]`` or ``[n, rows, cols]``: uint8 pixels, scaled
  ``/ 255``, or floats already in [0, 1]) and ``y`` (integer labels).

Whatever the format, the samples are checked alike (:func:`check_samples`): finite values in
[0, 1], one integer label >= 0 per sample (below ``num_classes`` when given), at least one sample.

The global sample count I, by which eq. (63) divides, is not in the device's data: the
operator passes it as a public parameter (``num-samples-total`` in the node config).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dpadmm.data.checks import (
    DataError,
    load_npz,
    require_array,
    require_finite,
    require_labels,
    require_nonempty,
)
from dpadmm.data.femnist import read_leaf_files
from dpadmm.data.mnist import read_idx

__all__ = ["check_samples", "load_device_data", "load_node_data", "sound_rows"]

_NPZ_LAYOUT = "x [n, J] or [n, rows, cols] (uint8 pixels, or floats in [0, 1]) and y [n] (integer labels)"


def load_node_data(path: str | os.PathLike, *, labels_path: str | os.PathLike = "", writer: str = "",
                   num_classes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float64 [n, J] in [0, 1], y int64 [n]) of one device, from LEAF JSON, IDX or npz.

    ``num_classes`` K, when given, limits the labels to 0..K-1 (else any label >= 0). Raises
    ``FileNotFoundError`` for a missing file and a :class:`~dpadmm.data.checks.DataError` (a
    ``ValueError``) naming the file, the record and what is allowed for anything else (unknown format,
    missing writer, labels or arrays, a damaged file, shapes, values that are not finite or outside
    [0, 1], labels outside the classes, no sample).
    """
    path = Path(path).expanduser()
    x, y = _read(path, labels_path, writer)
    x, y = check_samples(x, y, f"data-path {path}", num_classes)
    return torch.from_numpy(x), torch.from_numpy(y)


def load_device_data(path: str | os.PathLike, *, labels_path: str | os.PathLike = "", writer: str = "",
                     num_classes: int, keep_count: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(x, y, the number of rows set aside) of a deployed device, as :func:`load_node_data` reads them, except
    that a row failing the per-row checks (:func:`sound_rows`) is dropped, not refused; with ``keep_count``
    (a family whose agents hold a fixed, public number of samples: 004) it becomes a zero row of label 0
    instead, which adds nothing to a clipped or unit-row gradient.

    Why: the device answers a server it does not trust, and a refusal decided by one sample (a label outside
    the run's classes, a pixel that is not finite) would tell the server about that sample outside any
    release. Dropping looks at each row alone, so neighbouring files stay neighbours (a replaced row dropped
    is a row removed, which the clipped sensitivity covers); the count goes to the device's own log only.
    A file that cannot be read at all, or that keeps no row, is still refused (a fault of the file)."""
    path = Path(path).expanduser()
    x, y = _read(path, labels_path, writer)
    if x.shape[0] != y.shape[0]:
        raise DataError(f"data-path {path}", "as many labels as samples are needed; allowed: one label per "
                                             "sample")
    keep = sound_rows(x, y, num_classes)
    if x.shape[0] and not keep.any():  # the file's fault: no row this run could learn from
        raise DataError(f"data-path {path}", f"holds no usable sample; allowed: rows in [0, 1] with labels "
                                             f"0..{num_classes - 1}")
    if keep_count:
        x, y = np.where(keep[:, None], x.reshape(x.shape[0], -1), 0.0), np.where(keep, y, 0)
    else:
        x, y = x[keep], y[keep]
    x, y = check_samples(x, y, f"data-path {path}", num_classes)
    return torch.from_numpy(x), torch.from_numpy(y), int((~keep).sum())


def _read(path: Path, labels_path: str | os.PathLike, writer: str) -> tuple[np.ndarray, np.ndarray]:
    """The file's (x, y) by its format, before any check of its values."""
    if not path.is_file():
        raise FileNotFoundError(f"data-path {path} is not a file")
    name = path.name
    if name.endswith((".json", ".json.gz")):
        return _leaf(path, writer)
    if name.endswith(".npz"):
        return _npz(path)
    if "idx" in name:
        return _idx(path, labels_path)
    raise DataError(f"data-path {path}", "unknown format; allowed: a LEAF .json/.json.gz file, an IDX image "
                                         "file (with labels-path) or an .npz with arrays x and y")


def sound_rows(x: np.ndarray, y: np.ndarray, num_classes: int) -> np.ndarray:
    """[n] bool: the rows :func:`check_samples` accepts, each judged alone (x finite and in [0, 1], its label
    a whole number in 0..K-1)."""
    y = np.asarray(y)
    if y.dtype.kind not in "biuf":
        return np.zeros(y.shape[0], dtype=bool)
    with np.errstate(invalid="ignore"):
        labels = (y >= 0) & (y <= num_classes - 1) & (np.floor(y) == y if y.dtype.kind == "f" else True)
        flat = x.reshape(x.shape[0], -1)
        pixels = (np.isfinite(flat) & (flat >= 0) & (flat <= 1)).all(axis=1)
    return np.asarray(labels & pixels, dtype=bool)


def check_samples(x: np.ndarray, y: np.ndarray, source: str, num_classes: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y as int64) when they are samples an agent can learn from, else a DataError naming ``source``
    and the first bad sample: as many labels as samples and at least one, x finite and in [0, 1], labels
    integers in 0..K-1 (``num_classes`` K; None: >= 0).

    Every check is row by row, so rows of a set that passes pass too: what `dpadmm deploy agents` relies
    on when it checks the whole training set before cutting it into the agents' files."""
    if x.shape[0] != y.shape[0]:
        raise DataError(source, f"{x.shape[0]} samples and {y.shape[0]} labels; allowed: one label per "
                                "sample")
    require_nonempty(x.shape[0], source, "sample")
    require_finite(x, source, "x")
    if x.size and (x.min() < 0 or x.max() > 1):
        row, column = np.argwhere((x < 0) | (x > 1))[0]
        raise DataError(source, f"x is {x[row, column].item()!r}; float x must lie in [0, 1] (or give uint8 "
                                "pixels 0..255)", f"row {row}, column {column}")
    return x, require_labels(y, num_classes, source)


def _leaf(path: Path, writer: str) -> tuple[np.ndarray, np.ndarray]:
    writers = read_leaf_files([path])
    if writer:
        if writer not in writers:
            listed = ", ".join(list(writers)[:5]) + (" ..." if len(writers) > 5 else "")
            raise DataError(f"data-path {path}", f"no writer {writer!r}; allowed: one of {listed}")
        chosen = writers[writer]
    elif len(writers) == 1:
        chosen = next(iter(writers.values()))
    else:
        raise DataError(f"data-path {path}", f"holds {len(writers)} writers; name this device's one with "
                                             "writer=<id> in the node config")
    return 1.0 - chosen.x.astype(np.float64), chosen.y


def _idx(path: Path, labels_path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    if not labels_path:
        raise DataError(f"data-path {path}", "an IDX image file; give its labels with labels-path")
    images, labels = read_idx(path), read_idx(Path(labels_path).expanduser())
    if images.ndim < 2 or images.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(f"data-path {path}", f"uint8 images [n, rows, cols] and labels [n] expected, got "
                                             f"{images.dtype} {images.shape} and labels {labels.shape}")
    return images.reshape(images.shape[0], -1).astype(np.float64) / 255.0, labels


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    source = f"data-path {path}"
    arrays = load_npz(path, ("x", "y"), _NPZ_LAYOUT, source)
    x, y = arrays["x"], arrays["y"]
    require_array(x, (2, 3), source, "x", _NPZ_LAYOUT)
    require_array(y, 1, source, "y", _NPZ_LAYOUT)
    x = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))  # [n, rows, cols] -> [n, J]; also for n = 0
    if x.dtype == np.uint8:
        return x.astype(np.float64) / 255.0, y
    return x.astype(np.float64), y

