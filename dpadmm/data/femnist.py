"""FEMNIST from LEAF's JSON files: one agent per writer, as in the papers' FEMNIST experiments.

LEAF (Caldas et al.) writes each sample as ``train/`` and ``test/`` folders of JSON files
``all_data_<k>_..._{train,test}_9.json`` (plain or ``.json.gz``), each holding ``users``,
``num_samples`` and ``user_data[user] = {"x": [[784 floats in 0..1]], "y": [labels 0..61]}``;
a writer's train and test parts are LEAF's per-writer 90/10 split.

The writers' order decides which P writers take part (``--num-agents P`` takes the first P),
so it is fixed here: the sample folders in the order given (a folder holding several
samples: its sample sub-folders by name), within a sample its files by LEAF's file index k,
within a file the ``users`` list. A writer found again in a later sample (LEAF samples
drawn independently can share writers, possibly cut differently) keeps its first
occurrence; the later one is dropped whole, train and test.

Parsing LEAF's JSON is slow (7 s of CPU for two LEAF samples of 218 writers and 33,000 images, 82 files),
and every process that reads FEMNIST would pay it: each run, each Flower ClientApp worker and the
ServerApp. So each file, once read and checked, is kept in the project's cache (``$DPADMM_CACHE``, else
``~/.cache/dpadmm``) as ``parsed-leaf-v1/<SHA-256 of the file's bytes>.npz`` (compressed: 7 MB for those
two samples); a later read of the same bytes loads that instead (0.3 s for the 82 files). The key is the
content, so an edited or replaced file is parsed again; an entry that cannot be read is parsed again and
replaced; a cache folder that cannot be written only costs the speed.

Pixels: LEAF stores background 1.0 and ink 0.0; the authors' reader uses ``1 - x``
(background 0, as in MNIST), and so does this one. Labels 0..61 (digits, upper, lower case).

A file that is empty, cut off, damaged, not UTF-8 or not LEAF's JSON, a writer without x or y,
an image of another size, a pixel that is not finite and a label outside the 62 classes are
refused with a :class:`~dpadmm.data.checks.DataError` naming the file and the writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpadmm.data import Dataset
from dpadmm.data.checks import (
    DataError,
    load_npz,
    open_text,
    require_finite,
    require_keys,
    require_labels,
    require_nonempty,
    require_width,
    write_npz,
)

__all__ = ["FEMNIST_NUM_CLASSES", "Writer", "load_femnist", "read_leaf", "read_leaf_files", "sample_folders"]

FEMNIST_NUM_CLASSES = 62
FEMNIST_PIXELS = 784
_LAYOUT = "LEAF's JSON: users, num_samples, user_data[user] = {x: [[784 numbers]], y: [labels 0..61]}"

_INDEX = re.compile(r"all_data_(\d+)_")

# The cache's folder in the project's cache: a new name when what an entry holds, or what reading a file
# checks before its entry is written, changes (an older entry would skip the new check).
_PARSED_CACHE = "parsed-leaf-v1"


@dataclass(frozen=True)
class Writer:
    """One writer's samples: LEAF pixels as stored (background 1.0) and labels."""

    name: str
    x: np.ndarray  # [n, 784] float32
    y: np.ndarray  # [n] int64


def sample_folders(data_dir: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The LEAF sample folders (each with ``train/`` and ``test/``) under ``data_dir``, in order.

    ``data_dir`` is one folder or several (a sequence, or one string with comma-separated
    paths). A folder with a ``train/`` sub-folder is a sample; otherwise its sub-folders that
    are samples are taken, sorted by name. Raises ``FileNotFoundError`` naming the folder
    when none is found.
    """
    if isinstance(data_dir, str | os.PathLike):
        parts = [p for p in os.fspath(data_dir).split(",") if p.strip()]
    else:
        parts = [os.fspath(p) for p in data_dir]
    if not parts:
        raise ValueError("dataset 'femnist' needs data_dir: a LEAF sample folder (with train/ and test/) "
                         "or a folder of such samples, e.g. ../shared/data/femnist")
    folders: list[Path] = []
    for part in parts:
        folder = Path(part.strip()).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"FEMNIST folder {folder} does not exist or is not a folder")
        if (folder / "train").is_dir():
            found = [folder]
        else:
            found = sorted(sub for sub in folder.iterdir() if (sub / "train").is_dir())
        if not found:
            raise FileNotFoundError(
                f"{folder} holds no LEAF sample: expected train/ and test/ folders in it or in its "
                "sub-folders"
            )
        folders.extend(found)
    return folders


def _leaf_files(folder: Path) -> list[Path]:
    files = [f for f in folder.iterdir() if f.name.endswith((".json", ".json.gz"))]

    def key(f: Path) -> tuple[int, str]:
        match = _INDEX.search(f.name)
        return (int(match.group(1)) if match else -1, f.name)

    return sorted(files, key=key)


def _read_json(path: Path) -> dict:
    try:
        with open_text(path) as fh:
            data = json.load(fh)
    except json.JSONDecodeError as e:
        raise DataError(path, f"not a readable LEAF JSON file ({e.msg}); allowed: {_LAYOUT}",
                        f"line {e.lineno}") from e
    if not isinstance(data, dict):
        raise DataError(path, f"not a LEAF JSON file (a JSON {type(data).__name__}); allowed: {_LAYOUT}")
    require_keys(data, ("users", "user_data"), path, _LAYOUT)
    users, counts = data["users"], data.get("num_samples")
    if (not isinstance(users, list) or not all(isinstance(u, str) for u in users)
            or not isinstance(data["user_data"], dict)):
        raise DataError(path, f"users is not a list of names or user_data not an object; allowed: {_LAYOUT}")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise DataError(path, f"num_samples does not list one count per user ({len(users)} users); allowed: "
                              f"{_LAYOUT}")
    return data


def _writer_arrays(path: Path, user: str, record: Any, count: Any) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 [n, 784], y int64 [n]) of one writer's record, or a DataError naming the file and writer."""
    where = f"writer {user}"
    if not isinstance(record, dict):
        raise DataError(path, f"users lists the writer but user_data has no {{x, y}} for it; allowed: "
                              f"{_LAYOUT}", where)
    require_keys(record, ("x", "y"), path, _LAYOUT, where=where)
    try:
        x = np.asarray(record["x"], dtype=np.float32)
        y = np.asarray(record["y"])
    except (ValueError, TypeError) as e:
        raise DataError(path, f"x or y is not a rectangular list of numbers ({e}); allowed: {_LAYOUT}",
                        where) from None
    if x.ndim == 1 and x.size == 0:  # "x": [], a writer without samples in this file
        x = x.reshape(0, FEMNIST_PIXELS)
    if x.ndim < 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or (count is not None and count != y.shape[0]):
        raise DataError(path, f"x of shape {x.shape}, y of shape {y.shape} and num_samples {count}; allowed: "
                              "as many images as labels and num_samples", where)
    x = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))  # [n, 28, 28] -> [n, 784]; also for n = 0
    require_width(x.shape[1], FEMNIST_PIXELS, path, "values per image", "28 x 28 pixels", where)
    require_finite(x, path, "x", lambda i: f"{where}, image {i[0]}, pixel {i[1]}")
    y = require_labels(y, FEMNIST_NUM_CLASSES, path, "y", lambda i: f"{where}, sample {i[0]}")
    return x, y


def read_leaf(folders: Sequence[Path], split: str) -> dict[str, Writer]:
    """Every writer of ``split`` ("train" or "test") in the given samples, in LEAF order, first occurrence.

    Returns an insertion-ordered dict writer name -> :class:`Writer`. ``num_samples`` is
    checked against the data, every x against 784 finite features, every y against the 62
    classes; a training writer needs at least one sample (it is an agent).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is not allowed; choose train or test")
    writers: dict[str, Writer] = {}
    for folder in folders:
        files = _leaf_files(folder / split)
        if not files:
            raise FileNotFoundError(f"{folder / split} holds no LEAF .json or .json.gz file")
        _add_sample(files, writers, need_samples=split == "train")
    return writers


def read_leaf_files(files: Sequence[Path]) -> dict[str, Writer]:
    """Every writer of the given LEAF JSON files (one sample), in file order."""
    writers: dict[str, Writer] = {}
    _add_sample(files, writers)
    return writers


def _parse_file(path: Path) -> list[Writer]:
    """Every writer of one LEAF file, in its ``users`` order, checked (a DataError otherwise)."""
    data = _read_json(path)
    require_nonempty(len(data["users"]), path, "writer (users is empty)")
    counts = data.get("num_samples") or [None] * len(data["users"])
    return [Writer(user, *_writer_arrays(path, user, data["user_data"].get(user), count))
            for user, count in zip(data["users"], counts, strict=True)]


def _file_writers(path: Path) -> list[Writer]:
    """:func:`_parse_file`, through the project's cache of parsed files (the module's docstring says why)."""
    from dpadmm.data.download import cache_dir

    entry = cache_dir() / _PARSED_CACHE / f"{hashlib.sha256(path.read_bytes()).hexdigest()}.npz"
    try:
        saved = load_npz(entry, ("names", "sizes", "x", "y"), "a parsed LEAF file: names, sizes, x, y")
        names, sizes, x, y = saved["names"], saved["sizes"], saved["x"], saved["y"]
        if (x.shape != (int(sizes.sum()), FEMNIST_PIXELS) or y.shape != (x.shape[0],)
                or len(names) != len(sizes)):
            raise ValueError(f"{entry} holds arrays of other shapes")
        stops = np.cumsum(sizes)
        return [Writer(str(name), x[stop - size:stop], y[stop - size:stop])
                for name, size, stop in zip(names, sizes, stops, strict=True)]
    except (OSError, ValueError):  # not there yet (FileNotFoundError), or unreadable (DataError): parse
        pass
    writers = _parse_file(path)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_npz(entry, names=np.array([w.name for w in writers]),
                  sizes=np.array([w.y.shape[0] for w in writers], dtype=np.int64),
                  x=np.concatenate([w.x for w in writers]), y=np.concatenate([w.y for w in writers]))
    except OSError:
        pass  # a cache that cannot be written costs the speed, not the data
    return writers


def _add_sample(files: Sequence[Path], writers: dict[str, Writer], need_samples: bool = False) -> None:
    """Add the writers of one sample's files; writers already there from earlier samples are kept.
    ``need_samples``: a writer listed with no sample is refused (a training writer is an agent)."""
    seen_here: set[str] = set()
    for path in files:
        for writer in _file_writers(path):
            user, x, y = writer.name, writer.x, writer.y
            if user in writers and user not in seen_here:
                continue  # a writer of an earlier sample: keep that one
            if need_samples:
                require_nonempty(y.shape[0], f"{path} writer {user}", "training sample")
            if user in writers:  # the same sample lists the writer in two files: join them
                old = writers[user]
                x, y = np.concatenate([old.x, x]), np.concatenate([old.y, y])
            writers[user] = Writer(user, x, y)
            seen_here.add(user)


def _first_writers(train: dict[str, Writer], num_agents: int | None, folders: Sequence[Path]) -> list[str]:
    """The names of the first ``num_agents`` writers (all when None): the agents of FEMNIST."""
    names = list(train)
    if num_agents is not None:
        if not 1 <= num_agents <= len(names):
            raise ValueError(f"num-agents={num_agents} is not allowed for FEMNIST here: the samples in "
                             f"{', '.join(map(str, folders))} have {len(names)} writers (1..{len(names)})")
        names = names[:num_agents]
    return names


def writer_sizes(data_dir: str | os.PathLike | Sequence[str | os.PathLike],
                 num_agents: int | None = None) -> list[int]:
    """The training sample counts of the agents of ``load_femnist(data_dir, num_agents)``, without torch."""
    folders = sample_folders(data_dir)
    train = read_leaf(folders, "train")
    return [int(train[n].y.shape[0]) for n in _first_writers(train, num_agents, folders)]


def load_femnist(data_dir: str | os.PathLike | Sequence[str | os.PathLike],
                 num_agents: int | None = None) -> Dataset:
    """FEMNIST with one agent per writer: the first ``num_agents`` writers (all when None).

    The training set is the writers' train parts one after the other (so the natural
    partition, :attr:`Dataset.agent_sizes`, gives each agent its writer); the test set is
    the same writers' test parts, as the authors' code pools them. Pixels are ``1 - x``.
    """
    import torch

    folders = sample_folders(data_dir)
    train = read_leaf(folders, "train")
    test = read_leaf(folders, "test")
    names = _first_writers(train, num_agents, folders)
    empty = np.zeros((0, 784), dtype=np.float32)

    def stack(parts: dict[str, Writer], split: str) -> tuple[torch.Tensor, torch.Tensor]:
        xs = [parts[n].x if n in parts else empty for n in names]
        ys = [parts[n].y if n in parts else np.zeros(0, dtype=np.int64) for n in names]
        x = 1.0 - np.concatenate(xs).astype(np.float64)
        return torch.from_numpy(x), torch.from_numpy(np.concatenate(ys))

    x_train, y_train = stack(train, "train")
    x_test, y_test = stack(test, "test")
    return Dataset(
        name="femnist",
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=FEMNIST_NUM_CLASSES,
        agent_sizes=tuple(int(train[n].y.shape[0]) for n in names),
        agent_names=tuple(names),
    )
