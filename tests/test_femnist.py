"""The LEAF FEMNIST reader: file formats, writer order and de-duplication, and the real samples."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data import load_dataset
from dpadmm.data.checks import DataError
from dpadmm.data.femnist import load_femnist, read_leaf, read_leaf_files, sample_folders
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import agent_data
from tests.corrupt import flipped, not_utf8, truncated, write_gz


def _write(path: Path, users: dict[str, list[int]], fill: float, gz: bool) -> None:
    """A LEAF JSON file: each user's images are constant ``fill`` (plus the label in pixel 0)."""
    data = {"users": list(users), "num_samples": [len(v) for v in users.values()], "user_data": {}}
    for user, labels in users.items():
        xs = [[fill] * 784 for _ in labels]
        for x, y in zip(xs, labels, strict=True):
            x[0] = y / 100
        data["user_data"][user] = {"x": xs, "y": labels}
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data)
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)


def _sample(root: Path, name: str, files: dict[int, dict[str, list[int]]], gz: bool) -> Path:
    for k, users in files.items():
        for split in ("train", "test"):
            split_users = users if split == "train" else {u: v[:1] for u, v in users.items()}
            _write(root / name / split / f"all_data_{k}_niid_05_keep_0_{split}_9.json", split_users, 1.0, gz)
    return root / name


def test_writer_order_dedup_and_formats(tmp_path: Path) -> None:
    # sample "a" (.json.gz): file 10 after file 2 (LEAF's index, not the name's order)
    _sample(tmp_path, "a", {10: {"w3": [3, 3]}, 2: {"w1": [1], "w2": [2, 2, 2]}}, gz=True)
    # sample "b" (plain .json): w2 again, cut differently; it keeps sample a's part
    _sample(tmp_path, "b", {0: {"w2": [9], "w4": [4, 4]}}, gz=False)
    folders = sample_folders(tmp_path)
    assert [f.name for f in folders] == ["a", "b"]
    assert sample_folders(f"{tmp_path / 'b'},{tmp_path / 'a'}") == [tmp_path / "b", tmp_path / "a"]
    train = read_leaf(folders, "train")
    assert list(train) == ["w1", "w2", "w3", "w4"]
    assert train["w2"].y.tolist() == [2, 2, 2]
    data = load_femnist(tmp_path)
    assert data.agent_names == ("w1", "w2", "w3", "w4") and data.agent_sizes == (1, 3, 2, 2)
    assert data.y_train.tolist() == [1, 2, 2, 2, 3, 3, 4, 4]
    assert data.y_test.tolist() == [1, 2, 3, 4]
    # 1 - x: LEAF's background 1.0 becomes 0
    assert float(data.x_train[:, 1:].abs().max()) == 0.0
    assert data.x_train[1, 0].item() == pytest.approx(1 - 0.02)
    first_two = load_femnist(tmp_path, num_agents=2)
    assert first_two.agent_names == ("w1", "w2") and first_two.num_train == 4 and first_two.num_test == 2
    with pytest.raises(ValueError, match="num-agents=5 .* 4 writers"):
        load_femnist(tmp_path, num_agents=5)


def test_bad_folders_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs data_dir"):
        load_femnist("")
    with pytest.raises(FileNotFoundError, match="holds no LEAF sample"):
        load_femnist(tmp_path)
    (tmp_path / "s" / "train").mkdir(parents=True)
    (tmp_path / "s" / "train" / "all_data_0_x.json").write_text("{not json")
    with pytest.raises(DataError, match="all_data_0_x.json line 1: not a readable LEAF JSON"):
        load_femnist(tmp_path / "s")


LEAF_FILE = "all_data_3_niid_05_keep_0_{}_9.json.gz"


@pytest.fixture(scope="module")
def leaf_file(femnist_dir: Path) -> dict:
    """The first two writers of a real LEAF training file of ../shared/data/femnist/leaf-sample-a, their
    first 10 samples each."""
    with gzip.open(femnist_dir / "leaf-sample-a" / "train" / LEAF_FILE.format("train"), "rt") as fh:
        data = json.load(fh)
    users = data["users"][:2]
    return {"users": users, "num_samples": [10, 10],
            "user_data": {u: {k: v[:10] for k, v in data["user_data"][u].items()} for u in users}}


def _writer(data: dict, change: str) -> dict:
    """A deep copy of ``data`` with its second writer's record changed as ``change`` says."""
    data = json.loads(json.dumps(data))
    user = data["users"][1]
    record = data["user_data"][user]
    if change == "nan":
        record["x"][3][100] = float("nan")  # JSON's NaN, which Python's reader accepts
    elif change == "inf":
        record["x"][3][100] = float("inf")
    elif change == "label":
        record["y"][5] = 62
    elif change == "fraction":
        record["y"][5] = 3.5
    elif change == "pixels":
        record["x"] = [row[:-1] for row in record["x"]]  # 783 values per image
    elif change == "ragged":
        record["x"][3] = record["x"][3][:-1]  # 783 values in one image
    elif change == "no y":
        del record["y"]
    elif change == "no writer":
        del data["user_data"][user]
    elif change == "count":
        data["num_samples"][1] += 1
    elif change == "no samples":
        record["x"], record["y"], data["num_samples"][1] = [], [], 0
    elif change == "no users":
        data = {"users": [], "num_samples": [], "user_data": {}}
    elif change == "no user_data":
        del data["user_data"]
    return data


@pytest.mark.parametrize(("fault", "message"), [
    ("nan", "writer {w}, image 3, pixel 100: x is nan; allowed: finite numbers"),
    ("inf", "writer {w}, image 3, pixel 100: x is inf; allowed: finite numbers"),
    ("label", "writer {w}, sample 5: y holds the label 62; allowed: 0..61 (the 62 classes)"),
    ("fraction", "writer {w}, sample 5: y holds the label 3.5; allowed: 0..61"),
    ("pixels", "writer {w}: 783 values per image, expected 784 (28 x 28 pixels)"),
    ("ragged", "writer {w}: x or y is not a rectangular list of numbers"),
    ("no y", "writer {w}: missing key(s) y (found: x); allowed: LEAF's JSON"),
    ("no writer", "writer {w}: users lists the writer but user_data has no {{x, y}} for it"),
    ("count", "writer {w}: x of shape"),
    ("no samples", "writer {w}: holds no training sample"),
    ("no users", "holds no writer (users is empty)"),
    ("no user_data", "missing key(s) user_data (found: users, num_samples)"),
    ("utf8", "line 1: byte 0xff at column 1 is not UTF-8 text"),
    ("truncated", "cannot decompress the gzip data (it ends early)"),
    ("flipped", ""),
    ("empty", "the file is empty (0 bytes)"),
])
def test_a_corrupted_leaf_file_is_refused_naming_the_file_and_writer(tmp_path: Path, femnist_dir: Path,
                                                                    leaf_file: dict, fault: str,
                                                                    message: str) -> None:
    """Two real writers of a LEAF training file, damaged one way each (the real test file beside it): a NaN
    pixel would train a model of NaNs and label 62 is no class of FEMNIST's 62."""
    sample = tmp_path / "sample"
    text = json.dumps(_writer(leaf_file, fault)).encode()
    path = write_gz(sample / "train" / LEAF_FILE.format("train"), not_utf8([text], 1) if fault == "utf8"
                    else [text])
    (sample / "test").mkdir()
    shutil.copy(femnist_dir / "leaf-sample-a" / "test" / LEAF_FILE.format("test"), sample / "test")
    {"truncated": truncated, "flipped": flipped}.get(fault, lambda p: p)(path)
    if fault == "empty":
        path.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(str(path)) + r"[ :]") as info:
        load_femnist(sample)
    assert message.format(w=leaf_file["users"][1]) in str(info.value) and "\n" not in str(info.value)
    write_gz(path, [json.dumps(leaf_file).encode()])  # the writers unchanged: they load
    assert load_femnist(sample).agent_names == tuple(leaf_file["users"])


def test_a_read_file_is_kept_by_its_content_and_a_bad_entry_is_read_again(
        tmp_path: Path, femnist_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real LEAF file, once parsed, is read back from the project's cache: the same writers, bit for bit;
    the entry is what is read (an entry changed on purpose shows through); an unreadable entry is parsed
    again and replaced; the same writers in other bytes are another entry."""
    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "cache"))
    path = femnist_dir / "leaf-sample-a" / "train" / LEAF_FILE.format("train")
    first = read_leaf_files([path])
    entries = list((tmp_path / "cache" / "parsed-leaf-v1").iterdir())
    assert [e.name for e in entries] == [f"{hashlib.sha256(path.read_bytes()).hexdigest()}.npz"]
    again = read_leaf_files([path])
    assert list(again) == list(first) and len(first) > 1
    for name, writer in first.items():
        assert np.array_equal(again[name].x, writer.x) and again[name].x.dtype == np.float32
        assert np.array_equal(again[name].y, writer.y) and again[name].y.dtype == np.int64

    with np.load(entries[0]) as saved:
        changed = dict(saved)
    changed["y"] = (changed["y"] + 1) % 62
    np.savez_compressed(entries[0], **changed)
    shifted = read_leaf_files([path])
    assert all(np.array_equal(shifted[n].y, (w.y + 1) % 62) for n, w in first.items())

    entries[0].write_bytes(b"not an npz")
    assert all(np.array_equal(read_leaf_files([path])[n].y, w.y) for n, w in first.items())
    with np.load(entries[0]) as saved:  # replaced by the parse
        assert np.array_equal(saved["y"], np.concatenate([w.y for w in first.values()]))

    other = tmp_path / path.name  # the same JSON, compressed again: other bytes
    with gzip.open(path, "rb") as src, gzip.open(other, "wb", compresslevel=1) as dst:
        dst.write(src.read())
    assert read_leaf_files([other]).keys() == first.keys()
    assert len(list((tmp_path / "cache" / "parsed-leaf-v1").iterdir())) == 2


def test_real_samples_give_the_papers_federation(femnist_dir: Path) -> None:
    config = papers(dataset="femnist", data_dir=str(femnist_dir))
    assert config.num_agents == 195 and config.rho_constants == (0.005, 0.05, 2000)
    data = load_dataset("femnist", femnist_dir, config.num_agents)
    assert len(data.agent_sizes) == 195 and data.num_classes == 62 and data.num_features == 784
    everything = load_dataset("femnist", femnist_dir)
    assert len(everything.agent_names) == 218  # the two samples share six writers
    assert everything.agent_names[:195] == data.agent_names
    # all 114 writers of sample a (the paper's own sample) come first
    sample_a = read_leaf(sample_folders(femnist_dir / "leaf-sample-a"), "train")
    assert list(sample_a) == list(data.agent_names[:114])
    assert sum(len(w.y) for w in sample_a.values()) == 15_440
    batch = agent_data(data, config, [0, 194])
    assert batch.total == data.num_train
    assert batch.counts.tolist() == [data.agent_sizes[0], data.agent_sizes[194]]
    start = sum(data.agent_sizes[:194])
    assert torch.equal(batch.x[1, : data.agent_sizes[194]], data.x_train[start:].to(batch.x.dtype))
    assert np.isclose(float(data.x_train.max()), 1.0) and float(data.x_train.min()) == 0.0
    with pytest.raises(ValueError, match="num-agents=10 does not match"):
        agent_data(data, papers(dataset="femnist", num_agents=10), [0])
