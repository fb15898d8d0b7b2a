"""One device's own data, for a deployed agent (a Flower SuperNode on the device).

In simulation every agent's data is a block of one central data set (``partition-id``).
On a real device the agent holds only its own samples, in one of three formats:

- a LEAF JSON file (``.json`` or ``.json.gz``, the layout of :mod:`dpadmm.data.femnist`):
  the writer named by ``writer``, or its only writer; pixels become ``1 - x`` as in the
  LEAF reader;
- an MNIST-style IDX pair: ``path`` the images (``[n, rows, cols]`` uint8), ``labels_path``
  the labels (raw or ``.gz``; :func:`dpadmm.data.mnist.read_idx`); pixels ``x / 255``;
- a NumPy ``.npz`` with arrays ``x`` (``[n, ...]``: uint8 pixels, scaled ``/ 255``, or
  floats already in [0, 1]) and ``y`` (integer labels).

The global sample count I, by which eq. (63) divides, is not in the device's data: the
operator passes it as a public parameter (``num-samples-total`` in the node config).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dpadmm.data.femnist import read_leaf_files
from dpadmm.data.mnist import read_idx

__all__ = ["load_node_data"]


def load_node_data(path: str | os.PathLike, *, labels_path: str | os.PathLike = "",
                   writer: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """(x float64 [n, J] in [0, 1], y int64 [n]) of one device, from LEAF JSON, IDX or npz.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file and
    what was expected for anything else (unknown format, missing writer or labels, shapes).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data-path {path} is not a file")
    name = path.name
    if name.endswith((".json", ".json.gz")):
        x, y = _leaf(path, writer)
    elif name.endswith(".npz"):
        x, y = _npz(path)
    elif "idx" in name:
        x, y = _idx(path, labels_path)
    else:
        raise ValueError(f"data-path {path}: unknown format; expected a LEAF .json/.json.gz file, an IDX "
                         "image file (with labels-path) or an .npz with arrays x and y")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"data-path {path}: {x.shape[0]} samples and {y.shape[0]} labels; need the same "
                         "number, at least one")
    if y.min() < 0:
        raise ValueError(f"data-path {path}: negative labels")
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def _leaf(path: Path, writer: str) -> tuple[np.ndarray, np.ndarray]:
    writers = read_leaf_files([path])
    if writer:
        if writer not in writers:
            listed = ", ".join(list(writers)[:5]) + (" ..." if len(writers) > 5 else "")
            raise ValueError(f"data-path {path} has no writer {writer!r}; it has {listed}")
        chosen = writers[writer]
    elif len(writers) == 1:
        chosen = next(iter(writers.values()))
    else:
        raise ValueError(f"data-path {path} holds {len(writers)} writers; name this device's one with "
                         "writer=<id> in the node config")
    return 1.0 - chosen.x.astype(np.float64), chosen.y


def _idx(path: Path, labels_path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    if not labels_path:
        raise ValueError(f"data-path {path} is an IDX image file; give its labels with labels-path")
    images, labels = read_idx(path), read_idx(Path(labels_path).expanduser())
    if images.ndim < 2 or images.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"{path}, {labels_path}: expected uint8 images [n, rows, cols] and labels [n], got "
                         f"{images.dtype} {images.shape} and {labels.shape}")
    return images.reshape(images.shape[0], -1).astype(np.float64) / 255.0, labels


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as data:
        if "x" not in data or "y" not in data:
            raise ValueError(f"data-path {path}: expected arrays x and y, found {', '.join(data.files)}")
        x, y = data["x"], data["y"]
    if not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
        raise ValueError(f"data-path {path}: y must be a 1-D integer array, got {y.dtype} {y.shape}")
    x = x.reshape(x.shape[0], -1)
    if x.dtype == np.uint8:
        return x.astype(np.float64) / 255.0, y
    x = x.astype(np.float64)
    if x.size and (x.min() < 0 or x.max() > 1):
        raise ValueError(f"data-path {path}: float x must lie in [0, 1] (or give uint8 pixels 0..255)")
    return x, y


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write a device's ``.npz`` file atomically: written beside it, then renamed into place, so an
    interrupted write never leaves a partial file that a SuperNode would read as a corrupt one."""
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
