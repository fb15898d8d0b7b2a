"""One device's own data (deployment): LEAF JSON, IDX pair and npz, on the real files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data import load_dataset
from dpadmm.data.femnist import read_leaf_files
from dpadmm.data.node import load_node_data


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
    with pytest.raises(ValueError, match="not a LEAF JSON"):
        load_node_data(tmp_path / "x.json.gz")
