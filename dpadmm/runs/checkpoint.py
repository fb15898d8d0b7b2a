"""Atomic checkpoints shared by the engine and the Flower strategy.

A checkpoint is a dict of tensors and plain values written with ``torch.save`` to a
temporary file and renamed over the old one (``os.replace``), so a crash while writing
leaves the previous checkpoint intact and a reader never sees half a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dpadmm.files import replacing


def save(path: str | Path, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (tensors are moved to the CPU first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        torch.save({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in payload.items()}, tmp)


def load(path: str | Path | None, expected: Mapping[str, Any],
         defaults: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None when there is none), checked against ``expected``.

    Every key of ``expected`` must hold the same value in the checkpoint; otherwise the
    checkpoint belongs to another run and a ValueError names what differs (resuming it
    would silently mix two runs). ``defaults`` holds, per mapping of the checkpoint (a run's
    configuration), the values of keys added since it may have been written: a run checkpointed
    before a key existed ran with that key's default, and resumes as such.
    """
    if path is None or not Path(path).exists():
        return None
    saved = read(path)
    for key, default in (defaults or {}).items():
        if isinstance(saved.get(key), Mapping):
            saved[key] = {**default, **saved[key]}
    differs = [key for key, value in expected.items() if saved.get(key) != value]
    if differs:
        detail = "; ".join(_difference(key, saved.get(key), expected[key]) for key in differs)
        raise ValueError(f"checkpoint {path} belongs to another run ({detail}); "
                         "delete it, or choose another folder, to start this run afresh")
    return saved


def read(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint at ``path`` as torch's weights-only unpickler reads it: tensors and plain values, never
    code, since a file on disk may have been replaced by someone else.

    A file that does not read so (truncated by a full disk, damaged, or not written by dpadmm) is a
    ValueError in one line that names it and says what to do; torch's own message advises loading it
    with ``weights_only=False``, which would run whatever code the file holds.
    """
    try:
        saved = torch.load(path, weights_only=True, mmap=mmap)
    except Exception as error:  # torch raises RuntimeError, KeyError, EOFError, UnpicklingError, ...
        raise ValueError(f"checkpoint {path} cannot be read as a dpadmm checkpoint ({type(error).__name__}): "
                         "it is damaged or was not written by dpadmm; delete it to start this run afresh "
                         "from round 1") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("round"), int):
        raise ValueError(f"checkpoint {path} holds no round of a dpadmm run; delete it to start this run "
                         "afresh from round 1")
    return saved


def _difference(key: str, saved: Any, expected: Any) -> str:
    if isinstance(saved, Mapping) and isinstance(expected, Mapping):
        keys = sorted(k for k in set(saved) | set(expected) if saved.get(k) != expected.get(k))
        return f"{key}: " + ", ".join(f"{k}={saved.get(k)!r} there, {expected.get(k)!r} here" for k in keys)
    return f"{key}={saved!r} there, {expected!r} here"
