"""Files written whole or not at all, for every layer (it imports nothing of the package).

Checkpoints, run logs, a grid's spooled results, caches, certificates and keys are read by other
processes (a resumed run, a grid's driver, a SuperNode) and may be cut short by a crash or a killed
worker. Each is written to a temporary file beside its place and renamed over it (``os.replace``,
atomic within one file system): a reader sees the old file or the new one, never a part. The
temporary name carries the writing process's id, so processes that write the same file at once (Ray
workers filling one cache) each rename a whole file of their own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | Path, *, private: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; it replaces ``path`` when the block ends,
    and is removed when the block raises (``path`` is left as it was). ``private``: the file is created
    readable and writable by its owner only (0600), before anything is written to it."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        if private:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_once(path: str | Path, data: bytes, *, mode: int = 0o644) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True when this call made it. The file appears whole
    and already fsynced (written to a temporary file of this thread, then linked to its name), so a crash
    never leaves a part of it; of two writers at once one makes it and the other keeps theirs."""
    path = Path(path)
    if path.exists():
        return False
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails if another writer made it first: theirs is kept
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def write_atomic(path: str | Path, data: str | bytes, *, private: bool = False) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`replacing`."""
    with replacing(path, private=private) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def fresh_path(path: str | Path) -> Path:
    """``path`` if it holds no run's metrics yet, else ``path_1``, ``path_2``, ...: never overwrite a run
    (nothing is made: a run refused before it starts leaves no folder)."""
    base = Path(path)
    candidate, n = base, 0
    while (candidate / "metrics.jsonl").exists():
        n += 1
        candidate = base.with_name(f"{base.name}_{n}")
    return candidate
