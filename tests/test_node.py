"""One device's own data (deployment): LEAF JSON, IDX pair and npz, on the real files."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data import load_dataset
from dpadmm.data.checks import DataError
from dpadmm.data.femnist import read_leaf_files
from dpadmm.data.mnist import read_idx
from dpadmm.data.node import load_node_data
from tests.corrupt import flipped, truncated


def _leaf_file(femnist_dir: Path) -> Path:
    return sorted((femnist_dir / "leaf-sample-a" / "train").glob("*.json.gz"))[0]


def test_leaf_writer_file(femnist_dir: Path, tmp_path: Path) -> None:
    path = _leaf_file(femnist_dir)
    writers = read_leaf_files([path])
    name, writer = next(iter(writers.items()))
    x, y = load_node_data(path, writer=name)
    assert torch.equal(y, torch.from_numpy(writer.y))
    assert torch.allclose(x, torch.from_numpy(1.0 - writer.x.astype(np.float64)))
    with pytest.raises(ValueError, match="writer=<id>"):
        load_node_data(path)
    with pytest.raises(ValueError, match="no writer 'nobody'"):
        load_node_data(path, writer="nobody")
    # a device's file with its one writer needs no name
    one = tmp_path / "mine.json"
    one.write_text(json.dumps({"users": [name], "num_samples": [len(writer.y)],
                               "user_data": {name: {"x": writer.x.tolist(), "y": writer.y.tolist()}}}))
    x1, y1 = load_node_data(one)
    assert torch.equal(y1, y) and torch.allclose(x1, x, atol=1e-7)


def test_idx_pair_and_npz(mnist_dir: Path, tmp_path: Path) -> None:
    mnist = load_dataset("mnist", mnist_dir)
    images, labels = mnist_dir / "t10k-images-idx3-ubyte.gz", mnist_dir / "t10k-labels-idx1-ubyte.gz"
    x, y = load_node_data(images, labels_path=labels)
    assert torch.equal(x, mnist.x_test) and torch.equal(y, mnist.y_test)
    with pytest.raises(ValueError, match="labels-path"):
        load_node_data(images)
    pixels = np.rint(mnist.x_test[:50].numpy() * 255).astype(np.uint8)
    np.savez(tmp_path / "d.npz", x=pixels.reshape(50, 28, 28), y=mnist.y_test[:50].numpy())
    xn, yn = load_node_data(tmp_path / "d.npz")
    assert torch.equal(xn, mnist.x_test[:50]) and torch.equal(yn, mnist.y_test[:50])
    np.savez(tmp_path / "bad.npz", x=pixels * 2.0, y=mnist.y_test[:50].numpy())
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        load_node_data(tmp_path / "bad.npz")


def test_missing_and_unknown_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere.npz"):
        load_node_data(tmp_path / "nowhere.npz")
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="unknown format"):
        load_node_data(tmp_path / "data.csv")
    with gzip.open(tmp_path / "x.json.gz", "wt") as fh:
        fh.write("{}")
    message = "x.json.gz: missing key(s) users, user_data (found: none); allowed: LEAF's JSON"
    with pytest.raises(DataError, match=re.escape(message)):
        load_node_data(tmp_path / "x.json.gz")


@pytest.fixture
def device_npz(mnist_dir: Path, tmp_path: Path) -> dict[str, np.ndarray]:
    """A device's arrays: the real first 50 MNIST test images (uint8) and labels."""
    images = read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")[:50]
    labels = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")[:50].astype(np.int64)
    return {"x": images, "y": labels}


def _floats(arrays: dict[str, np.ndarray], row: int, column: int, value: float) -> dict[str, np.ndarray]:
    x = arrays["x"].reshape(50, -1) / 255.0
    x[row, column] = value
    return {**arrays, "x": x}


@pytest.mark.parametrize(("fault", "message"), [
    ("nan", "row 7, column 300: x is nan; allowed: finite numbers"),
    ("inf", "row 7, column 300: x is inf; allowed: finite numbers"),
    ("range", "row 7, column 300: x is 1.5; float x must lie in [0, 1]"),
    ("negative", "row 9: y holds the label -1; allowed: integers >= 0"),
    ("fraction", "row 9: y holds the label 0.5; allowed: integers >= 0"),
    ("classes", "row 9: y holds the label 10; allowed: 0..9 (the 10 classes)"),
    ("no y", "missing array(s) y (found: x); allowed: x [n, J] or [n, rows, cols]"),
    ("flat x", "x is uint8 of shape (39200,); allowed: x [n, J]"),
    ("labels", "50 samples and 49 labels; allowed: one label per sample"),
    ("no samples", "holds no sample; allowed: at least one"),
    ("truncated", "not a NumPy .npz file, or a cut-off or damaged one"),
    ("flipped", "damaged"),
    ("empty", "the file is empty (0 bytes)"),
])
def test_a_bad_npz_is_refused_naming_the_file_and_sample(tmp_path: Path, device_npz: dict[str, np.ndarray],
                                                         fault: str, message: str) -> None:
    """A NaN pixel would make a model of NaNs, label 10 a class the model lacks, 0.5 a label read as 0."""
    arrays = dict(device_npz)
    if fault in ("nan", "inf", "range"):
        arrays = _floats(arrays, 7, 300, {"nan": np.nan, "inf": np.inf, "range": 1.5}[fault])
    elif fault in ("negative", "fraction", "classes"):
        y = arrays["y"].astype(np.float64 if fault == "fraction" else np.int64)
        y[9] = {"negative": -1, "fraction": 0.5, "classes": 10}[fault]
        arrays["y"] = y
    elif fault == "no y":
        del arrays["y"]
    elif fault == "flat x":
        arrays["x"] = arrays["x"].reshape(-1)
    elif fault == "labels":
        arrays["y"] = arrays["y"][:-1]
    elif fault == "no samples":
        arrays = {"x": arrays["x"][:0], "y": arrays["y"][:0]}
    path = tmp_path / "device.npz"
    np.savez_compressed(path, **arrays)
    {"truncated": truncated, "flipped": flipped}.get(fault, lambda p: p)(path)
    if fault == "empty":
        path.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(f"data-path {path}") + r"[ :]") as info:
        load_node_data(path, num_classes=10 if fault == "classes" else None)
    assert message in str(info.value) and "\n" not in str(info.value)
    np.savez_compressed(path, **device_npz)  # the same device's good file loads, its labels inside 10 classes
    assert load_node_data(path, num_classes=10)[0].shape == (50, 784)


def test_a_damaged_idx_or_leaf_file_of_a_device_is_named(mnist_dir: Path, femnist_dir: Path,
                                                         tmp_path: Path) -> None:
    images = mnist_dir / "t10k-images-idx3-ubyte.gz"
    labels = truncated(Path(shutil.copyfile(mnist_dir / "t10k-labels-idx1-ubyte.gz", tmp_path / "labels.gz")))
    with pytest.raises(DataError, match=re.escape(f"{labels}: cannot decompress the gzip data")):
        load_node_data(images, labels_path=labels)
    with gzip.open(_leaf_file(femnist_dir), "rt") as fh:
        data = json.load(fh)
    user = data["users"][0]
    data["user_data"][user]["x"][2][5] = float("nan")
    leaf = tmp_path / "writer.json"
    leaf.write_text(json.dumps(data))
    with pytest.raises(DataError, match=re.escape(f"{leaf} writer {user}, image 2, pixel 5: x is nan")):
        load_node_data(leaf, writer=user)
