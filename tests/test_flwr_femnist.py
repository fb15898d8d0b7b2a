"""load_flwr_femnist on a real local copy: LEAF's FEMNIST writers laid out as flwrlabs/femnist.

No download and no mocks: the test builds a ``datasets.Dataset`` with flwrlabs/femnist's
columns (image, writer_id, hsf_id, character) from the real LEAF files of
``../shared/data/femnist/leaf-sample-a``, writes it as parquet, and gives it to
:func:`load_flwr_femnist` as ``dataset="parquet"`` (Flower Datasets passes the rest to
``datasets.load_dataset``), with the Hugging Face cache in a temporary folder and the
network switched off.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from dpadmm.data import Dataset
from dpadmm.data.checks import DataError
from dpadmm.data.femnist import Writer, read_leaf, sample_folders
from dpadmm.data.flwr_femnist import load_flwr_femnist
from tests.conftest import data_root

# One LEAF file pair (its writers' train and test parts) keeps reading fast; file 3 has six
# writers, one of them small (f3915_05: 3 train samples in LEAF).
FILE_INDEX = 3
NUM_WRITERS = 6
# A real image under a made-up writer id that sorts last: a writer with one sample.
SINGLE = "zz_single"


@pytest.fixture(scope="module")
def leaf_writers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Writer]:
    """NUM_WRITERS real LEAF writers (train and test joined) plus SINGLE, in LEAF order."""
    real = data_root(("femnist", "femnist/leaf-sample-a/train")) / "femnist" / "leaf-sample-a"
    sample = tmp_path_factory.mktemp("leaf") / "sample"
    for split in ("train", "test"):
        (sample / split).mkdir(parents=True)
        name = f"all_data_{FILE_INDEX}_niid_05_keep_0_{split}_9.json.gz"
        shutil.copy(real / split / name, sample / split / name)
    folders = sample_folders(sample)
    train, test = read_leaf(folders, "train"), read_leaf(folders, "test")
    names = list(train)[:NUM_WRITERS]
    assert len(names) == NUM_WRITERS, f"LEAF file {FILE_INDEX} has only {len(names)} writers"
    assert names != sorted(names), "the test wants writers whose LEAF order is not their sorted order"
    writers = {n: Writer(n, np.concatenate([train[n].x, test[n].x]), np.concatenate([train[n].y, test[n].y]))
               for n in names}
    first = writers[names[0]]
    writers[SINGLE] = Writer(SINGLE, first.x[:1].copy(), first.y[:1].copy())
    return writers


def _write_parquet(writers: dict[str, Writer], path: Path, fault: str = "") -> Path:
    """The writers as one flwrlabs/femnist-like "train" split in a parquet file; ``fault`` "label" gives the
    last writer's first sample the label 62, "column" leaves out the labels' column."""
    rows: dict[str, list] = {"image": [], "writer_id": [], "hsf_id": [], "character": []}
    for writer in writers.values():
        pixels = np.rint(writer.x * 255.0).astype(np.uint8).reshape(-1, 28, 28)  # LEAF polarity, 0..255
        rows["image"].extend(list(pixels))
        rows["writer_id"].extend([writer.name] * len(writer.y))
        rows["hsf_id"].extend([0] * len(writer.y))
        rows["character"].extend(writer.y.tolist())
    features = {
        "image": datasets.Image(),
        "writer_id": datasets.Value("string"),
        "hsf_id": datasets.Value("int64"),
        # a ClassLabel could not hold 62, a plain integer column can
        "character": datasets.Value("int64") if fault == "label" else datasets.ClassLabel(num_classes=62),
    }
    if fault == "label":
        rows["character"][-len(writers[SINGLE].y)] = 62
    elif fault == "column":
        del rows["character"], features["character"]
    datasets.Dataset.from_dict(rows, features=datasets.Features(features)).to_parquet(str(path))
    return path


@pytest.fixture(scope="module")
def parquet_file(leaf_writers: dict[str, Writer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The writers as one flwrlabs/femnist-like "train" split in a parquet file."""
    return _write_parquet(leaf_writers, tmp_path_factory.mktemp("flwr-femnist") / "train.parquet")


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private Hugging Face cache, no network and no Flower telemetry, for this module's tests."""
    import datasets.config
    import flwr_datasets.common.telemetry as telemetry

    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("HF_HOME", str(home)), ("HF_DATASETS_CACHE", str(home / "datasets")),
                            ("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                            ("FLWR_TELEMETRY_ENABLED", "0")):
            mp.setenv(name, value)
        # Both libraries read these at import time, so the imported modules are set as well.
        mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
        mp.setattr(telemetry, "FLWR_TELEMETRY_ENABLED", "0")
        yield home / "datasets"


def _load(parquet_file: Path, cache: Path, num_agents: int, seed: int = 42) -> Dataset:
    return load_flwr_femnist(num_agents, seed=seed, dataset="parquet",
                             data_files={"train": str(parquet_file)}, cache_dir=str(cache))


@pytest.fixture(scope="module")
def loaded(parquet_file: Path, offline: Path, leaf_writers: dict[str, Writer]) -> Dataset:
    return _load(parquet_file, offline, len(leaf_writers))


def _sorted_rows(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ordered by (label, pixels rounded to 0..255): a canonical order of a multiset."""
    keys = np.rint(x * 255.0).astype(np.int64)
    order = np.lexsort(np.column_stack([keys, y]).T[::-1])
    return x[order], y[order]


def test_agents_are_writers_in_sorted_id_order(loaded: Dataset, leaf_writers: dict[str, Writer]) -> None:
    assert loaded.name == "femnist"
    assert loaded.num_classes == 62
    assert loaded.agent_names == tuple(sorted(leaf_writers))
    assert loaded.x_train.dtype == torch.float64 and loaded.y_train.dtype == torch.int64
    assert loaded.num_features == 784
    sizes = []
    for name in loaded.agent_names:
        n = len(leaf_writers[name].y)
        sizes.append(n - math.ceil(0.1 * n) if n >= 2 else n)
    assert loaded.agent_sizes == tuple(sizes)
    assert loaded.num_train + loaded.num_test == sum(len(w.y) for w in leaf_writers.values())


def test_each_writer_keeps_its_own_samples(loaded: Dataset, leaf_writers: dict[str, Writer]) -> None:
    """Writer i's train block and test block together are its LEAF samples with pixels 1 - x."""
    train_blocks = loaded.partition(len(loaded.agent_sizes))
    test_start = 0
    for name, block in zip(loaded.agent_names, train_blocks, strict=True):
        writer = leaf_writers[name]
        n = len(writer.y)
        n_test = math.ceil(0.1 * n) if n >= 2 else 0  # train_test_split's count; one sample: all train
        assert block.stop - block.start == n - n_test
        test_block = slice(test_start, test_start + n_test)
        test_start += n_test
        got_x = np.concatenate([loaded.x_train[block].numpy(), loaded.x_test[test_block].numpy()])
        got_y = np.concatenate([loaded.y_train[block].numpy(), loaded.y_test[test_block].numpy()])
        want_x, want_y = _sorted_rows(1.0 - writer.x.astype(np.float64), writer.y)
        got_x, got_y = _sorted_rows(got_x, got_y)
        np.testing.assert_array_equal(got_y, want_y)
        assert np.abs(got_x - want_x).max() <= 1.0 / 255.0
    assert test_start == loaded.num_test
    # background 0 (as the LEAF reader): most pixels of a character are background
    assert float((loaded.x_train == 0.0).double().mean()) > 0.5


def test_same_seed_same_data_other_seed_other_split(parquet_file: Path, offline: Path, loaded: Dataset,
                                                    leaf_writers: dict[str, Writer]) -> None:
    again = _load(parquet_file, offline, len(leaf_writers))
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(again, field), getattr(loaded, field)), field
    assert again.agent_sizes == loaded.agent_sizes and again.agent_names == loaded.agent_names
    other = _load(parquet_file, offline, len(leaf_writers), seed=7)
    assert other.agent_sizes == loaded.agent_sizes and other.agent_names == loaded.agent_names
    assert not torch.equal(other.x_test, loaded.x_test)


def test_first_agents_only(parquet_file: Path, offline: Path, loaded: Dataset) -> None:
    first = _load(parquet_file, offline, 2)
    assert first.agent_names == loaded.agent_names[:2]
    assert first.agent_sizes == loaded.agent_sizes[:2]
    assert torch.equal(first.x_train, loaded.x_train[: sum(first.agent_sizes)])


@pytest.mark.parametrize("num_agents", [0, NUM_WRITERS + 2])
def test_num_agents_out_of_range_names_the_writers(parquet_file: Path, offline: Path,
                                                   num_agents: int) -> None:
    with pytest.raises(ValueError, match=rf"has {NUM_WRITERS + 1} writers \(1\.\.{NUM_WRITERS + 1}\)"):
        _load(parquet_file, offline, num_agents)


def test_test_fraction_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        load_flwr_femnist(3, test_fraction=1.0)


@pytest.mark.parametrize(("fault", "message"), [
    ("label", f"writer {SINGLE}, sample 0: character holds the label 62; allowed: 0..61 (the 62 classes)"),
    ("column", "missing column(s) character (found: image, writer_id, hsf_id); allowed: a train split"),
])
def test_a_bad_copy_is_refused_naming_the_data_and_the_writer(leaf_writers: dict[str, Writer], offline: Path,
                                                              tmp_path: Path, fault: str, message: str
                                                              ) -> None:
    """The real writers with a label outside FEMNIST's 62 classes, or without the labels' column."""
    path = _write_parquet(leaf_writers, tmp_path / "train.parquet", fault)
    with pytest.raises(DataError, match=re.escape(f"parquet data_files={{'train': '{path}'}}")) as info:
        _load(path, offline, len(leaf_writers))
    assert message in str(info.value) and "\n" not in str(info.value)
